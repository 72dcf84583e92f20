"""A batch's fleet verdict in the formats a site wires in (export.py's, for a sweep):

- fleet_nodes.csv, fleet_links.csv, fleet_summary.csv: the verdict's tables (fleet.FleetVerdict), and
  drain.txt: an `scontrol update ... State=DRAIN` line per failed node, run only on request.
- fleet_junit.xml: a test case per node, per link and per variable the batch could not judge, with the
  verdict's reason: a failed member (or container path) is a failure, one whose runs could not be read an
  error, a link that failed only because a failed node is one of its ends is skipped (the node's case
  fails), as is an unjudged variable or link. Each node's case lists its figures against the fleet's median.
- fleet_metrics/NODE.prom: OpenMetrics text per node, for its node_exporter's textfile collector: whether
  the node and each of its links passed, and each of the node's figures with its fleet median and robust z.
"""

from __future__ import annotations

import shlex
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from containerbench import outputs
from containerbench.export import FAMILIES, Sample, exposition, file_name, junit_case, junit_suite
from containerbench.fleet import CONTAINER_PATH, UNREADABLE, FleetVerdict
from containerbench.validate import metric_of

FLEET_JUNIT = "fleet_junit.xml"
FLEET_METRICS_DIR = "fleet_metrics"

# A member's result -> the JUnit element that says so (None: it passed).
OUTCOME = {"fail": "failure", CONTAINER_PATH: "failure", UNREADABLE: "error", "explained": "skipped",
           "unjudged": "skipped"}
SUITES = {"node": "nodes", "link": "links", "variable": "variables"}
HELP = {
    "containerbench_fleet_check_passed": "1 if the fleet validation passed this node or link, else 0",
    "containerbench_fleet_robust_z": "The node's figure against the batch: (value - median) / (1.4826 MAD)",
    **{f"containerbench_fleet_median_{family.removeprefix('containerbench_')}": f"{text}: the batch's median"
       for family, _, text in FAMILIES.values()},
}


def _figures(nodes: pd.DataFrame, node: str) -> str:
    lines = [f"{row.variable}: {row.value:.4g} {row.unit}, fleet median {row.fleet_median:.4g}, robust z "
             f"{row.robust_z:.2f}: {row.result}" for row in nodes[nodes["node"] == node].itertuples()]
    return "\n".join(lines)


def junit_document(verdict: FleetVerdict, system: str) -> ET.ElementTree:
    root = ET.Element("testsuites")
    for kind, suite in SUITES.items():
        cases = []
        for row in verdict.summary[verdict.summary["kind"] == kind].itertuples():
            outcome = OUTCOME.get(row.result)
            message = f"{row.result}: {row.reason}" if outcome else ""
            cases.append(junit_case(f"containerbench.fleet.{kind}", row.member, 0, outcome, message,
                                    _figures(verdict.nodes, row.member) if kind == "node" else ""))
        if cases:
            junit_suite(root, suite, cases, time.time(), system)
    return ET.ElementTree(root)


def node_samples(verdict: FleetVerdict, system: str) -> list[Sample]:
    """Every sample, each in the file of the node(s) it is about."""
    samples = []
    for row in verdict.summary[verdict.summary["kind"].isin(["node", "link"])].itertuples():
        hosts = tuple(row.member.split("+"))
        samples.append(Sample("containerbench_fleet_check_passed", {"system": system, "kind": row.kind,
                                                                    "member": row.member},
                              float(row.result == "pass"), hosts))
    for row in verdict.nodes.dropna(subset=["value"]).itertuples():
        if metric_of(row.variable) not in FAMILIES:
            continue
        family, factor, _ = FAMILIES[metric_of(row.variable)]
        point, name = row.variable.rsplit("/", 1)
        labels = {"system": system, "node": row.node, "point": point,
                  **({"bytes": name.split("@", 1)[1]} if "@" in name else {})}
        samples.append(Sample(family, labels, float(row.value) * factor, (row.node,)))
        if pd.notna(row.fleet_median):
            samples.append(Sample(f"containerbench_fleet_median_{family.removeprefix('containerbench_')}", labels,
                                  float(row.fleet_median) * factor, (row.node,)))
        if pd.notna(row.robust_z):
            samples.append(Sample("containerbench_fleet_robust_z", {**labels, "metric": metric_of(row.variable)},
                                  float(row.robust_z), (row.node,)))
    return samples


