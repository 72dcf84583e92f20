"""The second pass for links: a slow link that nothing else explains, measured again with its ends re-paired.

After the suspect nodes were measured again, a slow link whose ends explain nothing (no end slow in all of
its links, none failed on its own evidence) is ambiguous: a cable, either end's HCA or port, or a moment's
noise. Its job runs again, and each end is paired with a node that passed, as Google's Cluster Health Scanner
re-pairs a suspect; the verdict (fleet.judge) reads what came back against the first pass's basis. Only the
ambiguous links and their ends' pairings run again, never the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from containerbench.fleetplan import FleetPlan, in_order, link_name
from containerbench.fleetstats import NOT_REPEATED
from containerbench.validate import figure_name

Failures = dict[tuple[str, ...], str]  # why a node's (one name) or a link's (two) runs failed

CONFIRMED = "confirmed"  # slow again when measured again
UNSETTLED = "unsettled"  # measured again without a figure for every slow one: the first pass's verdict stands


@dataclass(frozen=True)
class Settled:
    """What a slow link's second measurement says: `result` NOT_REPEATED, CONFIRMED or UNSETTLED; the ends to
    blame, each with the partner that passed it was slow with; whether the link itself is to blame (both ends
    within the fleet re-paired); and why, in words for its reason."""

    result: str
    why: str
    blame: dict[str, str] = field(default_factory=dict)
    link_itself: bool = False


def failed_ends(pair: tuple[str, ...], culprits: dict[str, str], node_fault: dict[str, str]) -> list[str]:
    """What explains a slow link: its slow-networked end, else a failed end; none: the link itself."""
    return [end for end in pair if end in culprits] or [end for end in pair if end in node_fault]


def links_to_settle(fleet: FleetPlan, links: pd.DataFrame, failures: Failures, node_fault: dict[str, str],
                    culprits: dict[str, str], unreadable_nodes=()) -> list[str]:
    """Each link slow against the fleet (its `worse` figures: one failing only a site's reference fails as it
    would again) that no end explains, its job having run; then, for each, each of its ends paired with a node
    that passed, is no culprit and is the end of no such link: a partner not linked to that end in the plan
    first (a pairing not yet measured), then the least used. A batch with no such node measures the link
    again alone."""
    slow = set(links.loc[links["worse"].astype(bool), "member"])
    ambiguous = [pair for pair in map(in_order, fleet.links)
                 if link_name(pair) in slow and pair not in failures and not failed_ends(pair, culprits, node_fault)]
    unsure = {end for pair in ambiguous for end in pair} | set(unreadable_nodes)
    good = [name for name in fleet.nodes if name not in node_fault and name not in culprits and name not in unsure]
    planned, used = {frozenset(pair) for pair in fleet.links}, dict.fromkeys(good, 0)
    members = []
    for pair in ambiguous:
        members.append(link_name(pair))
        for end in pair:  # the same partner for both ends where one node passed: each pairing is a job of its own
            partners = sorted(good, key=lambda name: (frozenset((end, name)) in planned, used[name]))
            if partners:
                used[partners[0]] += 1
                members.append(link_name(in_order((end, partners[0]))))
    return list(dict.fromkeys(members))


def settled_links(links: pd.DataFrame, again: pd.DataFrame, node_fault: dict[str, str],
                  failed_again: Failures) -> dict[str, Settled]:
    """Each slow link measured again (`again`: its figures and its ends' pairings', judged against the first
    pass's basis; `failed_again`: why a link's second runs failed). Every slow figure measured again and none
    slow: NOT_REPEATED. One slow again: CONFIRMED; then an end slow with its partner that passed, on such a
    figure, is to blame, and both ends within the fleet: the link itself. A second measurement that failed, or
    left a slow figure unmeasured, settles nothing (UNSETTLED) and says why."""
    settled: dict[str, Settled] = {}
    rows_again = again.set_index(["member", "variable"])
    slow_links = set(links.loc[links["bad"], "member"])
    for link, rows in links[links["bad"]].groupby("member", sort=False):
        pair = tuple(link.split("+"))
        if pair in failed_again:
            settled[link] = Settled(UNSETTLED, f"measured again: {failed_again[pair]}")
            continue
        measured = [(row, rows_again.loc[(link, row["variable"])]) for _, row in rows.iterrows()
                    if (link, row["variable"]) in rows_again.index]
        if not measured:
            continue  # not measured again: recheck off, or not ambiguous when the suspects were named
        if len(measured) < len(rows):
            missing = [figure_name(variable) for variable in rows["variable"]
                       if (link, variable) not in rows_again.index]
            settled[link] = Settled(UNSETTLED, f"measured again: no figure of {', '.join(missing)}")
            continue
        said = "; ".join(f"{figure_name(row['variable'])} {second['value']:.4g} {second['unit']} "
                         f"({abs(second['deviation_percent']):.0f}% "
                         f"{'above' if second['deviation_percent'] > 0 else 'below'} the first pass's median)"
                         for row, second in measured)
        confirmed = {row["variable"] for row, second in measured if second["bad"]}
        if not confirmed:
            settled[link] = Settled(NOT_REPEATED, f"measured again later: {said}: within the fleet")
            continue
        blame, fine, unknown = _repaired(link, again, confirmed, slow_links, node_fault, failed_again)
        partners = set(blame.values())
        if len(blame) == 2 and len(partners) == 1:  # one partner slow with both: it is what they share
            what = (f"re-paired, both ends with {partners.pop()} slow too: the partner they share is the common "
                    "factor, which end is not told")
            blame = {}
        elif blame:
            what = f"re-paired, {_joined(blame.items())} slow too" + (f", {_joined(fine)} within the fleet"
                                                                       if fine else "")
        elif {end for end, _ in fine} == set(pair):
            what = f"re-paired, {_joined(fine)} within the fleet: the link itself (a cable, a switch port)"
        else:
            what = "; ".join(([f"re-paired, {_joined(fine)} within the fleet"] if fine else []) + unknown
                             ) or "no node that passed to re-pair its ends with"
        settled[link] = Settled(CONFIRMED, f"measured again later: {said}: confirmed; {what}", blame,
                                link_itself=not blame and {end for end, _ in fine} == set(pair))
    return settled


def _repaired(link: str, again: pd.DataFrame, confirmed: set[str], slow_links: set[str], node_fault: dict[str, str],
              failed_again: Failures) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    """Each end's pairings with nodes that passed, on the confirmed figures: (end -> the partner it was slow
    with, the (end, partner) pairs within the fleet, the pairings whose runs failed). Another slow link of the
    first pass is no pairing (its other end never passed), nor is a pairing with a node that failed."""
    blame, fine, unknown = {}, [], []
    members = sorted(set(again["member"]) | {link_name(pair) for pair in failed_again})
    for end in link.split("+"):
        for member in members:
            ends = member.split("+")
            partner = next((name for name in ends if name != end), None)
            if end not in ends or member == link or member in slow_links or partner in node_fault:
                continue
            if tuple(ends) in failed_again:
                unknown.append(f"{end} re-paired with {partner}: {failed_again[tuple(ends)]}")
                continue
            figures = again[(again["member"] == member) & again["variable"].isin(confirmed)]
            if figures.empty:
                continue
            if figures["bad"].any():
                blame[end] = partner
            else:
                fine.append((end, partner))
    return blame, fine, unknown


def _joined(pairs) -> str:
    return " and ".join(f"{end} with {partner}" for end, partner in pairs)
