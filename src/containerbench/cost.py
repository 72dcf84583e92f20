"""What a sweep costs, worked out before anything is submitted (`containerbench plan --estimate`, and
the workflow before it submits): its jobs, node allocations, worst-case node-hours and, from the records
of earlier runs, expected node-hours. Each run holds `nodes` nodes for as long as it runs.

A run's expected wall time comes from the last ok run at its own point; failing that, from the nearest
ok run of the same benchmark at another point (another runtime, fabric or node count: its start-up and
its step time). The calibration runs (`calibration_runs`, the workflow's `calibrate` target) give every
benchmark of a sweep such a run, one short run each on the fewest nodes, before the sweep is submitted.
"""

from __future__ import annotations

import copy
import glob
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from containerbench import config as cb_config
from containerbench import outputs
from containerbench.config import ImageUse, RunSpec
from containerbench.fabrics import keeps_shared_memory
from containerbench.frameworks import FRAMEWORKS
from containerbench.launchers import uses_slurm
from containerbench.plans import RunPlan, Sweep, benchmark_args_in, plan_run
from containerbench.point import MPI_MODELS, Point
from containerbench.records import load_records
from containerbench.runtimes import BareMetal, runtime_for
from containerbench.status import Status

# The benchmark's step counts: the same sweep point with other counts still gives its step time.
STEP_FLAGS = ("--warmup-steps", "--steps", "--probe-steps")
# What does not make a run another sweep point: how many steps it takes (its repetition is not in its point id).
NOT_THE_POINT = {"warmup_steps", "steps"}
# What a run's cost depends on that its point id does not name: the benchmark's settings, the site, the
# launcher, the MPI model as the runtime ran it (the spec's, which the runtime decides) and the ranks.
BEYOND_THE_POINT_ID = (*dict.fromkeys(key for each in FRAMEWORKS.values() for key in each.planned_settings
                                      if key not in NOT_THE_POINT), "system", "launcher", "mpi_model", "ranks")
# Benchmark flags that say where a run writes, not what it measures (the path holds the run id).
NOT_THE_POINT_FLAGS = ("--telemetry-dir", "--telemetry-interval", "--telemetry-services")
# What a run of the same benchmark at another point may differ in: its runtime (which the harness is told),
# and, for the network benchmark, whether ranks 0 and 1 also ping-pong (only up to two nodes).
NOT_THE_BENCHMARK_FLAGS = {"--runtime": 1, "--no-pingpong": 0}
# The calibration runs: repetition 0, before any of the sweep's, with at most this many measured steps.
CALIBRATION_REPETITION = 0
CALIBRATION_STEPS = 5
CALIBRATION_DIR = "calibration"  # under results_dir: records no table reads


@dataclass(frozen=True)
class Estimate:
    """What a sweep costs. Node-hours are nodes held x hours held, summed over the runs."""

    jobs: dict[str, int]  # measurement jobs by kind (train, netbench): one per run
    local_jobs: int  # a parse per run, tables, report: the workflow's own node, no allocation
    node_jobs: int  # one-node jobs besides the runs: the pre-flight check, image conversions on the nodes
    allocations: dict[int, int]  # nodes of an allocation -> how many runs allocate that many
    slurm: bool  # launcher srun: each run is a Slurm job of its own
    launcher: str
    worst_node_hours: float
    worst_basis: str  # what bounds each run: the job's time limit, or the runs' own timeouts
    timeout_node_hours: float | None  # on Slurm: every run to its own timeout, which comes before the time limit
    expected_node_hours: float | None  # over the runs with a measurement to go by; None if none has one
    expected_runs: int  # the runs expected_node_hours covers
    unmeasured_runs: int  # runs with no ok record of their benchmark at all: no figure is made up for them
    records_read: int
    records_ok: int
    records_used: int  # the records the expected figure came from
    measured_unix: tuple[float, float] | None  # when the first and the last of those records started
    # One-node runs over a second (third, ...) fabric: their traffic stays in the node, so they measure what
    # the point's first fabric measures (comparisons.ONE_NODE_NOTE); fabrics is every fabric that has them.
    one_node_repeats: int = 0
    one_node_fabrics: tuple[str, ...] = ()
    nearest_runs: int = 0  # of expected_runs: from a run of the same benchmark at another point

    @property
    def runs(self) -> int:
        return sum(self.jobs.values())

    @property
    def nodes(self) -> int:
        return sum(nodes * count for nodes, count in self.allocations.items())

    def as_dict(self) -> dict:
        return {**asdict(self), "runs": self.runs, "nodes": self.nodes}

