"""A batch's figures against the fleet: each node's and link's median over its repetitions, set against
its variable's fleet median and median absolute deviation (MAD), as finely as the variable repeats, and
against the site's references. fleet judges the batch with them; its second pass (suspects measured
again, a slow link re-paired) is judged against the same first-pass fleet.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from containerbench.fleetplan import in_order, link_name
from containerbench.records import UNREADABLE_RESULT
from containerbench.slurm import NodeState
from containerbench.status import Status
from containerbench.validate import LOWER_IS_BETTER, Reference, figure_name, metric_of, record_variables

UNJUDGED = "unjudged"  # a node table's result: the variable does not repeat finely enough to compare nodes
NOT_REPEATED = "not repeated"  # a node table's result: failed, then within the fleet when measured again

Failures = dict[tuple[str, ...], str]  # why a node's (one name) or a link's (two) runs failed

# MAD x 1.4826 estimates the standard deviation of normal data; 3.5 is Iglewicz and
# Hoaglin's cut-off for the modified z-score (NIST/SEMATECH e-Handbook, 1.3.5.17).
MAD_TO_SIGMA = 1.4826
ROBUST_Z_LIMIT = 3.5
# Half the fleet median's throughput, or twice its latency, fails whatever the spread: in a batch of
# a few nodes one bad figure is a third of the basis and widens the MAD it is measured against.
GROSS_RATIO = 0.5


def members_of(record: dict) -> tuple[str, ...]:
    """The nodes a run ran on: Slurm's names of the nodes it was pinned to, else what its ranks reported
    (a node's hostname may differ from its NodeName: an FQDN, a NodeHostname)."""
    hosts = record["spec"].get("nodelist") or (record["result"] or {}).get("hostnames") or []
    return in_order(hosts.split(",") if isinstance(hosts, str) else hosts)


def on_nodes(records: list[dict], nodes) -> list[dict]:
    """The records of runs that ran only on these nodes (nodes declared good, for a baseline)."""
    wanted = set(nodes)
    return [record for record in records if set(members_of(record)) <= wanted and members_of(record)]


def member_values(records: list[dict]) -> pd.DataFrame:
    """The median of each variable per node (one-node runs) and per link (two-node runs), over repetitions."""
    members = {record["run_id"]: members_of(record) for record in records}
    values = record_variables(records)
    values["hosts"] = values["run_id"].map(members)
    values = values[values["hosts"].map(len).isin((1, 2))]
    values["member"] = values["hosts"].map(link_name)
    values["scope"] = np.where(values["hosts"].map(len) == 1, "node", "link")
    grouped = (values.groupby(["scope", "member", "variable", "unit"], as_index=False, sort=False)
               .agg(value=("value", "median"), runs=("run_id", "nunique"), low=("value", "min"),
                    high=("value", "max")))
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = 100 * (grouped["high"] - grouped["low"]) / grouped["value"].abs()
    return grouped.assign(spread_percent=spread.where(grouped["runs"] > 1))


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
    repeatability, unjudged, best_too_low = _repeatability(values, counted, sign, min_shortfall)
    return values.assign(fleet_median=median, mad=mad, robust_z=z, deviation_percent=deviation,
                         better_percent=sign * deviation, repeatability_percent=repeatability, unjudged=unjudged,
                         worse=np.where(unjudged, best_too_low, worse))


def _repeatability(values: pd.DataFrame, counted: pd.DataFrame, sign, min_shortfall: float):
    """Each row's variable's repeatability (the median over the basis of a member's spread over its
    repetitions, in %), whether it is too coarse to resolve `min_shortfall` (unjudged), and whether the
    row's best repetition is under half the median of the basis' worst ones (a fault however noisy)."""
    if "spread_percent" not in values:  # one figure per member: no repetitions to tell noise by
        false = np.zeros(len(values), dtype=bool)
        return pd.Series(np.nan, index=values.index), false, false
    repeatability = values["variable"].map(counted.groupby("variable")["spread_percent"].median())
    unjudged = (repeatability > 100 * min_shortfall).to_numpy()
    higher_better = sign > 0
    best = np.where(higher_better, values["high"], values["low"])
    counted_worst = counted["high"].where(counted["variable"].map(metric_of).isin(LOWER_IS_BETTER), counted["low"])
    floor = values["variable"].map(counted_worst.groupby(counted["variable"]).median())
    with np.errstate(divide="ignore", invalid="ignore"):
        best_ratio = np.where(higher_better, best / floor, floor / best)
    return repeatability, unjudged, best_ratio < GROSS_RATIO


def against(values: pd.DataFrame, references: dict[str, Reference], min_shortfall: float) -> pd.DataFrame:
    """`bad`: far out in the fleet, or outside the site's reference for the node type (a whole batch
    equally slow passes the first test and fails this one); `reason` says which, or why the fleet could
    not judge the figure."""
    known = values["variable"].map(references.get)
    outside = [reference is not None and not reference.admits(value)
               for reference, value in zip(known, values["value"])]
    reasons = []
    for row, reference, out in zip(values.itertuples(), known, outside):
        why = [_why(row)] if row.worse else []
        if row.unjudged and not row.worse:
            why.append(f"{figure_name(row.variable)} not judged against the fleet: one member's repetitions differ "
                       f"by {row.repeatability_percent:.0f}% (the batch's median), more than the "
                       f"{100 * min_shortfall:.0f}% shortfall that fails")
        if out:
            bounds = " and ".join(f"{word} {bound:.4g}" for word, bound in (("at least", reference.lower_bound),
                                                                            ("at most", reference.upper_bound))
                                  if bound is not None)
            why.append(f"{figure_name(row.variable)} {row.value:.4g} {row.unit} outside the reference "
                       f"{reference.reference:.4g} ({bounds})")
        reasons.append("; ".join(why))
    return values.assign(reference=[None if reference is None else reference.reference for reference in known],
                         bad=values["worse"] | np.array(outside, dtype=bool), reason=reasons)


def _why(row) -> str:
    direction = "above" if row.deviation_percent > 0 else "below"
    why = (f"{figure_name(row.variable)} {row.value:.4g} {row.unit}, {abs(row.deviation_percent):.0f}% {direction} "
           f"the fleet median {row.fleet_median:.4g} (robust z {row.robust_z:.1f})")
    if row.unjudged:
        why += (f", and even its best repetition under half the others' worst (repetitions differ by "
                f"{row.repeatability_percent:.0f}%)")
    return why


def unreadable(record: dict) -> bool:
    """A run whose result was printed but could not be read back: evidence of nothing about the node or
    link, neither slow nor fast (its table rows are missing, and its summary row says why)."""
    return any(reason.startswith(UNREADABLE_RESULT) for reason in record["reasons"])


def unread_members(records: list[dict]) -> Failures:
    """The members with a kind of run (training, netbench) whose runs left no figure but unreadable ones,
    and which: run again rather than judged."""
    measured = {(members_of(record), record["kind"]) for record in records if record["status"] == Status.OK}
    runs: dict[tuple[str, ...], list[str]] = {}
    for record in records:
        members = members_of(record)
        if unreadable(record) and len(members) in (1, 2) and (members, record["kind"]) not in measured:
            runs.setdefault(members, []).append(record["run_id"])
    return {members: f"result of {', '.join(ids)} unreadable (the launcher's output cut it): not judged, run it again"
            for members, ids in runs.items()}


def failed_members(records: list[dict]) -> Failures:
    """Why each node's or link's runs failed, by its members: the record's own reasons (with Slurm's state
    and reason when the job was ended from outside), each reason once with the runs that gave it. A run
    whose result is unreadable is no failure of either (unreadable_runs)."""
    failed: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for record in records:
        members = members_of(record)
        if record["status"] != Status.OK and len(members) in (1, 2) and not unreadable(record):
            why = f"{record['status']}: {'; '.join(record['reasons']) or 'no reason given'}"
            failed.setdefault(members, {}).setdefault(why, []).append(record["run_id"])
    return {members: "; ".join(f"{runs[0]}{f' and {len(runs) - 1} more' if len(runs) > 1 else ''} {why}"
                               for why, runs in reasons.items())
            for members, reasons in failed.items()}


def taken_out_nodes(records: list[dict]) -> dict[str, str]:
    """The nodes Slurm took out during the batch (down, drained since the plan: a run left out for them, its
    record's `taken_out`), and why, by name. Their links' runs did not run for them: the node fails, not the link."""
    out: dict[str, str] = {}
    for record in records:
        for name, state in (record.get("taken_out") or {}).items():
            reason = f" ({state['reason']})" if state["reason"] else ""
            # idle*: up, but not answering slurmctld's ping for the minute fleetjobs.taken_out waited
            what = ("not answering slurmctld since the plan" if NodeState(name, state["state"]).usable_when_it_answers
                    else "taken out since the plan")
            out.setdefault(name, f"not run: Slurm state {state['state']}{reason} (sinfo), {what}: seen when the "
                                 f"allocation of {link_name(members_of(record))} was asked for")
    return out


def unmeasured(records: list[dict], size: int) -> Failures:
    """The members of `size` nodes (1: nodes, 2: links) whose runs failed or left only unreadable results,
    and why: of a second measurement, what keeps the first pass's verdict."""
    return {members: why for members, why in {**unread_members(records), **failed_members(records)}.items()
            if len(members) == size}
