"""The node and link jobs of a fleet validation: each job's runs, its allocation and its file.

A plan's nodes and links (fleetplan.plan_batch) become jobs as workflow/rules/fleet.smk runs
them: a node's job is its single-node runs, a link's its two-node runs; each holds
its nodes exclusively for as long as its runs may take, and waits for the jobs
before it on its nodes (fleetplan.job_rounds). `run_job` runs a job's file.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from containerbench import outputs
from containerbench.config import ImageUse, RunSpec, mpi_models
from containerbench.cost import expected_each
from containerbench.fabrics import measured_fabrics, named_hcas, rail_fabric
from containerbench.fleetplan import FleetError, FleetPlan, in_order, is_link, link_name
from containerbench.hardware import TOOLS, report_line, report_path, write_step_report
from containerbench.launchers import Allocation, Srun
from containerbench.plans import node_archive, plan_run
from containerbench.processes import run_group
from containerbench.runtimes import runtime_for
from containerbench.slurm import (
    ALLOCATION_SLACK_MINUTES,
    NodeState,
    QueryError,
    allocation_argv,
    job_partition_limits,
    job_state,
    node_states,
)

# A run's deadline where earlier records tell its expected time: at least this much beyond it, whatever the
# factor (a new node's first start reads every package from a cold shared file system).
DEADLINE_MARGIN_S = 300


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


def recheck_runs(config: dict, node: str) -> list[RunSpec]:
    """A suspect node's second measurement (fleet.suspects): its job's runs again, as the repetitions after
    the first pass's, so that every run keeps an id, a raw log and a record of its own."""
    first = config["validation"]["repetitions"]
    return [replace(spec, repetition=spec.repetition + first) for spec in node_runs(config, node)]


def relink_runs(config: dict, pair: tuple[str, str]) -> list[RunSpec]:
    """A slow link's second measurement, or a re-pairing of one of its ends with a node that passed
    (fleet.links_to_settle): a link's job, as the repetitions after the first pass's."""
    first = config["validation"]["repetitions"]
    return [replace(spec, repetition=spec.repetition + first) for spec in link_runs(config, pair)]


def link_runs(config: dict, pair: tuple[str, str]) -> list[RunSpec]:
    """A link's job, per repetition: the two-node netbench (one rank a node) over every fabric of the
    config, then over each of its rails alone (FABRIC.RAIL: one degraded rail of four hides in what they
    carry together), and with validation.link_training a two-node training run, in the config's first runtime."""
    bench, runtime = config["benchmark"], config["runtimes"][0]
    model = mpi_models(config, runtime)[0]
    fabrics = measured_fabrics(config)
    runs = []
    for repetition in range(1, config["validation"]["repetitions"] + 1):
        runs += [RunSpec("netbench", runtime, fabric, 2, 1, repetition, mpi_model=model, nodelist=tuple(pair))
                 for fabric in fabrics]
        if config["validation"]["link_training"]:
            runs.append(RunSpec("train", runtime, next(iter(config["fabrics"])), 2,
                                max(config["scaling"]["ranks_per_node"]), repetition, bench["batch_sizes"][0],
                                bench["modes"][0], bench["data"][0], model, tuple(pair)))
    return runs


# The ports perfquery may read where no rail is named (ibstat lists them all): four dual-port HCAs; and on
# an HCA named without its port (every port of it, hardware.is_rail): a dual-port card's two.
UNNAMED_PORTS, PORTS_OF_AN_HCA = 8, 2


def hardware_minutes(config: dict) -> int:
    """The longest a node's hardware step may take, in minutes: each tool's timeout (perfquery's once a port
    of the rails: HCA:PORT one, an HCA PORTS_OF_AN_HCA, UNNAMED_PORTS where none is named), and a minute for
    srun and Python to start. Part of the node job's time limit."""
    rails = config["validation"]["hardware"]["ib_devices"] or named_hcas(config)
    ports = sum(1 if ":" in rail else PORTS_OF_AN_HCA for rail in rails) if rails else UNNAMED_PORTS
    tools = len(TOOLS) - 1 + ports
    return math.ceil((config["validation"]["hardware"]["timeout_s"] * tools + 60) / 60)


