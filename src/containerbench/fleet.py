"""Fleet validation: which nodes of a batch, and which links between them, are bad.

A batch of new nodes is judged against itself. Every node runs the same
single-node benchmarks and every link of a few pairings the same two-node ones;
each figure is set against the fleet's median, with the median absolute
deviation (MAD) as the spread, which one bad node cannot drag along as it would
a mean and a standard deviation. A figure fails when it is both far out by that
robust measure (Iglewicz and Hoaglin's modified z-score) and further than a
fraction from the median: a homogeneous fleet has a tiny MAD, and 2% off is not a
fault. Half the median (twice, for a latency) fails whatever the spread, and so
does a figure outside the site's reference.

Links are localised from the pairings: a ring (each node with its neighbours)
and chords (each node with the one half-way round) put every node of four or
more in three links or more. Links are set against the links between nodes that
passed (a node slow in everything slows its links too). A node slow in all of
its measured links to nodes that passed, two or more, is the culprit, and those
links are not blamed; a slow link whose nodes are both fine elsewhere is the
link itself (a cable, a switch port).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from containerbench.config import RunSpec, mpi_models
from containerbench.slurm import (
    ALLOCATION_SLACK_MINUTES,
    NodeState,
    QueryError,
    allocation_argv,
    job_partition,
    expand_hostlist,
    node_states,
    partition_states,
)
from containerbench.status import Status
from containerbench.validate import LOWER_IS_BETTER, Reference, metric_of, record_variables

# MAD x 1.4826 estimates the standard deviation of normal data; 3.5 is Iglewicz and
# Hoaglin's cut-off for the modified z-score (NIST/SEMATECH e-Handbook, 1.3.5.17).
MAD_TO_SIGMA = 1.4826
ROBUST_Z_LIMIT = 3.5
# Half the fleet median's throughput, or twice its latency, fails whatever the spread: in a batch of
# a few nodes one bad figure is a third of the basis and widens the MAD it is measured against.
GROSS_RATIO = 0.5

# deviation_percent: from the fleet median; better_percent: the same, signed so that below 0 is worse
# whatever the metric (latency up is worse), which is what the charts show.
NODE_COLUMNS = ["node", "variable", "value", "unit", "reference", "fleet_median", "mad", "robust_z",
                "deviation_percent", "better_percent", "result", "reason"]
LINK_COLUMNS = ["link", "variable", "value", "unit", "reference", "fleet_median", "mad", "robust_z",
                "deviation_percent", "better_percent", "slow", "blamed_on", "reason"]
SUMMARY_COLUMNS = ["member", "kind", "result", "reason"]


class FleetError(QueryError):
    """A node selection that cannot be validated; the message is one line for the user."""


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

    @classmethod
    def load(cls, path, key: str) -> FleetPlan:
        """A saved plan; one that cannot be read is refused in one line naming `key` (where it was given)."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise FleetError(f"{key} = {str(path)!r} is not a readable plan ({error}); allowed: a plan.json that "
                             "`containerbench fleet plan --write` or validate_nodes wrote") from None


def select(nodes: str | None = None, partition: str | None = None, via: tuple[str, ...] = ()) -> dict[str, NodeState]:
    """The batch to validate, with Slurm's state of each node: a hostlist or a partition, not both."""
    if bool(nodes) == bool(partition):
        raise FleetError("give one of 'validation.nodes' (a Slurm hostlist) and 'validation.partition'; "
                         f"got {'both' if nodes else 'neither'}")
    if nodes:
        return node_states(expand_hostlist(nodes, via), via)
    states = partition_states(partition, via)
    return {name: states[name] for name in in_order(states)}


def planned(validation: dict, via: tuple[str, ...] = ()) -> FleetPlan:
    """The validation section's plan: a saved one (validation.plan: a resumed validation keeps its nodes
    and links while their states change), else the nodes and links of its selection, from Slurm."""
    if validation["plan"] and (validation["nodes"] or validation["partition"]):
        raise FleetError("give one of 'validation.nodes', 'validation.partition' and 'validation.plan'; got "
                         "'validation.plan' with " + ("'validation.nodes'" if validation["nodes"] else "'validation.partition'"))
    if validation["plan"]:
        return FleetPlan.load(validation["plan"], "'validation.plan'")
    return plan(select(validation["nodes"], validation["partition"], via))


