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

A figure is compared only as finely as it repeats: when one member's repetitions
typically differ by more than the shortfall that fails (the median over the batch
of each member's range, in % of its median: the measurement's repeatability, as a
gauge study has it), a difference between members that size is the measurement's
own noise. Such a variable is "unjudged" against the fleet, and says so; a member
fails on it only when even its best repetition is under half the others' worst,
or outside the site's reference.

Links are localised from the pairings (fleetplan: a ring and chords, every node of four or more in three
links or more), against the links between nodes that passed (a node slow in everything slows its links too).
A node slow in all of its measured links to nodes that passed, two or more, is the culprit (over one rail
alone: its HCA or port), and those links are not blamed; a slow link whose nodes are both fine elsewhere is
the link itself (a cable, a switch port).

The batch's plan is fleetplan's; the jobs that measure it, fleetjobs'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from containerbench.fleetplan import FleetPlan, in_order, link_name
from containerbench.fleetsecond import CONFIRMED, Settled, failed_ends, links_to_settle, settled_links
from containerbench.fleetstats import (
    NOT_REPEATED,
    UNJUDGED,
    Failures,
    against,
    failed_members,
    member_values,
    members_of,
    robust_deviation,
    taken_out_nodes,
    unmeasured,
    unread_members,
)
from containerbench.runtimes.bare_metal import BareMetal
from containerbench.slurm import NodeState
from containerbench.validate import Reference, rail_of

# deviation_percent: from the fleet median; better_percent: the same, signed so that below 0 is worse
# whatever the metric (latency up is worse), which is what the charts show.
# spread_percent: the range of the member's repetitions in % of their median; repeatability_percent: its
# variable's median spread over the batch (the basis), against which min_shortfall must be resolvable.
NODE_COLUMNS = ["node", "variable", "value", "unit", "reference", "fleet_median", "mad", "robust_z",
                "deviation_percent", "better_percent", "runs", "spread_percent", "repeatability_percent",
                "result", "reason", "recheck_value"]
LINK_COLUMNS = ["link", "variable", "value", "unit", "reference", "fleet_median", "mad", "robust_z",
                "deviation_percent", "better_percent", "runs", "spread_percent", "repeatability_percent",
                "slow", "blamed_on", "reason"]
UNREADABLE = "unreadable"  # a summary's result: the member's only runs left results that could not be read
# A node table's and summary's result: a figure failed in a container runtime, where the same benchmark bare
# metal on the same node is within the fleet: the container's path, not the node's hardware. Not drained.
CONTAINER_PATH = "container path"
SUMMARY_COLUMNS = ["member", "kind", "result", "reason"]


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
    def container_path_nodes(self) -> list[str]:
        """Nodes whose hardware passed and whose container path failed: the site fixes the image or the
        runtime's set-up there, and the node is not drained."""
        rows = self.summary[(self.summary["kind"] == "node") & (self.summary["result"] == CONTAINER_PATH)]
        return rows["member"].tolist()

    @property
    def failed(self) -> bool:
        """Whether the batch fails: a node, a link or a container path."""
        return bool(self.failed_nodes or self.bad_links or self.container_path_nodes)

    @property
    def bad_links(self) -> list[str]:
        rows = self.summary[(self.summary["kind"] == "link") & (self.summary["result"] == "fail")]
        return rows["member"].tolist()




@dataclass
class _View:
    """The batch as its records, and its suspects' second measurements, show it, up to which nodes are slow in
    all of their links: what judge() decides from, and what relinks() names the ambiguous links from."""
    failures: Failures
    unreadable_runs: Failures
    nodes: pd.DataFrame
    node_fault: dict[str, str]
    links: pd.DataFrame
    links_again: pd.DataFrame
    noisy_ends: set[str]
    culprits: dict[str, str]