def hardware_step(config: dict, out_dir: str, node: str, python: str = sys.executable) -> dict | None:
    """The hardware tier a node's job runs first, on its node (check_hardware): `fleet hwcheck` as one task,
    a step of the job's allocation with the GPUs it asked for (a step sees only its GRES, through Slurm's
    device cgroup), ended by Slurm at its bound, with what the site expects of the node (validation.hardware;
    the rails: those the fabrics name exactly, fabrics.named_hcas, where it names none). None where it is off."""
    settings, gpus_per_node = config["validation"]["hardware"], config["slurm"]["gpus_per_node"]
    if not settings["enabled"]:
        return None
    gpus, rails = settings["gpus"] or gpus_per_node, settings["ib_devices"] or named_hcas(config)
    options = [*(["--gpus", str(gpus)] if gpus else []), *(["--nvlink"] if settings["nvlink"] else []),
               *(["--ib-rate", f"{settings['ib_rate']:g}"] if settings["ib_rate"] else []),
               *(["--ib-devices", ",".join(rails)] if rails else []), "--timeout-s", f"{settings['timeout_s']:g}"]
    minutes = hardware_minutes(config)
    srun = Srun(gpus_per_node=gpus_per_node)
    argv = srun.node_step([python, "-m", "containerbench", "fleet", "hwcheck", "--out", out_dir, *options],
                          1, [f"--nodelist={node}", *srun.gres, f"--time={minutes}"])
    return {"argv": argv, "node": node, "report": report_path(out_dir, node), "minutes": minutes}


def check_hardware(step: dict) -> None:
    """A node job's hardware step (hardware_step), run in its allocation before its runs. Where hwcheck
    could not run or answer there, its report says so itself: a failed check (a node that cannot start one
    step of a minute is not passed in silence), or a skipped one where Slurm ended the allocation meanwhile
    (the runs' records then carry Slurm's state)."""
    limit = step["minutes"] * 60 + 120  # past srun's own --time (hardware_minutes), which Slurm enforces
    try:
        done = run_group(step["argv"], timeout=limit, stdin=subprocess.DEVNULL)
        output = done.stdout + done.stderr
        print(output, end="", flush=True)
        # hwcheck's last line names the report it wrote: on a shared file system whose client cached the
        # report's absence (NFS), that line is the evidence, not a stat from here.
        if done.returncode in (0, 1) and report_line(Path(step["report"])) in output.splitlines():
            return
        why = f"exited with {done.returncode} and wrote no report: " + (
            output.strip().splitlines() or ["no output"])[-1]
    except subprocess.TimeoutExpired:
        why = f"did not end in {limit:g} s"
    if Path(step["report"]).exists():
        return
    ended = job_state(os.environ["SLURM_JOB_ID"], wait_s=5) if os.environ.get("SLURM_JOB_ID") else None
    if ended:
        why = f"not run to its end: Slurm job {ended['job']} {ended['state']} (sacct) while it ran"
    print(f"containerbench: {step['node']}: hardware step {why}", flush=True)
    write_step_report(step["report"], step["node"], "skipped" if ended else "fail", why)


def run_timeout_s(config: dict, run: RunSpec) -> float:
    """A run's own timeout as the config sets it (its kind's timeout_s)."""
    return float(config["netbench" if run.kind == "netbench" else "benchmark"]["timeout_s"])


