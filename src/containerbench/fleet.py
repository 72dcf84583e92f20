"""Fleet validation: which nodes of a batch, and which links between them, are bad.

A batch of new nodes is judged against itself. Every node runs the same
single-node benchmarks and every link of a few pairings the same two-node ones;
each figure is set against the fleet's median, with the median absolute
deviation (MAD) as the spread, which one bad node cannot drag along as it would
a mean and a standard deviation. A figure fails when it is both far out by that
robust measure (Iglewicz and Hoaglin's modified z-score) and further than a
fraction from the median: a homogeneous fleet has a tiny MAD, and 2% off is not a
fault. A figure outside the site's reference fails too.

Links are localised from the pairings: a ring (each node with its neighbours)
and chords (each node with the one half-way round) put every node of four or
more in three links or more. A node slow in every link it is in is the culprit,
and those links are not blamed; a slow link whose nodes are both fine elsewhere
is the link itself (a cable, a switch port).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from containerbench.validate import LOWER_IS_BETTER, Reference, metric_of, record_variables

# MAD x 1.4826 estimates the standard deviation of normal data; 3.5 is Iglewicz and
# Hoaglin's cut-off for the modified z-score (NIST/SEMATECH e-Handbook, 1.3.5.17).
MAD_TO_SIGMA = 1.4826
ROBUST_Z_LIMIT = 3.5

# sinfo's node states (%T) in which a node cannot take a job: reported, never waited for.
UNAVAILABLE_STATES = ("down", "drain", "fail", "maint", "future", "unknown", "not_responding", "reboot",
                      "power", "inval")

# deviation_percent: from the fleet median; better_percent: the same, signed so that below 0 is worse
# whatever the metric (latency up is worse), which is what the charts show.
NODE_COLUMNS = ["node", "variable", "value", "unit", "reference", "fleet_median", "mad", "robust_z",
                "deviation_percent", "better_percent", "result", "reason"]
LINK_COLUMNS = ["link", "variable", "value", "unit", "reference", "fleet_median", "mad", "robust_z",
                "deviation_percent", "better_percent", "slow", "blamed_on", "reason"]
SUMMARY_COLUMNS = ["member", "kind", "result", "reason"]


class FleetError(ValueError):
    """A node selection that cannot be validated; the message is one line for the user."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # sinfo's %T, e.g. "idle", "drained", "down*"
    reason: str = ""  # sinfo's %E

    @property
    def available(self) -> bool:
        state = self.state.lower().rstrip("*~#!%$@^-")
        return not self.state.endswith("*") and not any(state.startswith(bad) for bad in UNAVAILABLE_STATES)


