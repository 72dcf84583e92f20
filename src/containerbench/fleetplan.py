"""The plan of a batch of new nodes to validate: which nodes are measured, which links pair them, and in
which rounds their jobs run so that no node has two at once.

The nodes come from a Slurm hostlist or a partition, with Slurm's state of each: a node that is down or
drained is reported, not waited for. Links are a ring (each node with its neighbours) and chords (each
node with the one half-way round), which put every node of four or more in three links or more. A plan
saved as plan.json (`fleet plan --write`, validate_nodes) is read back whole or refused in one line.

The verdict on what the plan measured is fleet's; the jobs that measure it, fleetjobs'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from containerbench.slurm import NodeState, QueryError, expand_hostlist, node_states, partition_states


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
    """The links in rounds in which no node is in two jobs, the order that keeps a node to one job at a time:
    a greedy edge colouring, the fewest rounds of a few orders of the pairs. Each round costs a job's time
    (fleetrounds), and the ring-then-chords order leaves an odd batch two rounds of one link each (5), which
    its chords first colour in 4; an even batch takes 3."""
    count = len(pairs)
    orders = [pairs, pairs[::-1], *(pairs[offset:] + pairs[:offset] for offset in (count // 3, -(-2 * count // 3)))]
    return min((_greedy_rounds(order) for order in orders), key=len)


def _greedy_rounds(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
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
        plan = cls(list(data["nodes"]),
                   {name: NodeState(name, state["state"], state["reason"])
                    for name, state in data["unavailable"].items()},
                   [tuple(pair) for pair in data["links"]],
                   [[tuple(pair) for pair in taken] for taken in data["rounds"]])
        plan.check()
        return plan

    def check(self) -> None:
        """ValueError, one line, for a plan no planning makes (one edited by hand): a node named twice or
        by a name that is not a hostname, a link that is not two of its nodes, rounds that are not its
        links with no node twice in a round."""
        for name in [*self.nodes, *self.unavailable]:
            check_node_name(name, "the plan")
        for names, what in ((self.nodes, "nodes"), ([*self.nodes, *self.unavailable], "nodes and unavailable")):
            if len(set(names)) != len(names):
                twice = next(name for name in names if names.count(name) > 1)
                raise ValueError(f"node {twice!r} is in {what} twice")
        measured = set(self.nodes)
        for pair in self.links:
            if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= measured:
                raise ValueError(f"link {list(pair)} is not two different nodes of its 'nodes'")
        if len({frozenset(pair) for pair in self.links}) != len(self.links):
            raise ValueError("a link is in 'links' twice")
        scheduled = [pair for taken in self.rounds for pair in taken]
        if sorted(map(in_order, scheduled)) != sorted(map(in_order, self.links)):
            raise ValueError("its 'rounds' do not hold each of its 'links' once")
        for taken in self.rounds:
            if not taken:  # a round is a barrier (fleetrounds): an empty one would let the next start early
                raise ValueError("its 'rounds' hold an empty round")
            members = [node for pair in taken for node in pair]
            if len(members) != len(set(members)):
                raise ValueError(f"a round gives a node two jobs at once: {[list(pair) for pair in taken]}")

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
        return node_states(expand_hostlist(nodes, via), via, expression=nodes)
    states = partition_states(partition, via)
    return {name: states[name] for name in in_order(states)}


def planned(validation: dict, via: tuple[str, ...] = ()) -> FleetPlan:
    """The validation section's plan: a saved one (validation.plan: a resumed validation keeps its nodes
    and links while their states change), else the nodes and links of its selection, from Slurm."""
    if validation["plan"] and (validation["nodes"] or validation["partition"]):
        raise FleetError("give one of 'validation.nodes', 'validation.partition' and 'validation.plan'; got "
                         "'validation.plan' with "
                         + ("'validation.nodes'" if validation["nodes"] else "'validation.partition'"))
    if validation["plan"]:
        return FleetPlan.load(validation["plan"], "'validation.plan'")
    return plan_batch(select(validation["nodes"], validation["partition"], via))


def format_plan(fleet: FleetPlan) -> str:
    lines = [f"{len(fleet.nodes)} node(s) to measure, {len(fleet.links)} link(s) in {len(fleet.rounds)} round(s): "
             f"{fleet.jobs} jobs"]
    lines += [f"  not run: {name}: Slurm state {state.state}" + (f" ({state.reason})" if state.reason else "")
              for name, state in fleet.unavailable.items()]
    lines += [f"  round {number}: {' '.join(link_name(pair) for pair in taken)}"
              for number, taken in enumerate(fleet.rounds, 1)]
    return "\n".join(lines)


# A node's name goes into file names, Snakemake wildcards, a link's name (joined by '+') and the drain
# list's scontrol lines: hostname characters only (RFC 952/1123 labels, dots, and '_', which Slurm allows).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NODE_NAME_ALLOWED = "letters, digits, '.', '_' and '-', starting with a letter or digit"


def check_node_name(name: str, where: str) -> None:
    if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
        raise FleetError(f"{where} names node {name!r}; allowed: {NODE_NAME_ALLOWED}")


def plan_batch(states: dict[str, NodeState]) -> FleetPlan:
    for name in states:
        check_node_name(name, "Slurm")
    nodes = [name for name, state in states.items() if state.available]
    links = link_pairings(nodes)
    return FleetPlan(nodes, {name: state for name, state in states.items() if not state.available}, links,
                     job_rounds(links))


def in_order(hosts) -> tuple[str, ...]:
    """Host names in natural order (n9 before n10), each once: a link's one spelling."""
    return tuple(sorted(set(hosts), key=lambda name: [int(part) if part.isdigit() else part
                                                        for part in re.split(r"(\d+)", name)]))


def is_link(member: str) -> bool:
    """A link's name (link_name), not a node's."""
    return "+" in member


def link_name(hosts: tuple[str, ...]) -> str:
    """A node's own name, or a link's two names joined by '+': no hostname holds it (they may hold '-'),
    and it needs no quoting in a file name, a shell or a Snakemake job's wildcards."""
    return "+".join(hosts)