def _view(records: list[dict], fleet: FleetPlan, references: dict[str, Reference], min_shortfall: float,
          rechecked: list[dict], hardware: dict[str, str]) -> _View:
    values, failures, unreadable_runs = member_values(records), failed_members(records), unread_members(records)
    # A suspect whose second measurement failed to run, or could not be read, keeps its first pass's verdict,
    # and says why.
    recheck_failed = {members[0]: why for members, why in unmeasured(list(rechecked), 1).items()}
    again = member_values(list(rechecked)) if rechecked else None
    nodes = _node_figures(values, min_shortfall, references, again, recheck_failed)
    node_fault = _node_faults(fleet, nodes, failures, unreadable_runs)
    for name, why in hardware.items():  # hardware.failures: the plan's nodes only
        node_fault[name] = f"{why}; {node_fault[name]}" if name in node_fault else why
    # Slurm's word first: a drained node's reason starts with it, and it is no node to drain again (fleetexport);
    # alone where the node's own runs were the ones left out (their failure says the same again).
    own_left_out = {members_of(record)[0] for record in records if record.get("taken_out")
                    and len(members_of(record)) == 1}
    for name, why in taken_out_nodes([*records, *rechecked]).items():
        node_fault[name] = f"{why}; {node_fault[name]}" if name in node_fault and name not in own_left_out else why
    links, links_again = _link_figures(values, node_fault, min_shortfall, references, again)
    # A node whose first-pass figures were not repeated is no culprit through links measured in that pass.
    noisy_ends = set(nodes.loc[nodes["result"] == NOT_REPEATED, "member"])
    culprits = {name: why for name, why in _slow_networked_nodes(fleet, links, failures, node_fault).items()
                if name not in noisy_ends}
    return _View(failures, unreadable_runs, nodes, node_fault, links, links_again, noisy_ends, culprits)


def judge(records: list[dict], fleet: FleetPlan, references: dict[str, Reference] | None = None,
          min_shortfall: float = 0.10, rechecked: list[dict] = (), hardware: dict[str, str] | None = None
          ) -> FleetVerdict:
    """The verdict on every node and link of `fleet` from its records: a node that did not run, or whose
    runs failed, fails with the reason; a missing row is never a pass. `rechecked`: the records of the
    second measurements, the suspects' (suspects()) and the ambiguous links' with their ends' pairings
    (relinks()); a figure fails only where that measurement fails it too. `hardware`: node -> why its
    hardware tier failed (hardware.failures), said before anything timed."""
    view = _view(records, fleet, references or {}, min_shortfall, rechecked, hardware or {})
    nodes, node_fault, links, culprits = view.nodes, view.node_fault, view.links, view.culprits
    remeasured = {link_name(members_of(record)) for record in rechecked if len(members_of(record)) == 2}
    settled = settled_links(links, view.links_again, node_fault, unmeasured(list(rechecked), 2), remeasured)
    for second in settled.values():  # an end slow with every node that passed it was re-paired with
        for end, why in second.blame.items():
            culprits.setdefault(end, why)
    for name, reason in culprits.items():  # failed too; a fault of their own comes first
        node_fault.setdefault(name, reason)
    link_summary, blamed = _link_verdicts(fleet, links, view, settled)
    passed_links = {row["member"] for row in link_summary if row["result"] in (UNJUDGED, "pass")}
    links["slow"] = links["bad"] & ~links["member"].isin(passed_links)
    links["blamed_on"] = links["member"].map(blamed).fillna("")
    noted = {result: {name: "; ".join(rows["reason"]) for name, rows in nodes[nodes["result"] == result]
                      .groupby("member", sort=False)} for result in (NOT_REPEATED, CONTAINER_PATH)}
    summary = (_node_verdicts(fleet, node_fault, view.unreadable_runs, noted) + link_summary
               + _unjudged_variables(nodes, links, min_shortfall))
    return FleetVerdict(nodes.rename(columns={"member": "node"})[NODE_COLUMNS],
                        links.rename(columns={"member": "link"})[LINK_COLUMNS],
                        pd.DataFrame(summary, columns=SUMMARY_COLUMNS))


def _unjudged_variables(nodes: pd.DataFrame, links: pd.DataFrame, min_shortfall: float) -> list[dict]:
    """A summary row per variable the fleet could not judge (kind "variable"), so that the verdict says
    which figures it did not compare, and why, rather than passing them in silence."""
    columns = ["variable", "unjudged", "repeatability_percent"]
    rows = pd.concat([nodes[columns], links[columns]])
    rows = rows[rows["unjudged"].astype(bool)].drop_duplicates("variable")
    return [{"member": row.variable, "kind": "variable", "result": UNJUDGED,
             "reason": f"repetitions of one member differ by {row.repeatability_percent:.0f}% (the batch's median): "
                       f"too coarse to resolve the {100 * min_shortfall:.0f}% shortfall that fails; only a member "
                       "whose best repetition is under half the others' worst, or outside a reference, fails on it"}
            for row in rows.itertuples()]