def _benchmark_words(args) -> tuple[list[str], int] | None:
    """The benchmark's arguments `args` without its step counts and where it writes, and how many steps it
    takes (warmup, measured and probe); None for a step count that is not a number."""
    rest, steps, index = [], 0, 0
    while index < len(args):
        if args[index] in STEP_FLAGS and index + 1 < len(args):
            try:
                steps += int(args[index + 1])
            except ValueError:
                return None
            index += 2
        elif args[index] in NOT_THE_POINT_FLAGS:
            index += 2
        else:
            rest.append(args[index])
            index += 1
    return rest, steps


def _point_and_steps(run_id: str, spec: dict, args) -> tuple[tuple, int] | None:
    """A run's sweep point as its cost sees it (its point id, the spec's settings BEYOND_THE_POINT_ID and its
    benchmark arguments `args`, step counts aside) and how many steps it takes (warmup, measured and
    probe); None for a run of no benchmark (`args` None)."""
    words = None if args is None else _benchmark_words(args)
    if words is None:
        return None
    point = (Point.id_of(run_id), *(spec.get(key) for key in BEYOND_THE_POINT_ID))
    return (point, tuple(words[0])), words[1]


def _benchmark_of(run_id: str, spec: dict, args) -> tuple | None:
    """What a run's cost shares with every run of the same benchmark at other points: its kind, framework,
    ranks a node, system and launcher, the benchmark's arguments (less NOT_THE_BENCHMARK_FLAGS), and for
    the network benchmark its fabric (what it times). None for a run of no benchmark or no point id."""
    words = None if args is None else _benchmark_words(args)
    try:
        point = Point.parse(Point.id_of(run_id))
    except ValueError:
        return None
    if words is None:
        return None
    rest, index = [], 0
    while index < len(words[0]):
        skip = NOT_THE_BENCHMARK_FLAGS.get(words[0][index])
        if skip is None:
            rest.append(words[0][index])
        index += 1 + (skip or 0)
    return (point.kind, point.framework, point.ranks_per_node, point.fabric if point.kind == "netbench" else "",
            spec.get("system"), spec.get("launcher"), tuple(rest))


def _step_seconds(record: dict) -> float | None:
    """The median measured step time of an ok train record (it has a result), over every rank's steps."""
    per_rank = record["result"].get("per_rank") or []
    steps = [s for rank in per_rank for s in rank.get("step_s") or []]
    return statistics.median(steps) if steps else None


def _last_ok_records(records) -> dict[tuple, tuple[dict, int]]:
    """point -> (the last ok record there, its step count): the freshest measurement of each point."""
    def started(record):  # started_unix is null in records older than 3ea4052
        return record["started_unix"] or 0.0, record["spec"].get("repetition") or 0, record["run_id"]

    last = {}
    for record in records:
        if record["status"] != Status.OK or not isinstance(record["wall_s"], (int, float)):
            continue
        # An earlier run keeps no RunPlan: its benchmark arguments are read back from its argv.
        found = _point_and_steps(record["run_id"], record["spec"], benchmark_args_in(record["argv"]))
        if found and (found[0] not in last or started(record) > started(last[found[0]][0])):
            last[found[0]] = (record, found[1])
    return last


def expected_seconds(run_plan: RunPlan, measured: tuple[dict, int] | None) -> float | None:
    """A run's expected wall time from an ok run at its point (or of its benchmark at another point):
    that run's wall time (launch to exit), plus or minus its median step time for each step more or fewer
    than it took. The traffic of more nodes than that run had is not in it. None: no measurement."""
    if measured is None:
        return None
    record, its_steps = measured
    found = _point_and_steps(run_plan.run_id, run_plan.spec, run_plan.benchmark_args)
    more = found[1] - its_steps if found else 0
    if more == 0:
        return float(record["wall_s"])
    step = _step_seconds(record)
    return None if step is None else max(float(record["wall_s"]) + more * step, 0.0)


