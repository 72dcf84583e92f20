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
from containerbench.fleetstats import NOT_REPEATED, Failures
from containerbench.validate import figure_name

CONFIRMED = "confirmed"  # slow again when measured again
UNSETTLED = "unsettled"  # measured again without a figure for every slow one: the first pass's verdict stands


@dataclass(frozen=True)
class Settled:
    """What a slow link's second measurement says: `result` NOT_REPEATED, CONFIRMED or UNSETTLED, and why, in
    words for its reason; the ends its ends' pairings blame, each with its reason as a node; whether the link
    itself is to blame (confirmed, both ends within the fleet re-paired)."""

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
    that passed, is no culprit and is the end of no such link: one other than the other end's partner first
    (one partner slow with both ends tells neither), then one not linked to that end in the plan (a pairing
    not yet measured), then the least used. A batch with no such node measures the link again alone."""
    slow = set(links.loc[links["worse"].astype(bool), "member"])
    ambiguous = [pair for pair in map(in_order, fleet.links)
                 if link_name(pair) in slow and pair not in failures and not failed_ends(pair, culprits, node_fault)]
    unsure = {end for pair in ambiguous for end in pair} | set(unreadable_nodes)
    good = [name for name in fleet.nodes if name not in node_fault and name not in culprits and name not in unsure]
    planned, used = {frozenset(pair) for pair in fleet.links}, dict.fromkeys(good, 0)
    members = []
    for pair in ambiguous:
        members.append(link_name(pair))
        taken = None
        for end in pair:  # each pairing is a job of its own, even with the partner the other end has
            partners = sorted(good, key=lambda name: (name == taken, frozenset((end, name)) in planned, used[name]))
            if partners:
                taken = partners[0]
                used[taken] += 1
                members.append(link_name(in_order((end, taken))))
    return list(dict.fromkeys(members))


@dataclass(frozen=True)
class _Pairing:
    """An end of a slow link measured with a node that passed, on the figures the link was slow on: `slow`
    True or False, or None (untold) with why."""

    end: str
    partner: str
    slow: bool | None
    why: str = ""


def settled_links(links: pd.DataFrame, again: pd.DataFrame, node_fault: dict[str, str], failed_again: Failures,
                  remeasured: set[str]) -> dict[str, Settled]:
    """Each slow link measured again (`remeasured`: the links and pairings with records of a second measurement;
    `again`: their figures, judged against the first pass's basis; `failed_again`: why a link's second runs
    failed). Every slow figure measured again and none
    slow: NOT_REPEATED; one slow again: CONFIRMED; a second measurement that failed, or left a slow figure
    without a value: UNSETTLED, the first pass's verdict standing, and why. Whatever the link did, an end slow
    with every node that passed it was re-paired with is to blame, unless such a partner was slow with another
    end too (the common factor); and a link confirmed with both ends within the fleet is the link itself."""
    slow_rows = links[links["bad"]]
    by_link = {link: rows for link, rows in slow_rows.groupby("member", sort=False) if link in remeasured}
    pairings = {link: _pairings(link, set(rows["variable"]), again, remeasured - set(slow_rows["member"]),
                                node_fault, failed_again) for link, rows in by_link.items()}
    slow_with = {}  # partner -> the ends it was slow with
    for each in pairings.values():
        for pairing in each:
            if pairing.slow:
                slow_with.setdefault(pairing.partner, set()).add(pairing.end)
    shared = {partner for partner, ends in slow_with.items() if len(ends) > 1}
    settled = {}
    for link, rows in by_link.items():
        result, said = _link_again(link, rows, again, failed_again)
        blame, told, link_itself = _ends(link, result, pairings[link], shared, slow_with)
        if result == CONFIRMED and not pairings[link]:
            told = ["its ends not re-paired with a node that passed"]
        settled[link] = Settled(result, "; ".join([said, *told]), blame, link_itself)
    return settled


def _link_again(link: str, rows: pd.DataFrame, again: pd.DataFrame, failed_again: Failures) -> tuple[str, str]:
    """What the link's own second measurement says of the figures it was slow on: the result, and in words."""
    pair = tuple(link.split("+"))
    if pair in failed_again:
        return UNSETTLED, f"measured again: {failed_again[pair]}"
    mine = again[again["member"] == link].set_index("variable")
    missing = [figure_name(variable) for variable in rows["variable"] if variable not in mine.index]
    if missing:
        return UNSETTLED, f"measured again: no figure of {', '.join(missing)}"
    seconds = mine.loc[rows["variable"]]
    said = "; ".join(f"{figure_name(variable)} {second['value']:.4g} {second['unit']} "
                     f"({abs(second['deviation_percent']):.0f}% "
                     f"{'above' if second['deviation_percent'] > 0 else 'below'} the first pass's median)"
                     for variable, second in seconds.iterrows())
    if seconds["bad"].any():
        return CONFIRMED, f"measured again later: {said}: confirmed"
    return NOT_REPEATED, f"measured again later: {said}: within the fleet"