def suspects(records: list[dict], fleet: FleetPlan, references: dict[str, Reference] | None = None,
             min_shortfall: float = 0.10, hardware: dict[str, str] | None = None) -> list[str]:
    """The nodes a second measurement must confirm before they are failed: those whose own figures fail,
    from runs that ran (a failed run, a Slurm state or a failed hardware check is its own evidence and
    needs none)."""
    nodes = _node_figures(member_values(records), min_shortfall, references or {})
    # Against the fleet: a batch all below a site's reference would otherwise be measured twice, whole.
    failed = set(nodes.loc[nodes["worse"].astype(bool), "member"])
    failures, hardware, taken_out = failed_members(records), hardware or {}, taken_out_nodes(records)
    return [name for name in fleet.nodes
            if name in failed and (name,) not in failures and name not in hardware and name not in taken_out]


def relinks(records: list[dict], fleet: FleetPlan, references: dict[str, Reference] | None = None,
            min_shortfall: float = 0.10, rechecked: list[dict] = (), hardware: dict[str, str] | None = None
            ) -> list[str]:
    """After the suspects' second measurements (`rechecked`), the slow links no end explains, each followed by
    its ends' pairings with nodes that passed (fleetsecond.links_to_settle): what the verdict would otherwise
    call a bad cable, or leave unjudged, on one pass's evidence."""
    view = _view(records, fleet, references or {}, min_shortfall, rechecked, hardware or {})
    unreadable_nodes = {members[0] for members in view.unreadable_runs if len(members) == 1}
    return links_to_settle(fleet, view.links, view.failures, view.node_fault, view.culprits, unreadable_nodes)


def _node_figures(values: pd.DataFrame, min_shortfall: float, references: dict[str, Reference],
                  rechecked: pd.DataFrame | None = None, recheck_failed: dict[str, str] | None = None) -> pd.DataFrame:
    """Each node's figures against the whole fleet's and the references: `result` fail or pass. A figure
    that failed and was measured again (`rechecked`, set against the same first-pass fleet) fails only if
    it fails again: else its result is NOT_REPEATED, a moment's noise on a healthy node, which is not
    drained for it (a shared machine's neighbour, a hypervisor moving vCPUs, a slow file system). A node
    whose second measurement had a run fail (`recheck_failed`, why) keeps its failed figures: a node that
    crashes when measured again is no healthier."""
    first = values[values["scope"] == "node"]
    again = (rechecked[rechecked["scope"] == "node"] if rechecked is not None else first.iloc[:0])
    both = pd.concat([first, again], ignore_index=True)
    in_first = np.arange(len(both)) < len(first)
    # The fleet's median, MAD and repeatability come from the first pass only: a recheck is judged by it.
    judged = against(robust_deviation(both, min_shortfall, in_first), references, min_shortfall)
    nodes, again = judged[in_first].copy(), judged[~in_first].set_index(["member", "variable"])
    nodes["result"] = np.where(nodes["bad"], "fail", np.where(nodes["unjudged"], UNJUDGED, "pass"))
    nodes["recheck_value"] = np.nan
    for index, row in nodes[nodes["bad"]].iterrows():
        if row["member"] in (recheck_failed or {}):
            nodes.loc[index, "reason"] = f"{row['reason']}; measured again: {recheck_failed[row['member']]}"
            continue
        if (row["member"], row["variable"]) not in again.index:
            if rechecked is not None and row["member"] in set(rechecked["member"]):
                nodes.loc[index, "reason"] = f"{row['reason']}; measured again: no figure of it"
            continue
        second = again.loc[(row["member"], row["variable"])]
        nodes.loc[index, "recheck_value"] = second["value"]
        measured = (f"measured again later: {second['value']:.4g} {row['unit']}, "
                    f"{abs(second['deviation_percent']):.0f}% {'above' if second['deviation_percent'] > 0 else 'below'}"
                    " the first pass's median")
        if second["bad"]:
            nodes.loc[index, "reason"] = f"{row['reason']}; {measured}: confirmed"
        else:
            nodes.loc[index, ["bad", "result", "reason"]] = [False, NOT_REPEATED,
                                                             f"{row['reason']}; {measured}: within the fleet"]
    # Measured again: a node whose second measurement failed, or was slow bare metal, is not the container's.
    unhealthy = set(recheck_failed or {}) | {member for member, variable in again.index[again["bad"].to_numpy()]
                                               if bare_metal_counterpart(variable) is None}
    return _container_paths(nodes, unhealthy)


def bare_metal_counterpart(variable: str) -> str | None:
    """The same figure bare metal: the variable with its runtime's label (train/MODEL/RUNTIME/..., netbench/
    RUNTIME/...) made bare-metal's; None where it is bare metal's already."""
    parts = variable.split("/")
    where = 2 if parts[0] == "train" else 1
    if len(parts) <= where or parts[where].partition(" ")[0] == BareMetal.name:  # its " (native)" label too
        return None
    return "/".join([*parts[:where], BareMetal.name, *parts[where + 1:]])