def allocation_minutes(config: dict, runs: list[RunSpec], seconds: list[float] | None = None) -> int:
    """How long a node's or link's job may hold its nodes: its runs' `seconds` (default: their timeouts),
    each with the slack a failed run may spend asking sacct."""
    total = sum(run_timeout_s(config, run) for run in runs) if seconds is None else sum(seconds)
    return -(-math.ceil(total) // 60) + ALLOCATION_SLACK_MINUTES * len(runs)


def check_time_limit(jobs: FleetJobs, settings: dict, partitions: dict | None) -> None:
    """Refuse, before anything is submitted, a job longer than its partition's MaxTime (sinfo)."""
    name, limit = job_partition_limits(settings, partitions)
    member, minutes = jobs.longest()
    if limit and limit.max_minutes is not None and minutes > limit.max_minutes:
        if ("node" if "+" not in member else "link") in jobs.expected_s:
            basis, allowed = ("'validation.time_limit_factor' times its runs' expected time", "a smaller factor")
        else:  # no record tells how long the runs take: `snakemake calibrate` makes those records
            basis, allowed = ("its runs' timeouts, 'benchmark.timeout_s' and 'netbench.timeout_s'",
                              "shorter timeouts, or `snakemake calibrate` first, so that each job asks for its runs' "
                              "expected time")
        raise FleetError(f"the job of {member} may take {minutes} minutes ({basis}, and 'validation.repetitions'), "
                         f"beyond partition {name!r}'s time limit of {limit.max_minutes}; allowed: {allowed}, or "
                         "fewer repetitions")


class FleetJobs:
    """The node and link jobs of a plan as the workflow runs them (workflow/rules/fleet.smk): each
    job's runs and raw logs, its plans, its allocation, and the jobs it waits for."""

    def __init__(self, config: dict, fleet: FleetPlan, directory: str, records=(), source: str = "",
                 artifacts: dict | None = None):
        """`records`: run records of earlier runs (sweeps, calibrations, batches) and `source`, where they
        came from; each job's time limit comes from the runs of the same benchmarks among them. `artifacts`:
        the built images' files (config.ImageUse -> file, Sweep.artifacts), which the runs' plans name."""
        self.config, self.directory, self.source = config, directory, source
        self.artifacts = dict(artifacts or {})
        # Fleet runs are judged by their figures; their telemetry is not collected (no rule declares it).
        self.run_config = {**config, "telemetry": {**config["telemetry"], "enabled": False}}
        self.runs = {("node", node): node_runs(config, node) for node in fleet.nodes} | {
            ("link", link_name(in_order(pair))): link_runs(config, in_order(pair)) for pair in fleet.links}
        self.expected_s = self._expected_seconds(list(records))
        # Each node's first pass runs its hardware step first: its bound in minutes (0 where validation.hardware
        # is off).
        self.hardware_minutes = hardware_minutes(config) if config["validation"]["hardware"]["enabled"] else 0

    def _expected_seconds(self, records: list[dict]) -> dict[str, list[float]]:
        """Job kind -> each of its runs' expected seconds, where earlier ok runs of their benchmarks on as
        many nodes, over the same fabric, tell them all (cost.expected_each): the jobs of a kind run the same
        runs on other nodes. A run on more nodes than any record is not guessed at: its traffic is not known."""
        expected = {}
        for kind in ("node", "link"):
            job = next((job for job in self.runs if job[0] == kind), None)
            if job is None or not records:
                continue
            # A rail's run is timed by its fabric's records: a sweep measures fabrics, not rails one by one.
            plans = [self.plan(replace(spec, fabric=rail_fabric(spec.fabric))) for spec in self.runs[job]]
            seconds = [each[0] for each in expected_each(plans, records, same_shape=True)]
            if all(each is not None for each in seconds):
                expected[kind] = seconds
        return expected

    def job_runs(self, job: tuple[str, str]) -> list[RunSpec]:
        """A job's runs: a planned node's or link's, or a suspect's second measurement (made only when asked): a
        node's, or a link's (NODE+NODE, a slow link or a re-pairing of its end)."""
        if job[0] != "recheck":
            return self.runs[job]
        return relink_runs(self.config, in_order(job[1].split("+"))) if is_link(job[1]) else recheck_runs(
            self.config, job[1])

    @staticmethod
    def kind(job: tuple[str, str]) -> str:
        """"node" or "link": what a job measures, a second measurement too (its runs are timed as the kind's)."""
        return "link" if is_link(job[1]) else "node"

    def deadlines(self, job: tuple[str, str]) -> list[float]:
        """Each run's own timeout in a job: validation.time_limit_factor times its expected time, at least
        DEADLINE_MARGIN_S beyond it, and never over its kind's timeout_s, which it keeps where no earlier
        record tells. A run over its deadline ends with its own reason and the job's next runs still run."""
        timeouts = [run_timeout_s(self.config, run) for run in self.job_runs(job)]
        expected = self.expected_s.get(self.kind(job))
        if expected is None:
            return timeouts
        factor = self.config["validation"]["time_limit_factor"]
        return [min(timeout, max(factor * seconds, seconds + DEADLINE_MARGIN_S))
                for timeout, seconds in zip(timeouts, expected)]

    def time_limit(self, job: tuple[str, str]) -> int:
        """The minutes a job asks Slurm for: its runs' deadlines, with ALLOCATION_SLACK_MINUTES a run for sacct
        after a failure (allocation_minutes where no record tells), and a node's hardware step's bound. A limit
        near what the job takes is what lets Slurm's backfill start it in the gaps between other jobs."""
        step = self.hardware_minutes if job[0] == "node" else 0
        return allocation_minutes(self.config, self.job_runs(job), self.deadlines(job)) + step

    def logs(self, job: tuple[str, str]) -> list[str]:
        """Its runs' raw logs: a suspect's second measurement apart from the first pass's (`fleet judge
        --recheck`), so that runs/*.json stays the first pass whole."""
        where = "recheck" if job[0] == "recheck" else "runs"
        return [f"{self.directory}/{where}/{spec.run_id}.log" for spec in self.job_runs(job)]

    @property
    def jobs_dir(self) -> str:
        return f"{self.directory}/jobs"

    def job_file(self, job: tuple[str, str]) -> str:
        return f"{self.jobs_dir}/{job[0]}-{job[1]}.json"

    def allocation(self, job: tuple[str, str]) -> list[str]:
        """salloc for the job: exactly its nodes, exclusively, for as long as its runs may take."""
        nodes = tuple(job[1].split("+"))
        runs = self.job_runs(job)
        return allocation_argv(self.config["slurm"], len(nodes), max(run.ranks_per_node for run in runs),
                               self.time_limit(job), f"containerbench-fleet-{job[1]}", nodes, exclusive=True)

    def longest(self) -> tuple[str, int]:
        """The job that may hold its nodes longest, and for how many minutes (checked against MaxTime)."""
        job = max(self.runs, key=self.time_limit)
        return job[1], self.time_limit(job)

    def cost_summary(self, allocations=()) -> str:
        """What the batch may cost, as the sweep's estimate says it: its jobs (and the `allocations` they run in,
        fleetrounds), the node-hours if every job held its nodes to its time limit, and what its runs are expected
        to take where records tell."""
        minutes = {job: self.time_limit(job) for job in self.runs}
        nodes = {job: 1 if job[0] == "node" else 2 for job in self.runs}
        kinds = {kind: [job for job in self.runs if job[0] == kind] for kind in ("node", "link")}
        longest = {kind: max((minutes[job] for job in jobs), default=0) for kind, jobs in kinds.items()}
        node_hours = sum(nodes[job] * minutes[job] for job in self.runs) / 60
        validation = self.config["validation"]
        timeouts = (f"benchmark.timeout_s = {self.config['benchmark']['timeout_s']} s, "
                    f"netbench.timeout_s = {self.config['netbench']['timeout_s']} s")
        lines = [
            "What validating the batch costs:",
            f"  jobs         {len(kinds['node'])} node jobs and {len(kinds['link'])} link jobs, each holding its "
            "nodes exclusively",
            *allocations,
            f"  runs         {sum(map(len, self.runs.values()))}: each job's runs, "
            f"validation.repetitions = {validation['repetitions']}",
        ]
        limits = []
        for kind in ("node", "link"):
            if not kinds[kind]:
                continue
            if kind in self.expected_s:
                limits.append(f"{kind} jobs {longest[kind]} minutes: each run {validation['time_limit_factor']:g} x "
                              f"its expected time (validation.time_limit_factor), at least {DEADLINE_MARGIN_S // 60} "
                              f"minutes more; the runs' expected {sum(self.expected_s[kind]) / 60:.1f} in all, "
                              f"+ {ALLOCATION_SLACK_MINUTES} a run")
            else:
                limits.append(f"{kind} jobs {longest[kind]} minutes: the runs' timeouts, {timeouts}, as no earlier "
                              "ok run of their benchmarks on as many nodes tells how long they take (the calibrate "
                              "target makes them)")
        if kinds["node"] and self.hardware_minutes:
            limits[0] += f"; and the hardware step's {self.hardware_minutes} (validation.hardware.timeout_s a tool)"
        lines.append(f"  worst case   {node_hours:,.0f} node-hours: every job to its time limit")
        lines += [f"  time limit   {limit}" for limit in limits]
        if all(kind in self.expected_s for kind, jobs in kinds.items() if jobs):
            expected = sum(nodes[job] * sum(self.expected_s[job[0]]) for job in self.runs) / 3600
            lines.append(f"  expected     {expected:,.1f} node-hours, from {self.source or 'earlier records'}")
        return "\n".join(lines)

    @property
    def records_list(self) -> str:
        """The file listing every record of the batch, for `fleet judge @FILE` and `store @FILE`."""
        return f"{self.directory}/records.txt"

    def write(self, fleet: FleetPlan, plan_path) -> None:
        """The plan, for the verdict; the list of the records to come; and each job's file: its allocation,
        its runs' plans and their raw logs. Files, not arguments: a node's plans can pass the 128 KiB one
        argument may hold, and a thousand nodes' record paths the 2 MiB of a whole command line."""
        for path in (Path(plan_path), Path(self.records_list)):
            path.parent.mkdir(parents=True, exist_ok=True)
        outputs.write_text(plan_path, json.dumps(fleet.as_dict(), indent=1, sort_keys=True) + "\n")
        outputs.write_text(self.records_list, "".join(f"{path}\n" for path in self.records()))
        outputs.write_text(self.hardware_list, "".join(f"{path}\n" for path in self.hardware_reports()))
        for job in self.runs:
            self.write_job(job, self.job_file(job))

    def write_job(self, job: tuple[str, str], path) -> None:
        """One job's file: its allocation, its runs' plans (each with its deadline) and their raw logs; a node's
        first pass, its hardware step too."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        plans = [replace(self.plan(spec), timeout_s=deadline).as_dict()
                 for spec, deadline in zip(self.job_runs(job), self.deadlines(job))]
        steps = {}
        if job[0] == "node" and (step := hardware_step(self.config, self.hardware_dir, job[1])):
            steps["hardware"] = step
        outputs.write_text(path, json.dumps({"allocation": self.allocation(job), "plans": plans,
                                             "logs": self.logs(job), **steps}, sort_keys=True) + "\n")

    @property
    def hardware_dir(self) -> str:
        return f"{self.directory}/hardware"

    def hardware_report(self, node: str) -> str:
        """Where a node's hardware report is: `fleet hwcheck` names it by SLURMD_NODENAME, the plan's name."""
        return report_path(self.hardware_dir, node)

    @property
    def hardware_list(self) -> str:
        """The file listing every node's hardware report, for `fleet judge --hardware @FILE` (empty where off)."""
        return f"{self.directory}/hardware.txt"

    def hardware_reports(self) -> list[str]:
        """Every node's, where validation.hardware is on (`fleet judge --hardware`)."""
        return [self.hardware_report(job[1]) for job in self.runs if job[0] == "node" and self.hardware_minutes]

    def records(self) -> list[str]:
        return [record_path(log) for job in self.runs for log in self.logs(job)]

    def recheck_records(self, members) -> list[str]:
        """The records of the suspects' second measurements: nodes' and links' (fleet.suspects)."""
        return [record_path(log) for member in members for log in self.logs(("recheck", member))]

    def plan(self, spec: RunSpec):
        """A run's plan in its job's allocation, naming the built image's file where it runs one."""
        return plan_run(spec, self.run_config, Allocation.PER_JOB, self.artifacts.get(ImageUse.of(spec)))

    def images(self) -> list[str]:
        """The built images the runs need, and the archives their nodes load them from (plans.node_archive)."""
        needed = set()
        for spec in {spec for runs in self.runs.values() for spec in runs}:
            if (artifact := self.artifacts.get(ImageUse.of(spec))) is None:
                continue
            runtime = runtime_for(spec.runtime, self.config, spec.mpi_model, spec.framework)
            needed |= {artifact, *filter(None, [node_archive(runtime, artifact, self.config)])}
        return sorted(needed)


def run_job(job_file, in_allocation: bool = False) -> int:
    """A node's or link's job (the file FleetJobs.write made): its allocation asked from here, its runs
    run in it one after another (execution.run_plans), from outside it. A job with a node Slurm has taken out
    since the plan is not submitted (salloc would wait for that node): its runs are failed records that say so."""
    from containerbench.execution import run_plans
    from containerbench.plans import RunPlan
    from containerbench.records import write_record

    job = json.loads(Path(job_file).read_text())
    if not in_allocation and (nodes_out := taken_out({job_file: job}).get(job_file)):
        not_run(job, why_taken_out(nodes_out), nodes_out)
    else:
        plans = [RunPlan.from_json(run_plan) for run_plan in job["plans"]]
        if job.get("hardware") and in_allocation:  # before anything is timed (issue 33: SuperBench's, NHC's tier)
            check_hardware(job["hardware"])
        returncode = run_plans(plans, job["logs"], Allocation.PER_JOB, ["fleet", "run", str(job_file)],
                               salloc=job["allocation"], inside=in_allocation, on_refused=lambda why: not_run(job, why))
        if returncode != 0 or in_allocation:
            return returncode
    # Each raw log parsed here: a parse job per run would be most of a large batch's DAG.
    for log in job["logs"]:
        write_record(log, record_path(log))
    return 0


def job_nodes(job: dict) -> list[str]:
    """The nodes of a job's file, in its runs' order."""
    return list(dict.fromkeys(node for run_plan in job["plans"] for node in run_plan["spec"]["nodelist"]))


# A node that does not answer slurmctld's ping for a moment ("idle*": a busy slurmd) is waited for this long
# before its jobs are left out; Slurm sets it DOWN itself after SlurmdTimeout (300 s by default).
NOT_RESPONDING_WAIT_S, NOT_RESPONDING_POLL_S = 60.0, 10.0


def taken_out(jobs: dict[str, dict]) -> dict[str, dict[str, NodeState]]:
    """The jobs (files) with a node Slurm has taken out since the plan (sinfo: down, drained), and those nodes'
    states; none where sinfo cannot answer (salloc then says what it cannot give)."""
    nodes = list(dict.fromkeys(node for job in jobs.values() for node in job_nodes(job)))
    deadline = time.monotonic() + NOT_RESPONDING_WAIT_S
    while True:
        try:
            states = node_states(nodes)
        except QueryError:
            return {}
        out = {name: state for name, state in states.items() if not state.available}
        only_silent = all(state.usable_when_it_answers for state in out.values())
        if not out or not only_silent or time.monotonic() >= deadline:
            break
        time.sleep(NOT_RESPONDING_POLL_S)
    return {job_file: {name: out[name] for name in job_nodes(job) if name in out}
            for job_file, job in jobs.items() if set(job_nodes(job)) & set(out)}


def why_taken_out(nodes_out: dict[str, NodeState]) -> str:
    return "; ".join(f"node {name} {state.state}{f' ({state.reason})' if state.reason else ''} (sinfo) when its "
                     "allocation was asked for" for name, state in nodes_out.items())


def not_run(job: dict, why: str, nodes_out: dict[str, NodeState] | None = None) -> None:
    """Each of the job's runs without a log says why in one (a failed record that names its node, and the nodes
    Slurm had taken out, `nodes_out`, for the verdict to fail those nodes rather than a link), and so does its
    node's hardware report."""
    from containerbench.execution import write_not_run
    from containerbench.plans import RunPlan

    taken = {"taken_out": {name: {"state": state.state, "reason": state.reason}
                           for name, state in nodes_out.items()}} if nodes_out else {}
    for run_plan, log in zip(job["plans"], job["logs"]):
        if not Path(log).exists():
            write_not_run(RunPlan.from_json(run_plan), log, {"not_run": why, **taken})
    if (step := job.get("hardware")) and not Path(step["report"]).exists():
        write_step_report(step["report"], step["node"], "skipped", f"not run: {why}")


def record_path(log: str) -> str:
    return log.removesuffix(".log") + ".json"
