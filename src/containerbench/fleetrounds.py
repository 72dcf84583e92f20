"""The allocations a batch's jobs run in, round by round.

A batch runs in rounds: every node's job, then its links round by round (fleetplan.job_rounds: no node in two
links of a round). A round's jobs share allocations of at most validation.nodes_per_allocation nodes, one
salloc each, and every job of an allocation runs at once, its runs Slurm steps pinned to its own nodes
(launchers.Srun.pinned), as its job's file says (fleetjobs.run_job). With `--no-kill` a node that fails ends
its own job's runs, not the allocation. A round starts once the one before it has ended. So a batch takes
about (1 + rounds) times a job's time, whatever its size up to max_jobs x nodes_per_allocation nodes, and asks
Slurm for about (1 + rounds) times (its nodes / nodes_per_allocation) allocations, not one a job: 1,024 nodes
in 4 rounds of 4.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from containerbench import outputs
from containerbench.fleetjobs import FleetJobs, job_nodes, not_run, record_path, taken_out, why_taken_out
from containerbench.fleetplan import FleetError, FleetPlan, in_order, link_name
from containerbench.processes import die_with_parent, kill_session
from containerbench.slurm import allocation_argv, job_partition_limits, run_allocated

NO_KILL = "--no-kill"  # salloc(1) -k, --no-kill: "Do not automatically terminate a job if one of the nodes it
# has been allocated fails": the other jobs of the allocation run on.


@dataclass(frozen=True)
class Held:
    """One allocation of a round: its name ("nodes-1", "links2-3": the round and its place in it), its round
    (0: the node jobs; k: the k-th round of links), its jobs and all of their nodes."""

    name: str
    round: int
    jobs: tuple[tuple[str, str], ...]
    nodes: tuple[str, ...]

    @property
    def rule(self) -> str:
        """Its rule's name in workflow/rules/fleet.smk: fleet_nodes_1, fleet_links2_3."""
        return "fleet_" + self.name.replace("-", "_")


def round_allocations(fleet: FleetPlan, per_allocation: int) -> list[Held]:
    """Each round's jobs, in order, in allocations of at most `per_allocation` nodes (a job is never split:
    a link's two nodes go together, and an allocation holds one job at least)."""
    rounds = [[("node", node) for node in fleet.nodes]]
    rounds += [[("link", link_name(in_order(pair))) for pair in taken] for taken in fleet.rounds]
    held = []
    for number, jobs in enumerate(rounds):
        label = "nodes" if number == 0 else f"links{number}"
        chunks: list[list[tuple[str, str]]] = []
        size = 0
        for job in jobs:
            nodes = len(job[1].split("+"))
            if not chunks or size + nodes > per_allocation:
                chunks.append([])
                size = 0
            chunks[-1].append(job)
            size += nodes
        held += [Held(f"{label}-{index}", number, tuple(chunk),
                      tuple(node for job in chunk for node in job[1].split("+")))
                 for index, chunk in enumerate(chunks, start=1)]
    return held


class FleetRounds:
    """A plan's jobs (FleetJobs) in their rounds' allocations, as the workflow runs them: one rule an
    allocation, its outputs every file of its jobs, after every allocation of the round before."""

    def __init__(self, jobs: FleetJobs, fleet: FleetPlan):
        self.jobs = jobs
        validation = jobs.config["validation"]
        self.per_allocation, self.at_once = validation["nodes_per_allocation"], validation["max_jobs"]
        self.held = round_allocations(fleet, self.per_allocation)

    def file(self, held: Held) -> str:
        return f"{self.jobs.jobs_dir}/allocation-{held.name}.json"

    def time_limit(self, held: Held) -> int:
        """Its jobs run at once: the longest of theirs."""
        return max(self.jobs.time_limit(job) for job in held.jobs)

    def salloc(self, held: Held) -> list[str]:
        """salloc for the allocation: exactly its jobs' nodes, exclusively, for as long as its longest job, and
        kept when one of its nodes fails."""
        ranks = max(run.ranks_per_node for job in held.jobs for run in self.jobs.job_runs(job))
        name = held.jobs[0][1] if len(held.jobs) == 1 else held.name  # squeue names the node or link it can
        return [*allocation_argv(self.jobs.config["slurm"], len(held.nodes), ranks, self.time_limit(held),
                                 f"containerbench-fleet-{name}", held.nodes, exclusive=True), NO_KILL]

    def outputs(self, held: Held) -> dict[str, list[str]]:
        """Every file its jobs write: their runs' raw logs and records, and the node jobs' hardware reports
        where validation.hardware is on."""
        logs = [log for job in held.jobs for log in self.jobs.logs(job)]
        hardware = [self.jobs.hardware_report(job[1]) for job in held.jobs
                    if job[0] == "node" and self.jobs.hardware_minutes]
        return {"logs": logs, "records": [record_path(log) for log in logs], **({"hardware": hardware} if hardware
                                                                                 else {})}

    def waits_for(self, held: Held) -> list[str]:
        """A raw log of each allocation of the round before (one output names its rule): a round is a barrier,
        so that no node ever has two jobs at once."""
        return [self.outputs(before)["logs"][0] for before in self.held if before.round == held.round - 1]

    def write(self) -> None:
        """Each allocation's file: its salloc and its jobs' files (FleetJobs.write writes those)."""
        for held in self.held:
            outputs.write_text(self.file(held), json.dumps({
                "name": held.name, "allocation": self.salloc(held),
                "jobs": [self.jobs.job_file(job) for job in held.jobs]}, indent=1, sort_keys=True) + "\n")

    def cost_summary(self) -> str:
        """FleetJobs.cost_summary, with what the rounds cost in submissions and in wall time."""
        return self.jobs.cost_summary(self.summary())

    def summary(self) -> list[str]:
        """What the rounds cost in submissions and in wall time."""
        rounds = 1 + max((held.round for held in self.held), default=0)
        wall = sum(math.ceil(len(mine) / self.at_once) * max(map(self.time_limit, mine))
                   for mine in ([held for held in self.held if held.round == number] for number in range(rounds))
                   if mine)
        nodes = f"{self.per_allocation} node{'s' if self.per_allocation > 1 else ''}"
        return [f"  allocations  {len(self.held)} in {rounds} rounds (the node jobs, then the links round by round), "
                f"each of at most {nodes} (validation.nodes_per_allocation) with every job on its own nodes at once, "
                f"at most {self.at_once} at a time (validation.max_jobs)",
                f"  wall time    at most {wall:,} minutes: each round after the one before, every job to its time "
                "limit"]