def _container_paths(nodes: pd.DataFrame, unhealthy: set[str]) -> pd.DataFrame:
    """A figure that fails in a container runtime while the same benchmark bare metal on the same node is
    within the fleet is the container's path on that node (the image, a missing GPUDirect, NCCL plugin or
    topology file, a hook), not the node's hardware: its result is CONTAINER_PATH. Not for a node whose
    second measurement failed or was slow bare metal (`unhealthy`), nor where bare metal is unjudged."""
    by_figure = nodes.set_index(["member", "variable"])
    for index, row in nodes[nodes["result"] == "fail"].iterrows():
        host = bare_metal_counterpart(row["variable"])
        if host is None or row["member"] in unhealthy or (row["member"], host) not in by_figure.index:
            continue
        bare = by_figure.loc[(row["member"], host)]
        if bare["result"] in ("pass", NOT_REPEATED):
            nodes.loc[index, ["result", "reason"]] = [CONTAINER_PATH, (
                f"{row['reason']}; bare metal on this node {bare['value']:.4g} {bare['unit']}, within the fleet: "
                "the container's path, not the node's hardware")]
    return nodes


def _node_faults(fleet: FleetPlan, nodes: pd.DataFrame, failures: Failures,
                 unreadable_runs: Failures) -> dict[str, str]:
    """Why each node failed on its own job's evidence, by name; a node not named passed it, or left
    only unreadable results (`unreadable_runs`)."""
    node_rows = {name: rows for name, rows in nodes.groupby("member", sort=False)}
    faults = {}
    for name in [*fleet.nodes, *fleet.unavailable]:
        if (name,) in unreadable_runs and (name,) not in failures:
            continue
        fault = _node_fault(name, fleet.unavailable.get(name), node_rows.get(name), failures)
        if fault is not None:
            faults[name] = fault
    return faults


def _node_fault(name: str, state: NodeState | None, mine: pd.DataFrame | None,
                failures: Failures) -> str | None:
    """Not run (Slurm's state), runs that failed, no record, or figures far out: the first that holds."""
    if state is not None:
        return f"not run: Slurm state {state.state}" + (f" ({state.reason})" if state.reason else "")
    if (name,) in failures:
        return failures[(name,)]
    if mine is None:
        return "not measured: no record of this node"
    if (mine["result"] == "fail").any():
        return "; ".join(mine.loc[mine["result"] == "fail", "reason"])
    return None