def _by_benchmark(last: dict[tuple, tuple[dict, int]]) -> dict[tuple, list[tuple[dict, int]]]:
    """The last ok record of each point (_last_ok_records), grouped by benchmark (_benchmark_of)."""
    grouped: dict[tuple, list[tuple[dict, int]]] = {}
    for record, steps in last.values():
        key = _benchmark_of(record["run_id"], record["spec"], benchmark_args_in(record["argv"]))
        if key is not None:
            grouped.setdefault(key, []).append((record, steps))
    return grouped


def _nearest_of_benchmark(run_plan: RunPlan, measured: list[tuple[dict, int]],
                          same_shape: bool = False) -> tuple[dict, int] | None:
    """Of the ok runs of a run's benchmark at other points, the one most like it. Across nodes, a run that
    crossed nodes too, over the same fabric (the gradients' traffic is in its step time), first; then the
    nearest node count, the same runtime, the same MPI model, the same fabric, the newest. `same_shape`:
    only a run on as many nodes, over the same fabric where it crossed nodes."""
    spec = run_plan.spec
    across = spec["nodes"] > 1

    def distance(each: tuple[dict, int]):
        other = each[0]["spec"]
        nodes = max(other.get("nodes") or 1, 1)
        return ((nodes > 1) != across, across and other.get("fabric") != spec["fabric"],
                abs(math.log2(nodes / spec["nodes"])), other.get("runtime") != spec["runtime"],
                other.get("mpi_model") != spec.get("mpi_model"), other.get("fabric") != spec["fabric"],
                -(each[0]["started_unix"] or 0.0))

    if same_shape:
        measured = [each for each in measured if each[0]["spec"].get("nodes") == spec["nodes"]
                    and not (across and each[0]["spec"].get("fabric") != spec["fabric"])]
    return min(measured, key=distance) if measured else None


def expected_each(plans: list[RunPlan], records, same_shape: bool = False
                  ) -> list[tuple[float | None, dict | None, bool]]:
    """Each run's expected wall time (None where no record tells), the record it comes from, and whether
    that record is of another point (_nearest_of_benchmark) rather than the run's own (expected_seconds).
    `same_shape`: another point's run counts only on as many nodes and over the same fabric."""
    last = _last_ok_records(records)
    grouped = _by_benchmark(last)
    each = []
    for run_plan in plans:
        found = _point_and_steps(run_plan.run_id, run_plan.spec, run_plan.benchmark_args)
        own = last.get(found[0]) if found else None
        seconds = expected_seconds(run_plan, own)
        if seconds is not None:
            each.append((seconds, own[0], False))
            continue
        benchmark = _benchmark_of(run_plan.run_id, run_plan.spec, run_plan.benchmark_args)
        nearest = _nearest_of_benchmark(run_plan, grouped.get(benchmark, []), same_shape)
        seconds = expected_seconds(run_plan, nearest)
        each.append((seconds, nearest[0] if seconds is not None else None, seconds is not None))
    return each


def estimate(plans, config: dict, records, node_jobs: int = 1) -> Estimate:
    """What the planned runs cost: jobs, node allocations, worst-case node-hours and, where earlier runs
    measured the same point, expected node-hours. `plans`: the sweep's plans (Sweep.plans.values());
    `records`: run records (records.load_records) from earlier runs, of this sweep or another."""
    plans, records = list(plans), list(records)
    jobs, allocations = {}, {}
    for run_plan in plans:
        spec = run_plan.spec
        jobs[spec["kind"]] = jobs.get(spec["kind"], 0) + 1
        allocations[spec["nodes"]] = allocations.get(spec["nodes"], 0) + 1
    launcher, slurm = config["launcher"]["kind"], uses_slurm(config)
    # Each run's own timeout (execution.execute kills it there and records it failed).
    to_timeouts = sum(p.spec["nodes"] * p.timeout_s for p in plans) / 3600
    limits = ", ".join(f"{kind}.timeout_s = {config[kind]['timeout_s']} s"
                       for kind, run_kind in (("benchmark", "train"), ("netbench", "netbench")) if run_kind in jobs)
    if slurm:
        # What Slurm can charge: a job ends at its time limit, whatever runs in it.
        minutes = config["slurm"]["runtime_minutes"]
        worst = (sum(p.spec["nodes"] for p in plans) + node_jobs) * minutes / 60
        basis = f"every job to its time limit, slurm.runtime_minutes = {minutes}"
    else:
        worst, to_timeouts = to_timeouts, None
        basis = f"every run to its own timeout, {limits}"
    expected, covered, from_nearest, used = 0.0, 0, 0, {}
    for run_plan, (seconds, measured, elsewhere) in zip(plans, expected_each(plans, records)):
        if seconds is not None:
            expected += run_plan.spec["nodes"] * seconds / 3600
            covered += 1
            from_nearest += elsewhere
            used[measured["run_id"]] = measured
    starts = [r["started_unix"] for r in used.values() if r["started_unix"]]
    repeats, fabrics = _one_node_repeats(plans, config["fabrics"])
    return Estimate(
        jobs=dict(sorted(jobs.items(), key=lambda item: item[0] != "train")), local_jobs=len(plans) + 2,
        node_jobs=node_jobs,
        allocations=dict(sorted(allocations.items())), slurm=slurm, launcher=launcher,
        worst_node_hours=worst, worst_basis=basis, timeout_node_hours=to_timeouts,
        expected_node_hours=expected if covered else None,
        expected_runs=covered, unmeasured_runs=len(plans) - covered, records_read=len(records),
        records_ok=sum(r["status"] == Status.OK for r in records), records_used=len(used),
        measured_unix=(min(starts), max(starts)) if starts else None, one_node_repeats=repeats,
        one_node_fabrics=fabrics, nearest_runs=from_nearest)