def write(verdict: FleetVerdict, out_dir: str | Path, system: str) -> list[Path]:
    """The JUnit XML and a metrics file per node, in out_dir; the paths written."""
    out = Path(out_dir)
    junit = out / FLEET_JUNIT
    with outputs.replacing(junit) as partial:
        junit_document(verdict, system).write(partial, encoding="utf-8", xml_declaration=True)
    samples = node_samples(verdict, system)
    directory = out / FLEET_METRICS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    written = [junit]
    for node in verdict.summary.loc[verdict.summary["kind"] == "node", "member"]:
        path = directory / f"{file_name(node)}.prom"
        outputs.write_text(path, exposition([sample for sample in samples if node in sample.hosts], HELP))
        written.append(path)
    for stale in set(directory.iterdir()) - set(written):  # a node of an earlier batch, not of this one
        stale.unlink()
    return written


REASON_CHARS = 160  # of the verdict's reason in a drain line: sinfo -R shows a line per node


def drain_commands(verdict: FleetVerdict) -> list[list[str]]:
    """`scontrol update` for every failed node, as argv lists: printed and written, run only on request."""
    rows = verdict.summary[(verdict.summary["kind"] == "node") & (verdict.summary["result"] == "fail")]
    return [["scontrol", "update", f"NodeName={row.member}", "State=DRAIN",
             f"Reason=containerbench: {row.reason[:REASON_CHARS]}"]
            for row in rows.itertuples() if not row.reason.startswith("not run: Slurm state drain")]


def format_drain_list(verdict: FleetVerdict) -> str:
    lines = [shlex.join(argv) for argv in drain_commands(verdict)]
    lines += [f"# link {row.member}: {row.reason} (a cable or switch port: not drained)"
              for row in verdict.summary.itertuples() if row.kind == "link" and row.result == "fail"]
    lines += [f"# node {row.member}: {row.reason} (the image or the runtime's set-up there: not drained)"
              for row in verdict.summary.itertuples() if row.kind == "node" and row.result == CONTAINER_PATH]
    return "\n".join(lines) + ("\n" if lines else "")


VERDICT_FILES = {"nodes": "fleet_nodes.csv", "links": "fleet_links.csv", "summary": "fleet_summary.csv",
                 "drain": "drain.txt"}


def write_verdict(verdict: FleetVerdict, out_dir) -> dict[str, Path]:
    """The per-node and per-link tables, the one-row-per-member summary and the drain list, in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {key: out / name for key, name in VERDICT_FILES.items()}
    for name in ("nodes", "links", "summary"):
        with outputs.replacing(paths[name]) as partial:
            getattr(verdict, name).to_csv(partial, index=False)
    outputs.write_text(paths["drain"], format_drain_list(verdict))
    return paths


def format_verdict(verdict: FleetVerdict) -> str:
    summary = verdict.summary
    counts = {kind: (summary["kind"] == kind).sum() for kind in ("node", "link")}
    unread = (summary["result"] == UNREADABLE).sum()
    lines = [f"fleet: {len(verdict.failed_nodes)} of {counts['node']} node(s) failed, "
             f"{len(verdict.bad_links)} of {counts['link']} link(s) bad"
             + (f", {len(verdict.container_path_nodes)} node(s) failed in a container only (not drained)"
                if verdict.container_path_nodes else "")
             + (f", {unread} not judged: result unreadable, run again" if unread else "")]
    shown = summary[(summary["result"] != "pass") | (summary["reason"] != "")]
    width = max([len(member) for member in shown["member"]] or [0])
    lines += [f"  {row.kind:4} {row.member:<{width}}  {row.result:9} {row.reason}" for row in shown.itertuples()]
    return "\n".join(lines)


def format_summary(summary_csv) -> tuple[str, bool]:
    """A written verdict's summary (fleet_summary.csv) and drain list, as `validate_nodes` ends with; and
    whether a node, a link or a container path failed (FleetVerdict.failed)."""
    verdict = FleetVerdict(pd.DataFrame(), pd.DataFrame(), pd.read_csv(summary_csv, keep_default_na=False))
    drain = Path(summary_csv).with_name(VERDICT_FILES["drain"])
    text = format_verdict(verdict) + "\n" + (drain.read_text() if drain.exists() else "")
    return text, verdict.failed