def _link_figures(values: pd.DataFrame, node_fault: dict[str, str], min_shortfall: float,
                  references: dict[str, Reference], again: pd.DataFrame | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each link's figures against the links between nodes that passed, and the references: `bad`; and
    those of the links measured again (`again`: settled links and re-pairings), against the same first-pass
    basis.

    A node slow in everything (a CPU fault) slows its links too, and in a small batch those would
    drag the links' median along."""
    first = values[values["scope"] == "link"]
    second = again[again["scope"] == "link"] if again is not None else first.iloc[:0]
    both = pd.concat([first, second], ignore_index=True)
    in_first = np.arange(len(both)) < len(first)
    healthy = in_first & np.array([not set(member.split("+")) & set(node_fault) for member in both["member"]],
                                  dtype=bool)
    judged = against(robust_deviation(both, min_shortfall, healthy), references, min_shortfall)
    return judged[in_first].copy(), judged[~in_first].copy()


def _slow_networked_nodes(fleet: FleetPlan, links: pd.DataFrame, failures: Failures,
                          node_fault: dict[str, str]) -> dict[str, str]:
    """The nodes slow in every link they are in (three or more from four nodes), the culprits for all
    of them, with why. Counted: a node's measured links to nodes that passed, two or more; a link to a
    failed node, or a link job that failed (no figure), says nothing about this end."""
    slow_rails = links[links["bad"]].groupby("member")["variable"].agg(lambda each: set(each.map(rail_of)))
    judged_links = _links_to_passed_nodes(fleet, set(links["member"]), failures, node_fault)
    culprits = {}
    for name in fleet.nodes:
        mine = judged_links.get(name, [])
        if len(mine) >= 2 and all(link in slow_rails for link in mine):
            rails = sorted(set.intersection(*(slow_rails[link] for link in mine)) - {""})  # "": the fabric whole
            over = f" over rail {' and '.join(rails)}" if rails else ""  # first: a drain reason is cut at 160
            culprits[name] = f"slow{over} in all {len(mine)} of its links to nodes that passed ({', '.join(mine)})"
    return culprits


def _links_to_passed_nodes(fleet: FleetPlan, measured: set[str], failures: Failures,
                           node_fault: dict[str, str]) -> dict[str, list[str]]:
    """Each node's links with figures, whose job ran, to a node that passed: by node."""
    judged: dict[str, list[str]] = {}
    for pair in map(in_order, fleet.links):
        if link_name(pair) in measured and pair not in failures:
            for end, other in (pair, pair[::-1]):
                if other not in node_fault:
                    judged.setdefault(end, []).append(link_name(pair))
    return judged


def _node_verdicts(fleet: FleetPlan, node_fault: dict[str, str], unreadable_runs: Failures,
                   noted: dict[str, dict[str, str]]) -> list[dict]:
    """A summary row per node of the plan, measured or not. `noted`, by result: the nodes with figures not
    repeated when measured again (they pass, and say so) or failed in a container only (CONTAINER_PATH)."""
    rows = []
    for name in [*fleet.nodes, *fleet.unavailable]:
        if name in node_fault:
            rows.append({"member": name, "kind": "node", "result": "fail", "reason": node_fault[name]})
        elif (name,) in unreadable_runs:
            rows.append({"member": name, "kind": "node", "result": UNREADABLE, "reason": unreadable_runs[(name,)]})
        elif name in noted[CONTAINER_PATH]:
            rows.append({"member": name, "kind": "node", "result": CONTAINER_PATH,
                         "reason": noted[CONTAINER_PATH][name]})
        else:
            not_repeated = noted[NOT_REPEATED]
            reason = f"{NOT_REPEATED}: {not_repeated[name]}" if name in not_repeated else ""
            rows.append({"member": name, "kind": "node", "result": "pass", "reason": reason})
    return rows


def _link_verdicts(fleet: FleetPlan, links: pd.DataFrame, view: _View,
                   settled: dict[str, Settled]) -> tuple[list[dict], dict[str, str]]:
    """A summary row per link of the plan, and whom each slow link is blamed on: a slow link whose
    ends are fine is the link's own fault (a cable, a switch port). A slow link measured again (`settled`)
    passes where that measurement is within the fleet and no end's pairings blame it; confirmed, it is the
    link itself where both ends re-paired were within the fleet, whatever else failed them, and fails blamed
    on no one where no end is told. Else, one with an end whose first-pass figures were not repeated when
    measured again (view.noisy_ends) was measured in that pass: unjudged."""
    failures, node_fault, culprits = view.failures, view.node_fault, view.culprits
    link_rows = {name: rows for name, rows in links.groupby("member", sort=False)}
    slow_links = set(links.loc[links["bad"], "member"]) | {link_name(key) for key in failures if len(key) == 2}
    summary, blamed = [], {}
    for pair in map(in_order, fleet.links):
        link = link_name(pair)
        rows = link_rows.get(link)
        if link in slow_links:
            ends = failed_ends(pair, culprits, node_fault)
            blamed[link] = " and ".join(ends) or "link"
            reason = failures.get(pair) or "; ".join(rows.loc[rows["bad"], "reason"])
            second = settled.get(link) if pair not in failures else None
            if second is not None:
                reason = f"{reason}; {second.why}"
                if second.result == NOT_REPEATED and not second.blame:
                    blamed[link] = ""
                    summary.append({"member": link, "kind": "link", "result": "pass",
                                    "reason": f"{NOT_REPEATED}: {reason}"})
                    continue
                if second.result == CONFIRMED and (second.link_itself or not ends):
                    blamed[link] = "link" if second.link_itself else ""  # else: not told
                    summary.append({"member": link, "kind": "link", "result": "fail", "reason": reason})
                    continue
            noisy = [end for end in pair if end in view.noisy_ends]
            if not ends and noisy and pair not in failures:
                blamed[link] = ""
                summary.append({"member": link, "kind": "link", "result": UNJUDGED, "reason": (
                    f"{reason}; not judged: its end {' and '.join(noisy)} was slow in the first pass and not when "
                    "measured again, and the link was measured in that pass")})
                continue
            summary.append({"member": link, "kind": "link", "result": "explained" if ends else "fail",
                            "reason": f"node {blamed[link]} failed" if ends else reason})
        elif pair in view.unreadable_runs:
            summary.append({"member": link, "kind": "link", "result": UNREADABLE, "reason": view.unreadable_runs[pair]})
        elif rows is None:
            summary.append({"member": link, "kind": "link", "result": "fail",
                            "reason": "not measured: no record of this link"})
        else:
            summary.append({"member": link, "kind": "link", "result": "pass", "reason": ""})
    return summary, blamed