def _one_node_repeats(plans: list[RunPlan], fabrics: dict[str, dict]) -> tuple[int, tuple[str, ...]]:
    """The one-node runs at a point another fabric measures first (config order), over fabrics that leave
    the ranks their shared memory (fabrics.keeps_shared_memory), and the fabrics involved: the one-node rule
    predicted from settings, as comparisons.fabric_table judges it after from the runs' transport checks."""
    at_one_node: dict[tuple, set[str]] = {}
    shared = {name for name, fabric in fabrics.items() if keeps_shared_memory(fabric.get("env") or {})}
    for run_plan in plans:
        if run_plan.spec["nodes"] == 1 and run_plan.spec["fabric"] in shared:
            point, repetition = Point.parse_run_id(run_plan.run_id)
            at_one_node.setdefault((replace(point, fabric=""), repetition), set()).add(point.fabric)
    repeats = sum(len(fabrics) - 1 for fabrics in at_one_node.values())
    involved = {fabric for fabrics in at_one_node.values() if len(fabrics) > 1 for fabric in fabrics}
    return repeats, tuple(fabric for fabric in fabrics if fabric in involved)


def _node_hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.1f}" if hours >= 1 else f"{hours:.2g}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def format_estimate(cost: Estimate, source: str) -> str:
    """The estimate as a short block for a person; `source`: where the records were read."""
    kinds = ", ".join(f"{count} {kind}" for kind, count in cost.jobs.items())
    where = "each its own Slurm job" if cost.slurm else f"run here by {cost.launcher}, no Slurm job"
    shapes = ", ".join(f"{count} of {_plural(nodes, 'node')}" for nodes, count in cost.allocations.items())
    worst = f"{_node_hours(cost.worst_node_hours)} node-hours: {cost.worst_basis}"
    if cost.timeout_node_hours is not None:
        worst += f" (to the runs' own timeouts: {_node_hours(cost.timeout_node_hours)})"
    lines = [
        "What this sweep costs:",
        f"  jobs         {cost.runs} measurement jobs, one per run ({kinds}), {where}",
        f"               {cost.node_jobs} one-node job{'' if cost.node_jobs == 1 else 's'} besides: "
        "the pre-flight check"
        f"{', image conversions on the nodes' if cost.node_jobs > 1 else ''}",
        f"               {cost.local_jobs} more{' on the workflow node, in no allocation' if cost.slurm else ''}: "
        "a parse per run, tables, report",
        f"  allocations  {cost.nodes:,} nodes in {cost.runs} {'allocations' if cost.slurm else 'runs'}: {shapes}",
        f"  worst case   {worst}",
    ]
    if cost.expected_node_hours is None:
        lines.append(f"  expected     none: no earlier ok run of the benchmark of any of the {cost.runs} runs "
                     "(the workflow's calibrate target makes one of each)")
    else:
        missing = (f"; {_plural(cost.unmeasured_runs, 'run')} without an earlier ok run of its benchmark, "
                   "no figure for those" if cost.unmeasured_runs else "")
        basis = "from the last ok run at each point"
        if cost.nearest_runs:
            basis = (f"from the last ok run at each point, or for {cost.nearest_runs} the nearest ok run of the same "
                     "benchmark at another point (its start-up and step time, not the traffic of more nodes)")
        lines.append(f"  expected     {_node_hours(cost.expected_node_hours)} node-hours for {cost.expected_runs} "
                     f"of {cost.runs} runs, {basis}{missing}")
    if cost.one_node_repeats:
        lines.append(f"  one node     {_plural(cost.one_node_repeats, 'run')} at one node over a second fabric "
                     f"({', '.join(cost.one_node_fabrics)}): their ranks talk through shared memory, not a network, "
                     "so they compare no fabric; the report marks these rows")
    if cost.records_read == 0:
        lines.append(f"  rates from   no run records in {source}")
    else:
        when = ""
        if cost.measured_unix:
            first, last = (time.strftime("%Y-%m-%d", time.gmtime(t)) for t in cost.measured_unix)
            when = f", measured {first}" + (f" to {last}" if last != first else "") + " (UTC)"
        lines.append(f"  rates from   {cost.records_used} of {cost.records_read} records in {source} "
                     f"({cost.records_ok} ok){when}")
    return "\n".join(lines)