def check_allocation_size(rounds: FleetRounds, settings: dict, partitions: dict | None) -> None:
    """Refuse, before anything is submitted, an allocation larger than its partition's largest job (MaxNodes,
    sinfo): Slurm would refuse it, and every job in it would fail its nodes."""
    name, limit = job_partition_limits(settings, partitions)
    largest = max((len(held.nodes) for held in rounds.held), default=0)
    if limit and limit.max_job_nodes is not None and largest > limit.max_job_nodes:
        if limit.max_job_nodes < 2 <= largest:  # a link's job is two nodes, whatever the setting
            raise FleetError(f"partition {name!r}'s largest job is {limit.max_job_nodes} node, and a link's job needs "
                             "2; allowed: a partition whose jobs may have two nodes or more ('slurm.partition')")
        raise FleetError(f"'validation.nodes_per_allocation' = {rounds.per_allocation} makes allocations of {largest} "
                         f"nodes, beyond partition {name!r}'s largest job of {limit.max_job_nodes}; allowed: at most "
                         f"{limit.max_job_nodes}")


def run_allocation(allocation_file, in_allocation: bool = False) -> int:
    """An allocation's jobs: asked for from here (salloc), each job's runs in it at once (`fleet run JOB
    --in-allocation` a job), and every record written here after. A job with a node Slurm has taken out since
    the plan (down, drained: sinfo) is left out, and Slurm never waits for that node; its runs, like those of an
    allocation Slurm refuses, are failed records that say why. A job whose own command failed fails the rule
    after the other jobs' records are written: containerbench's fault, never the node's."""
    held = json.loads(Path(allocation_file).read_text())
    jobs = {job_file: json.loads(Path(job_file).read_text()) for job_file in held["jobs"]}
    if in_allocation:  # the jobs left out have their logs already
        return _run_at_once([job_file for job_file, job in jobs.items() if not Path(job["logs"][0]).exists()])
    left_out = taken_out(jobs)
    for job_file, nodes_out in left_out.items():
        not_run(jobs[job_file], why_taken_out(nodes_out), nodes_out)
    returncode, refused = 0, None
    if wanted := [job_file for job_file in jobs if job_file not in left_out]:
        nodes = [node for job_file in wanted for node in job_nodes(jobs[job_file])]
        inner = [sys.executable, "-m", "containerbench", "fleet", "run", str(allocation_file), "--in-allocation"]
        returncode, refused = run_allocated(_for_nodes(held["allocation"], nodes), inner)
    from containerbench.records import write_record

    for job in jobs.values():
        if refused:
            not_run(job, refused)
        for log in job["logs"]:
            if Path(log).exists():
                write_record(log, record_path(log))
    if returncode and not refused:  # a job's own command failed: the rule fails, and says so
        print(f"containerbench: fleet: allocation {held['name']}: a job's command ended with exit {returncode} (its "
              "output above); the runs it left without a log are not judged", file=sys.stderr)
        return returncode
    return 0


def _for_nodes(salloc: list[str], nodes: list[str]) -> list[str]:
    """salloc's argv for exactly these nodes."""
    return [f"--nodes={len(nodes)}" if word.startswith("--nodes=") else
            f"--nodelist={','.join(nodes)}" if word.startswith("--nodelist=") else word for word in salloc]


def _run_at_once(job_files: list[str]) -> int:
    """Inside the allocation: every job's `fleet run JOB --in-allocation` at once, each line of its output
    prefixed with its job; all of them stopped if this one is."""
    # Each job in a session of its own, SIGTERMed when this process dies however it dies (salloc's end, a
    # SIGKILL): its runs are stopped by the same means, so that no job outlives the allocation.
    started = [subprocess.Popen([sys.executable, "-m", "containerbench", "fleet", "run", job_file, "--in-allocation"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True, preexec_fn=die_with_parent())  # noqa: PLW1509 (prctl only)
               for job_file in job_files]
    lock = threading.Lock()

    def relay(process, name: str) -> None:
        for line in process.stdout:
            with lock:
                sys.stdout.write(f"{name}: {line}")
                sys.stdout.flush()

    relays = [threading.Thread(target=relay, args=(process, Path(job_file).stem), daemon=True)
              for process, job_file in zip(started, job_files)]
    for thread in relays:
        thread.start()
    try:
        codes = [process.wait() for process in started]
    except BaseException:  # Ctrl-C, a timeout's exception
        for process in started:
            kill_session(process.pid)
        raise
    for thread in relays:
        thread.join(timeout=10)
    return max(codes, key=abs, default=0)  # a job killed by a signal is < 0