def _pairings(link: str, variables: set[str], again: pd.DataFrame, pairings: set[str], node_fault: dict[str, str],
              failed_again: Failures) -> list[_Pairing]:
    """Each end's pairings with nodes that passed (`pairings`: the links measured again that were not slow in the
    first pass, whose other end never passed), on the figures the link was slow on; a pairing with a node that
    failed is none."""
    found = []
    for end in link.split("+"):
        for member in sorted(pairings):
            ends = member.split("+")
            partner = next((name for name in ends if name != end), None)
            if end not in ends or partner in node_fault:
                continue
            figures = again[(again["member"] == member) & again["variable"].isin(variables)]
            if tuple(ends) in failed_again:
                found.append(_Pairing(end, partner, None, failed_again[tuple(ends)]))
            elif figures.empty:
                found.append(_Pairing(end, partner, None, "no figure of "
                                      + ", ".join(sorted(map(figure_name, variables)))))
            else:
                found.append(_Pairing(end, partner, bool(figures["bad"].any())))
    return found


def _ends(link: str, result: str, pairings: list[_Pairing], shared: set[str], slow_with: dict[str, set[str]]
          ) -> tuple[dict[str, str], list[str], bool]:
    """What the pairings tell of the link's ends: the ends to blame (end -> its reason as a node), what they
    say in words, and whether the link itself is to blame (confirmed, every end within the fleet re-paired)."""
    blame, slow, fine, told, untold = {}, [], [], [], []
    for end in link.split("+"):
        mine = [pairing for pairing in pairings if pairing.end == end]
        slow_partners = [pairing.partner for pairing in mine if pairing.slow and pairing.partner not in shared]
        fine_partners = [pairing.partner for pairing in mine if pairing.slow is False]
        unknown = any(pairing.slow is None for pairing in mine)
        if slow_partners and (fine_partners or unknown):  # now slow, now not, or not known: no evidence either way
            within = f", within the fleet with {_names(fine_partners)}" if fine_partners else ""
            told.append(f"{end} slow re-paired with {_names(slow_partners)}{within}: {end} not told")
        elif slow_partners:
            blame[end] = (f"{_SLOW_IN[result].format(link=link)} and re-paired with {_names(slow_partners)}, which "
                          "passed: its own network (its HCA, port or cable)")
            slow.append(f"{end} with {_names(slow_partners)}")
        elif fine_partners:
            fine.append(f"{end} with {_names(fine_partners)}")
        untold += [f"{end} re-paired with {pairing.partner}: {pairing.why}" for pairing in mine if pairing.slow is None]
    told += [f"{partner}, re-paired with {_names(sorted(slow_with[partner]))}, slow with each: the partner they "
             "share is the common factor, which end is not told"
             for partner in dict.fromkeys(pairing.partner for pairing in pairings
                                          if pairing.slow and pairing.partner in shared)]
    link_itself = result == CONFIRMED and len(fine) == 2 and not told and not untold
    repaired = ", ".join([*([f"{_names(slow)} slow too"] if slow else []),
                          *([f"{_names(fine)} within the fleet"] if fine else [])])
    if repaired:
        told.insert(0, f"re-paired, {repaired}" + (": the link itself (a cable, a switch port)" if link_itself else ""))
    return blame, told + untold, link_itself


_SLOW_IN = {CONFIRMED: "slow again in link {link}", UNSETTLED: "slow in link {link}",
            NOT_REPEATED: "slow in link {link} (not when it was measured again)"}


def _names(names) -> str:
    return " and ".join(names)