def sweep_records(config: dict, given=None, stored: tuple[list[dict], str] = ([], "")) -> tuple[list[dict], str]:
    """The run records an estimate reads, and where they came from: each of `given` (a directory's
    *.json, a record file, or a glob), else the config's own <results_dir>/runs/*.json, if any, and
    `stored` (records, what they are), the system's newest sweeps in the results store, which the
    caller reads (history.newest_sweep_records). Raises ConfigError naming a given path that does not
    exist or a glob that matches nothing."""
    paths = []
    if given:
        for name in given:
            pattern = glob.escape(name) != name
            if pattern:
                found = sorted(glob.glob(name))
            elif Path(name).is_dir():
                found = sorted(Path(name).glob("*.json"))
            else:
                found = [Path(name)] if Path(name).exists() else []
            if not found and not Path(name).is_dir():
                what = "matches no file" if pattern else "does not exist"
                raise cb_config.ConfigError(f"records: {name!r} {what}; allowed: a directory of run records, "
                                            "a record file, or a glob that matches some")
            paths += found
        source = ", ".join(given)
    else:
        runs, calibration = Path(config["results_dir"]) / "runs", Path(config["results_dir"]) / CALIBRATION_DIR
        # The calibration runs' records alone (run ids of repetition 0), whatever else a site keeps there.
        pattern = f"{Point.run_id_of('*', CALIBRATION_REPETITION)}.json"
        paths, calibrated = sorted(runs.glob("*.json")), sorted(calibration.glob(pattern))
        source = f"{runs}/*.json" + (f" and {calibration}/{pattern}" if calibrated else "")
        paths += calibrated
    records, problems = load_records(paths)
    source += f" ({_plural(len(problems), 'unreadable file')} skipped)" if problems else ""
    stored_records, where = stored
    if not given and stored_records:
        seen = {record["log"]["sha256"] for record in records}  # a run both in results/ and stored: once
        records += [record for record in stored_records if record["log"]["sha256"] not in seen]
        source += f" and {where}"
    return records, source


def first_plans(sweep: Sweep) -> list[RunPlan]:
    """The plans of the runs made whatever the results: every plan, except with `repetitions: auto`
    the repetitions after the minimum, which only the rounds ask for (config.first_runs)."""
    return [sweep.plans[run.run_id] for run in cb_config.first_runs(sweep.config, sweep.runs)]


def most_estimate(sweep: Sweep, records) -> Estimate | None:
    """With `repetitions: auto`: what the sweep costs if every point runs max_repetitions (None otherwise)."""
    if sweep.config["benchmark"]["repetitions"] != cb_config.AUTO:
        return None
    return estimate(sweep.plans.values(), sweep.config, records, one_node_jobs(sweep))


def format_most(most: Estimate, config: dict) -> str:
    """The line format_estimate's block gets with `repetitions: auto`: the minimum was counted, this is the most."""
    bench = config["benchmark"]
    fewest, at_most = cb_config.repetition_bounds(bench)
    return (f"  repetitions  auto: {fewest} per train point counted above, more until the 95% interval of the mean "
            f"is within +-{bench['target_ci_percent']:g}%; at most {at_most} each: {most.runs} measurement jobs, "
            f"{_node_hours(most.worst_node_hours)} node-hours worst case")