def check_time_limit(jobs: FleetJobs, settings: dict, partitions: dict | None) -> None:
    """Refuse, before anything is submitted, a job longer than its partition's MaxTime (sinfo)."""
    name = job_partition(settings, partitions or {})
    limit = (partitions or {}).get(name)
    member, minutes = jobs.longest()
    if limit and limit.max_minutes is not None and minutes > limit.max_minutes:
        raise FleetError(f"the job of {member} may take {minutes} minutes (its runs' timeouts, "
                         f"'benchmark.timeout_s' and 'netbench.timeout_s', and 'validation.repetitions'), beyond "
                         f"partition {name!r}'s time limit of {limit.max_minutes}; allowed: shorter timeouts or "
                         "fewer repetitions")


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
    """The nodes a run ran on: Slurm's names of the nodes it was pinned to, else what its ranks reported
    (a node's hostname may differ from its NodeName: an FQDN, a NodeHostname)."""
    hosts = record["spec"].get("nodelist") or (record.get("result") or {}).get("hostnames") or []
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


def robust_deviation(values: pd.DataFrame, min_shortfall: float, basis=None) -> pd.DataFrame:
    """Each value against its variable's fleet median and MAD; `worse` when far out in the bad direction.
    `basis` (a mask): the rows the median and MAD come from, where a variable has any; else all rows."""
    basis = pd.Series(True, index=values.index) if basis is None else pd.Series(basis, index=values.index)
    has_basis = basis.groupby(values["variable"]).transform("any")
    counted = values[basis | ~has_basis]
    center = counted.groupby("variable")["value"].median()
    spread = (counted["value"] - counted["variable"].map(center)).abs().groupby(counted["variable"]).median()
    median, mad = values["variable"].map(center), values["variable"].map(spread)
    sign = np.where(values["variable"].map(metric_of).isin(LOWER_IS_BETTER), -1.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        deviation = 100 * (values["value"] / median - 1)
        # No spread (MAD 0, e.g. most nodes identical): any difference is infinitely far out, so
        # the shortfall fraction alone decides.
        z = np.where(mad > 0, (values["value"] - median) / (MAD_TO_SIGMA * mad),
                     np.sign(values["value"] - median) * np.inf)
        ratio = np.where(sign > 0, values["value"] / median, median / values["value"])  # below 1: worse
    worse = ((sign * z < -ROBUST_Z_LIMIT) & (sign * deviation < -100 * min_shortfall)) | (ratio < GROSS_RATIO)
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
    # Links are set against the links between nodes that passed: a node slow in everything (a CPU
    # fault) slows its links too, and in a small batch those would drag the links' median along.
    links = values[values["scope"] == "link"]
    healthy = [not set(member.split("+")) & set(node_fault) for member in links["member"]]
    links = _against(robust_deviation(links, min_shortfall, healthy), references or {})
    link_rows = {name: rows for name, rows in links.groupby("member", sort=False)}
    # A node slow in every link it is in (three or more from four nodes) is the culprit for all of them.
    # Counted: its measured links to nodes that passed; a link to a failed node, or a link job that
    # failed (no figure), says nothing about this end.
    pairs = [in_order(pair) for pair in fleet.links]
    measured_slow = set(links.loc[links["bad"], "member"])
    slow_links = measured_slow | {link_name(key) for key in failures if len(key) == 2}
    judged_links: dict[str, list[str]] = {}
    for pair in pairs:
        if link_name(pair) in link_rows and pair not in failures:
            for end, other in (pair, pair[::-1]):
                if other not in node_fault:
                    judged_links.setdefault(end, []).append(link_name(pair))
    link_culprits = set()
    for name in fleet.nodes:
        mine = judged_links.get(name, [])
        if len(mine) >= 2 and all(link in measured_slow for link in mine):
            link_culprits.add(name)
            node_fault.setdefault(name, f"slow in all {len(mine)} of its links to nodes that passed "
                                        f"({', '.join(mine)})")
    for name in [*fleet.nodes, *fleet.unavailable]:
        summary.append({"member": name, "kind": "node", "result": "fail" if name in node_fault else "pass",
                        "reason": node_fault.get(name, "")})
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
        if record["status"] != Status.OK and len(members) in (1, 2):
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


def format_summary(summary_csv) -> tuple[str, bool]:
    """A written verdict's summary (fleet_summary.csv) and drain list, as `validate_nodes` ends with; and
    whether a node or link failed."""
    verdict = FleetVerdict(pd.DataFrame(), pd.DataFrame(), pd.read_csv(summary_csv, keep_default_na=False))
    drain = Path(summary_csv).with_name(VERDICT_FILES["drain"])
    text = format_verdict(verdict) + "\n" + (drain.read_text() if drain.exists() else "")
    return text, bool(verdict.failed_nodes or verdict.bad_links)


# The runs of each node and link job (snakemake validate_nodes: workflow/rules/fleet.smk).

def node_runs(config: dict, node: str) -> list[RunSpec]:
    """A node's job, per repetition: the single-node training in every runtime (and MPI model) of the
    config on all of the node's ranks (the largest scaling.ranks_per_node), and the intra-node
    netbench (two ranks), all pinned to the node."""
    bench, fabric = config["benchmark"], next(iter(config["fabrics"]))
    per_node = max(config["scaling"]["ranks_per_node"])
    runs = []
    for repetition in range(1, config["validation"]["repetitions"] + 1):
        for runtime in config["runtimes"]:
            runs += [RunSpec("train", runtime, fabric, 1, per_node, repetition, bench["batch_sizes"][0],
                             bench["modes"][0], bench["data"][0], model, (node,))
                     for model in mpi_models(config, runtime)]
        runtime = config["runtimes"][0]
        runs.append(RunSpec("netbench", runtime, fabric, 1, 2, repetition, mpi_model=mpi_models(config, runtime)[0],
                            nodelist=(node,)))
    return runs


def link_runs(config: dict, pair: tuple[str, str]) -> list[RunSpec]:
    """A link's job, per repetition: the two-node netbench (one rank a node) over every fabric of the
    config, and with validation.link_training a two-node training run, in the config's first runtime."""
    bench, runtime = config["benchmark"], config["runtimes"][0]
    model = mpi_models(config, runtime)[0]
    runs = []
    for repetition in range(1, config["validation"]["repetitions"] + 1):
        runs += [RunSpec("netbench", runtime, fabric, 2, 1, repetition, mpi_model=model, nodelist=tuple(pair))
                 for fabric in config["fabrics"]]
        if config["validation"]["link_training"]:
            runs.append(RunSpec("train", runtime, next(iter(config["fabrics"])), 2,
                                max(config["scaling"]["ranks_per_node"]), repetition, bench["batch_sizes"][0],
                                bench["modes"][0], bench["data"][0], model, tuple(pair)))
    return runs


def allocation_minutes(config: dict, runs: list[RunSpec]) -> int:
    """How long a node's or link's job may hold its nodes: its runs' timeouts, each with the slack a
    failed run may spend asking sacct."""
    seconds = sum(config["netbench" if run.kind == "netbench" else "benchmark"]["timeout_s"] for run in runs)
    return -(-seconds // 60) + ALLOCATION_SLACK_MINUTES * len(runs)


def run_job(job_file, in_allocation: bool = False) -> int:
    """A node's or link's job (the file FleetJobs.write made): its allocation asked from here, its runs
    run in it one after another (launch.run_in_allocation), from outside it."""
    from containerbench.launch import run_allocated_plans, run_in_allocation
    from containerbench.records import write_record

    job = json.loads(Path(job_file).read_text())
    if in_allocation:
        return run_in_allocation(job["plans"], job["logs"])
    returncode = run_allocated_plans(job["plans"], job["logs"], job["allocation"], ["fleet", "run", str(job_file)])
    if returncode == 0:  # each raw log parsed here: a parse job per run would be most of a large batch's DAG
        for log in job["logs"]:
            write_record(log, record_path(log))
    return returncode


def record_path(log: str) -> str:
    return log.removesuffix(".log") + ".json"


class FleetJobs:
    """The node and link jobs of a plan as the workflow runs them (workflow/rules/fleet.smk): each
    job's runs and raw logs, its plans, its allocation, and the jobs it waits for."""

    def __init__(self, config: dict, fleet: FleetPlan, directory: str):
        self.config, self.directory = config, directory
        # Fleet runs are judged by their figures; their telemetry is not collected (no rule declares it).
        self.run_config = {**config, "telemetry": {**config["telemetry"], "enabled": False}}
        self.runs = {("node", node): node_runs(config, node) for node in fleet.nodes} | {
            ("link", link_name(in_order(pair))): link_runs(config, in_order(pair)) for pair in fleet.links}
        # The jobs before each link's on its two nodes: each node's own job first, then its links by round.
        latest = {node: ("node", node) for node in fleet.nodes}
        self.after: dict[str, list[tuple[str, str]]] = {}
        for taken in fleet.rounds:
            for pair in map(in_order, taken):
                self.after[link_name(pair)] = [latest[end] for end in pair]
                latest.update({end: ("link", link_name(pair)) for end in pair})

    def logs(self, job: tuple[str, str]) -> list[str]:
        return [f"{self.directory}/runs/{spec.run_id}.log" for spec in self.runs[job]]

    def waits_for(self, link: str) -> list[str]:
        """A raw log of each job before this link's on its nodes (one output names the job): one job per
        node at a time."""
        return [self.logs(job)[0] for job in self.after[link]]

    @property
    def jobs_dir(self) -> str:
        return f"{self.directory}/jobs"

    def job_file(self, job: tuple[str, str]) -> str:
        return f"{self.jobs_dir}/{job[0]}-{job[1]}.json"

    def allocation(self, job: tuple[str, str]) -> list[str]:
        """salloc for the job: exactly its nodes, exclusively, for as long as its runs may take."""
        nodes = (job[1],) if job[0] == "node" else tuple(job[1].split("+"))
        runs = self.runs[job]
        return allocation_argv(self.config["slurm"], len(nodes), max(run.ranks_per_node for run in runs),
                               allocation_minutes(self.config, runs), f"containerbench-fleet-{job[1]}", nodes,
                               exclusive=True)

    def longest(self) -> tuple[str, int]:
        """The job that may hold its nodes longest, and for how many minutes (checked against MaxTime)."""
        job = max(self.runs, key=lambda job: allocation_minutes(self.config, self.runs[job]))
        return job[1], allocation_minutes(self.config, self.runs[job])

    @property
    def records_list(self) -> str:
        """The file listing every record of the batch, for `fleet judge @FILE` and `store @FILE`."""
        return f"{self.directory}/records.txt"

    def write(self, fleet: FleetPlan, plan_path) -> None:
        """The plan, for the verdict; the list of the records to come; and each job's file: its allocation,
        its runs' plans and their raw logs. Files, not arguments: a node's plans can pass the 128 KiB one
        argument may hold, and a thousand nodes' record paths the 2 MiB of a whole command line."""
        from containerbench.launch import plan as run_plan

        for path in (Path(plan_path), Path(self.records_list)):
            path.parent.mkdir(parents=True, exist_ok=True)
        Path(plan_path).write_text(json.dumps(fleet.as_dict(), indent=1, sort_keys=True) + "\n")
        Path(self.records_list).write_text("".join(f"{path}\n" for path in self.records()))
        for job, runs in self.runs.items():
            path = Path(self.job_file(job))
            path.parent.mkdir(parents=True, exist_ok=True)
            plans = [run_plan(spec, self.run_config, allocate=False) for spec in runs]
            path.write_text(json.dumps({"allocation": self.allocation(job), "plans": plans, "logs": self.logs(job)},
                                       sort_keys=True) + "\n")

    def records(self) -> list[str]:
        return [record_path(log) for job in self.runs for log in self.logs(job)]

    def images(self, image_files: dict) -> list[str]:
        """The built images the runs need (config.ImageUse -> file, as the sweep has them)."""
        from containerbench.config import ImageUse

        return sorted({image_files[use] for runs in self.runs.values() for spec in runs
                       if (use := ImageUse.of(spec)) in image_files})