def _slurm(argv: list[str], key: str, value: str, via: tuple[str, ...]) -> str:
    """A Slurm client's output; `via` runs it elsewhere (the tests' controller namespace)."""
    try:
        done = subprocess.run([*via, *argv], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise FleetError(f"'{key}' = {value!r} needs Slurm's {argv[0]}, which is not installed here") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise FleetError(f"'{key}' = {value!r}: {shlex.join(argv[:3])} failed: {why}")
    return done.stdout


def expand_hostlist(expression: str, via: tuple[str, ...] = ()) -> list[str]:
    """The node names of a Slurm hostlist expression (n[001-064]), in order, each once."""
    names = _slurm(["scontrol", "show", "hostnames", expression], "validation.nodes", expression, via).split()
    if not names or any(set(name) & set("[],") for name in names):
        raise FleetError(f"'validation.nodes' = {expression!r} expands to no node names; "
                         "allowed: a Slurm hostlist such as n[001-064] or n1,n2")
    return list(dict.fromkeys(names))


def _parse_sinfo(text: str) -> dict[str, NodeState]:
    states = {}
    for line in text.splitlines():
        name, state, reason = (line.split("|", 2) + ["", ""])[:3]
        if name and name not in states:  # a node in several partitions has a line in each
            states[name] = NodeState(name, state, "" if reason == "none" else reason)
    return states


SINFO_FORMAT = "%N|%T|%E"


def node_states(names: list[str], via: tuple[str, ...] = ()) -> dict[str, NodeState]:
    """sinfo's state of each named node; a name Slurm does not know is refused."""
    joined = ",".join(names)
    states = _parse_sinfo(_slurm(["sinfo", "--noheader", "--Node", "--nodes", joined, "--format", SINFO_FORMAT],
                                 "validation.nodes", joined, via))
    unknown = [name for name in names if name not in states]
    if unknown:
        raise FleetError(f"'validation.nodes' names {unknown[0]!r}, which Slurm does not know (sinfo); "
                         f"allowed: nodes of this cluster{f' ({len(unknown)} unknown in all)' if len(unknown) > 1 else ''}")
    return {name: states[name] for name in names}


def partition_states(partition: str, via: tuple[str, ...] = ()) -> dict[str, NodeState]:
    """The nodes sinfo lists in a partition, with their states; a partition that does not exist is refused."""
    states = _parse_sinfo(_slurm(["sinfo", "--noheader", "--Node", "--partition", partition, "--format", SINFO_FORMAT],
                                 "validation.partition", partition, via))
    if not states:
        known = sorted(set(_slurm(["sinfo", "--noheader", "--format", "%R"], "validation.partition", partition, via).split()))
        raise FleetError(f"'validation.partition' = {partition!r} is not a partition with nodes; "
                         f"allowed: {', '.join(known) or 'none'}")
    return {name: states[name] for name in in_order(states)}


def link_pairings(nodes: list[str]) -> list[tuple[str, str]]:
    """The ring (i, i+1) and, from four nodes on, chords (i, i + n/2): each node in three or more links,
    N + ceil(N/2) links for N >= 4 nodes (N for 3, 1 for 2)."""
    count = len(nodes)
    pairs: dict[frozenset, tuple[str, str]] = {}
    ring = [(i, (i + 1) % count) for i in range(count)] if count > 1 else []
    chords = [(i, (i + count // 2) % count) for i in range((count + 1) // 2)] if count >= 4 else []
    for i, j in ring + chords:
        pairs.setdefault(frozenset((i, j)), in_order((nodes[i], nodes[j])))
    return list(pairs.values())


def job_rounds(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The links in rounds in which no node is in two jobs (a greedy edge colouring: the ring and its
    chords need 3 or 4 rounds), the order that keeps a node to one job at a time."""
    rounds: list[list[tuple[str, str]]] = []
    busy: list[set[str]] = []
    for pair in pairs:
        for taken, members in zip(rounds, busy):
            if not members & set(pair):
                taken.append(pair)
                members.update(pair)
                break
        else:
            rounds.append([pair])
            busy.append(set(pair))
    return rounds


@dataclass(frozen=True)
class FleetPlan:
    nodes: list[str]  # to be measured
    unavailable: dict[str, NodeState]  # down, drained...: reported as failed, not waited for
    links: list[tuple[str, str]]
    rounds: list[list[tuple[str, str]]] = field(default_factory=list)

    @property
    def jobs(self) -> int:
        return len(self.nodes) + len(self.links)

    def as_dict(self) -> dict:
        return {"nodes": self.nodes, "links": [list(pair) for pair in self.links],
                "rounds": [[list(pair) for pair in taken] for taken in self.rounds],
                "unavailable": {name: {"state": state.state, "reason": state.reason}
                                for name, state in self.unavailable.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> FleetPlan:
        return cls(list(data["nodes"]),
                   {name: NodeState(name, state["state"], state["reason"]) for name, state in data["unavailable"].items()},
                   [tuple(pair) for pair in data["links"]], [[tuple(pair) for pair in taken] for taken in data["rounds"]])


def select(nodes: str | None = None, partition: str | None = None, via: tuple[str, ...] = ()) -> dict[str, NodeState]:
    """The batch to validate, with Slurm's state of each node: a hostlist or a partition, not both."""
    if bool(nodes) == bool(partition):
        raise FleetError("give one of 'validation.nodes' (a Slurm hostlist) and 'validation.partition'; "
                         f"got {'both' if nodes else 'neither'}")
    return node_states(expand_hostlist(nodes, via), via) if nodes else partition_states(partition, via)


def format_plan(fleet: FleetPlan) -> str:
    lines = [f"{len(fleet.nodes)} node(s) to measure, {len(fleet.links)} link(s) in {len(fleet.rounds)} round(s): "
             f"{fleet.jobs} jobs"]
    lines += [f"  not run: {name}: Slurm state {state.state}" + (f" ({state.reason})" if state.reason else "")
              for name, state in fleet.unavailable.items()]
    lines += [f"  round {number}: {' '.join(link_name(pair) for pair in taken)}"
              for number, taken in enumerate(fleet.rounds, 1)]
    return "\n".join(lines)


def plan(states: dict[str, NodeState]) -> FleetPlan:
    nodes = [name for name, state in states.items() if state.available]
    links = link_pairings(nodes)
    return FleetPlan(nodes, {name: state for name, state in states.items() if not state.available}, links,
                     job_rounds(links))


def in_order(hosts) -> tuple[str, ...]:
    """Host names in natural order (n9 before n10), each once: a link's one spelling."""
    return tuple(sorted(set(hosts), key=lambda name: [int(part) if part.isdigit() else part
                                                        for part in re.split(r"(\d+)", name)]))


def link_name(hosts: tuple[str, ...]) -> str:
    """A node's own name, or a link's two names joined by '+': no hostname holds it (they may hold '-'),
    and it needs no quoting in a file name, a shell or a Snakemake job's wildcards."""
    return "+".join(hosts)


def _members(record: dict) -> tuple[str, ...]:
    """The nodes a run ran on: what its ranks reported, else what it was pinned to."""
    hosts = (record.get("result") or {}).get("hostnames") or record["spec"].get("nodelist") or []
    return in_order(hosts.split(",") if isinstance(hosts, str) else hosts)


def on_nodes(records: list[dict], nodes) -> list[dict]:
    """The records of runs that ran only on these nodes (nodes declared good, for a baseline)."""
    wanted = set(nodes)
    return [record for record in records if set(_members(record)) <= wanted and _members(record)]


def member_values(records: list[dict]) -> pd.DataFrame:
    """The median of each variable per node (one-node runs) and per link (two-node runs), over repetitions."""
    members = {record["run_id"]: _members(record) for record in records}
    values = record_variables(records)
    values["hosts"] = values["run_id"].map(members)
    values = values[values["hosts"].map(len).isin((1, 2))]
    values["member"] = values["hosts"].map(link_name)
    values["scope"] = np.where(values["hosts"].map(len) == 1, "node", "link")
    return (values.groupby(["scope", "member", "variable", "unit"], as_index=False, sort=False)
            .agg(value=("value", "median"), runs=("run_id", "nunique")))


def robust_deviation(values: pd.DataFrame, min_shortfall: float) -> pd.DataFrame:
    """Each value against its variable's fleet median and MAD; `worse` when far out in the bad direction."""
    by_variable = values.groupby("variable")["value"]
    median = by_variable.transform("median")
    mad = (values["value"] - median).abs().groupby(values["variable"]).transform("median")
    sign = np.where(values["variable"].map(metric_of).isin(LOWER_IS_BETTER), -1.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        deviation = 100 * (values["value"] / median - 1)
        # No spread (MAD 0, e.g. most nodes identical): any difference is infinitely far out, so
        # the shortfall fraction alone decides.
        z = np.where(mad > 0, (values["value"] - median) / (MAD_TO_SIGMA * mad),
                     np.sign(values["value"] - median) * np.inf)
    worse = (sign * z < -ROBUST_Z_LIMIT) & (sign * deviation < -100 * min_shortfall)
    return values.assign(fleet_median=median, mad=mad, robust_z=z, deviation_percent=deviation,
                         better_percent=sign * deviation, worse=worse)


def _against(values: pd.DataFrame, references: dict[str, Reference]) -> pd.DataFrame:
    """`bad`: far out in the fleet, or outside the site's reference for the node type (a whole batch
    equally slow passes the first test and fails this one); `reason` says which."""
    known = values["variable"].map(references.get)
    outside = [reference is not None and not reference.admits(value) for reference, value in zip(known, values["value"])]
    reasons = []
    for row, reference, out in zip(values.itertuples(), known, outside):
        why = [_why(row)] if row.worse else []
        if out:
            bounds = " and ".join(f"{word} {bound:.4g}" for word, bound in (("at least", reference.lower_bound),
                                                                            ("at most", reference.upper_bound))
                                  if bound is not None)
            why.append(f"{metric_of(row.variable)} {row.value:.4g} {row.unit} outside the reference "
                       f"{reference.reference:.4g} ({bounds})")
        reasons.append("; ".join(why))
    return values.assign(reference=[None if reference is None else reference.reference for reference in known],
                         bad=values["worse"] | np.array(outside, dtype=bool), reason=reasons)


def _why(row) -> str:
    direction = "above" if row.deviation_percent > 0 else "below"
    return (f"{metric_of(row.variable)} {row.value:.4g} {row.unit}, {abs(row.deviation_percent):.0f}% {direction} "
            f"the fleet median {row.fleet_median:.4g} (robust z {row.robust_z:.1f})")


@dataclass
class FleetVerdict:
    nodes: pd.DataFrame  # NODE_COLUMNS: one row per node and variable
    links: pd.DataFrame  # LINK_COLUMNS
    summary: pd.DataFrame  # SUMMARY_COLUMNS: one row per node and per link, "pass" or "fail" and why

    @property
    def failed_nodes(self) -> list[str]:
        rows = self.summary[(self.summary["kind"] == "node") & (self.summary["result"] == "fail")]
        return rows["member"].tolist()

    @property
    def bad_links(self) -> list[str]:
        rows = self.summary[(self.summary["kind"] == "link") & (self.summary["result"] == "fail")]
        return rows["member"].tolist()


def judge(records: list[dict], fleet: FleetPlan, references: dict[str, Reference] | None = None,
          min_shortfall: float = 0.10) -> FleetVerdict:
    """The verdict on every node and link of `fleet` from its records: a node that did not run, or whose
    runs failed, fails with the reason; a missing row is never a pass."""
    values = member_values(records)
    nodes = _against(robust_deviation(values[values["scope"] == "node"], min_shortfall), references or {})
    nodes["result"] = np.where(nodes["bad"], "fail", "pass")
    links = _against(robust_deviation(values[values["scope"] == "link"], min_shortfall), references or {})

    failures = _failures(records)
    summary = []
    node_rows = {name: rows for name, rows in nodes.groupby("member", sort=False)}
    node_fault: dict[str, str] = {}
    for name in [*fleet.nodes, *fleet.unavailable]:
        state = fleet.unavailable.get(name)
        mine = node_rows.get(name)
        if state is not None:
            node_fault[name] = f"not run: Slurm state {state.state}" + (f" ({state.reason})" if state.reason else "")
        elif (name,) in failures:
            node_fault[name] = failures[(name,)]
        elif mine is None:
            node_fault[name] = "not measured: no record of this node"
        elif (mine["result"] == "fail").any():
            node_fault[name] = "; ".join(mine.loc[mine["result"] == "fail", "reason"])
    # A node slow in every link it is in (three or more from four nodes) is the culprit for all of them.
    pairs = [in_order(pair) for pair in fleet.links]
    slow_links = set(links.loc[links["bad"], "member"]) | {link_name(key) for key in failures if len(key) == 2}
    links_of: dict[str, list[str]] = {}
    for pair in pairs:
        for end in pair:
            links_of.setdefault(end, []).append(link_name(pair))
    link_culprits = set()
    for name in fleet.nodes:
        mine = links_of.get(name, [])
        if len(mine) >= 2 and all(link in slow_links for link in mine):
            link_culprits.add(name)
            node_fault.setdefault(name, f"slow in all {len(mine)} of its links ({', '.join(mine)})")
    for name in [*fleet.nodes, *fleet.unavailable]:
        summary.append({"member": name, "kind": "node", "result": "fail" if name in node_fault else "pass",
                        "reason": node_fault.get(name, "")})
    link_rows = {name: rows for name, rows in links.groupby("member", sort=False)}
    blamed = {}
    for pair in pairs:
        link = link_name(pair)
        rows = link_rows.get(link)
        if link in slow_links:
            # A slow link is its slow-networked end's doing, else a failed end's, else its own.
            culprits = [end for end in pair if end in link_culprits] or [end for end in pair if end in node_fault]
            blamed[link] = " and ".join(culprits) or "link"
            reason = failures.get(pair) or "; ".join(rows.loc[rows["bad"], "reason"])
            summary.append({"member": link, "kind": "link", "result": "explained" if culprits else "fail",
                            "reason": f"node {blamed[link]} failed" if culprits else reason})
        elif rows is None:
            summary.append({"member": link, "kind": "link", "result": "fail",
                            "reason": "not measured: no record of this link"})
        else:
            summary.append({"member": link, "kind": "link", "result": "pass", "reason": ""})
    links["slow"] = links["bad"]
    links["blamed_on"] = links["member"].map(blamed).fillna("")
    return FleetVerdict(nodes.rename(columns={"member": "node"})[NODE_COLUMNS],
                        links.rename(columns={"member": "link"})[LINK_COLUMNS],
                        pd.DataFrame(summary, columns=SUMMARY_COLUMNS))


def _failures(records: list[dict]) -> dict[tuple[str, ...], str]:
    """Why each node's or link's runs failed, by its members: the record's own reasons (with Slurm's state
    and reason when the job was ended from outside), each reason once with the runs that gave it."""
    failed: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for record in records:
        members = _members(record)
        if record["status"] != "ok" and len(members) in (1, 2):
            why = f"{record['status']}: {'; '.join(record.get('reasons') or []) or 'no reason given'}"
            failed.setdefault(members, {}).setdefault(why, []).append(record["run_id"])
    return {members: "; ".join(f"{runs[0]}{f' and {len(runs) - 1} more' if len(runs) > 1 else ''} {why}"
                               for why, runs in reasons.items())
            for members, reasons in failed.items()}


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
    return "\n".join(lines) + ("\n" if lines else "")


VERDICT_FILES = {"nodes": "fleet_nodes.csv", "links": "fleet_links.csv", "summary": "fleet_summary.csv",
                 "drain": "drain.txt"}


def write_verdict(verdict: FleetVerdict, out_dir) -> dict[str, Path]:
    """The per-node and per-link tables, the one-row-per-member summary and the drain list, in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {key: out / name for key, name in VERDICT_FILES.items()}
    verdict.nodes.to_csv(paths["nodes"], index=False)
    verdict.links.to_csv(paths["links"], index=False)
    verdict.summary.to_csv(paths["summary"], index=False)
    paths["drain"].write_text(format_drain_list(verdict))
    return paths


def format_verdict(verdict: FleetVerdict) -> str:
    summary = verdict.summary
    counts = {kind: (summary["kind"] == kind).sum() for kind in ("node", "link")}
    lines = [f"fleet: {len(verdict.failed_nodes)} of {counts['node']} node(s) failed, "
             f"{len(verdict.bad_links)} of {counts['link']} link(s) bad"]
    shown = summary[summary["result"] != "pass"]
    width = max([len(member) for member in shown["member"]] or [0])
    lines += [f"  {row.kind:4} {row.member:<{width}}  {row.result:9} {row.reason}" for row in shown.itertuples()]
    return "\n".join(lines)