def cost_summary(sweep: Sweep, given_records=None, stored: tuple[list[dict], str] = ([], "")) -> str:
    """The estimate of the whole sweep (as planned: Sweep.config), from the records of earlier runs, as
    format_estimate prints it (with `repetitions: auto`: of the minimum, and a line for the most)."""
    return _summary(sweep, given_records, stored)[0]


def _summary(sweep: Sweep, given_records, stored: tuple[list[dict], str]) -> tuple[str, Estimate]:
    config = sweep.config
    records, source = sweep_records(config, given_records, stored)
    cost = estimate(first_plans(sweep), config, records, one_node_jobs(sweep))
    text = format_estimate(cost, source)
    most = most_estimate(sweep, records)
    return (text if most is None else f"{text}\n{format_most(most, config)}"), cost


def write_summary(sweep: Sweep, stored: tuple[list[dict], str], text_path: str, json_path: str,
                  log_path: str) -> None:
    """The calibrate target's answer: cost_summary into `text_path`, its log and onto stderr, and the
    estimate of the sweep (as `plan --estimate --json` gives it) into `json_path`, each written whole."""
    text, cost = _summary(sweep, None, stored)
    outputs.write_text(Path(json_path), json.dumps(cost.as_dict(), sort_keys=True) + "\n")
    for path in (text_path, log_path):
        outputs.write_text(Path(path), text + "\n")
    sys.stderr.write(text + "\n")


def one_node_jobs(sweep: Sweep) -> int:
    """The jobs besides the runs that hold a node: the pre-flight check, and the image conversions of
    runtimes installed only on the compute nodes (images.smk runs those there)."""
    converted_on_nodes = {path for use, path in sweep.artifacts.items()
                          if runtime_for(use.runtime, sweep.config).available == "compute-nodes"}
    return 1 + len(converted_on_nodes)


def calibration_runs(sweep: Sweep) -> list[RunSpec]:
    """The calibration runs of a sweep, as repetition CALIBRATION_REPETITION: for each benchmark of its runs
    (_benchmark_of, as the estimate groups them), one run at the point that costs least and leaves least to
    guess (bare metal, else the config's first runtime, in the hybrid MPI model, on the fewest nodes, over
    the config's first fabric); and for training that crosses nodes, one more over each fabric on the fewest
    nodes that cross, whose step time holds the gradients' traffic over it."""
    runtimes, fabrics = list(sweep.config["runtimes"]), list(sweep.config["fabrics"])

    def cheapest(run: RunSpec):
        return (run.runtime != BareMetal.name, runtimes.index(run.runtime) if run.runtime in runtimes else 0,
                run.mpi_model != MPI_MODELS[0], run.nodes, fabrics.index(run.fabric) if run.fabric in fabrics else 0,
                run.run_id)

    groups: dict[tuple, list[RunSpec]] = {}
    for run in sweep.runs:
        plan = sweep.plans[run.run_id]
        benchmark = _benchmark_of(run.run_id, plan.spec, plan.benchmark_args)
        if benchmark is not None and not run.nodelist:
            groups.setdefault(benchmark, []).append(run)
    chosen = {}
    for runs in groups.values():
        picks = [min(runs, key=cheapest)]
        for fabric in {run.fabric for run in runs if run.kind == "train" and run.nodes > 1}:
            picks.append(min((run for run in runs if run.nodes > 1 and run.fabric == fabric), key=cheapest))
        for pick in picks:
            calibration = replace(pick, repetition=CALIBRATION_REPETITION)
            chosen[calibration.run_id] = calibration
    return [chosen[run_id] for run_id in sorted(chosen)]


def calibration_plans(sweep: Sweep, runs: list[RunSpec]) -> dict[str, RunPlan]:
    """run id -> plan of each calibration run (calibration_runs): the sweep's plan of that point with at
    most CALIBRATION_STEPS measured steps, and no telemetry (what it gives is a cost, not a judged figure)."""
    config = copy.deepcopy(sweep.config)
    config["benchmark"]["steps"] = min(config["benchmark"]["steps"], CALIBRATION_STEPS)
    config["telemetry"]["enabled"] = False
    return {run.run_id: plan_run(run, config, sweep.allocation, sweep.artifacts.get(ImageUse.of(run)))
            for run in runs}
