"""Launching runs: the sweep made ready, each RunSpec turned into a plan (argv +
environment), and each plan run into a raw log.

`prepare` is what the workflow and `containerbench plan` both do before any job:
check the config, resolve each runtime's image, probe the runtimes, expand the
sweep and plan every run. The raw log is the single source of truth for a run.
It starts with a launch marker line (the spec, the exact argv and the variables
given), holds everything the ranks printed, and ends with an exit marker line
(return code, wall time, timeout). Parsing (records.py) reads nothing else, so
every figure traces back to this file.

`estimate` says what a sweep costs before anything is submitted: its jobs, node
allocations, worst-case node-hours and, from the records of earlier runs at the
same points, expected node-hours (`containerbench plan --estimate`).
"""

from __future__ import annotations

import csv
import functools
import glob
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from containerbench import config as cb_config
from containerbench import markers, slurm
from containerbench.config import RunSpec, dataset_dir
from containerbench.fabrics import debug_environment, expected_transport
from containerbench.images import IMAGES, check_bench_env, resolve_images
from containerbench.processes import die_with_parent, stop_session, watch_controller
from containerbench.records import load_records
from containerbench.runtimes import (
    RunRequest,
    check_launchers,
    host_environment,
    runtime_for,
    select_runtimes,
)
from containerbench.telemetry import library_mpi_version, rank_context

# Always set in every rank: unbuffered output keeps the log in step order, and
# TensorFlow's INFO chatter would bury the lines that matter.
RANK_ENV = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}

# Benchmark settings copied into every train plan's spec: a failed run still
# belongs to its sweep point, and the parser checks that what ran is what was asked.
PLANNED_SETTINGS = {"tensorflow": ("model", "image_size", "precision", "xla", "data_format", "warmup_steps", "steps"),
                    "pytorch": ("model", "image_size", "precision", "data_format", "warmup_steps", "steps",
                                "torch_compile")}
BENCHMARKS = {"tensorflow": "containerbench.bench", "pytorch": "containerbench.torchbench"}


class NoLauncher:
    name = "none"

    def wrap(self, rank_argv: list[str], spec: RunSpec, env_names: list[str], runtime_options=()) -> list[str]:
        if spec.ranks != 1:
            raise ValueError(f"launcher 'none' starts one rank, {spec.run_id} needs {spec.ranks}")
        return rank_argv


class Mpirun:
    """Open MPI's mpirun: one node here, or the nodes of the enclosing allocation."""

    name = "mpirun"

    def __init__(self, bind: str = "core", extra_args=()):
        self.bind, self.extra_args = bind, list(extra_args)

    def wrap(self, rank_argv, spec, env_names, runtime_options=()):
        argv = ["mpirun", "-np", str(spec.ranks), "--map-by", f"ppr:{spec.ranks_per_node}:node",
                "--bind-to", self.bind, "--report-bindings"]
        for name in env_names:  # -x forwards each variable to remote ranks too
            argv += ["-x", name]
        return argv + self.extra_args + rank_argv


class Hydra:
    """The host MPICH's mpiexec (Hydra), for runs in the native MPI model: the ranks' libmpi is the
    host's MPICH, which Open MPI's mpirun cannot wire up. Hydra passes the whole environment by
    default (mpiexec -genvall). -pmi-port: ranks reach their PMI server by PMI_PORT (TCP) instead of
    an inherited socket (PMI_FD), which podman run does not hand to the container (measured: without
    it MPI_Init fails, "PMI_Get_appnum returned -1")."""

    name = "mpiexec"

    def __init__(self, mpiexec: str = "mpiexec.mpich", bind: str = "core", extra_args=()):
        self.mpiexec, self.bind, self.extra_args = mpiexec, bind, list(extra_args)

    def wrap(self, rank_argv, spec, env_names, runtime_options=()):
        return [self.mpiexec, "-pmi-port", "-n", str(spec.ranks), "-ppn", str(spec.ranks_per_node),
                "-bind-to", self.bind,  # launcher.bind's values are Hydra's own
                *self.extra_args, *rank_argv]


class Srun:
    """Slurm's srun inside the job's allocation; the MPI plugin comes from the config."""

    name = "srun"

    def __init__(self, mpi: str = "pmix", bind: str = "core", extra_args=(), cpus_per_rank: int = 1,
                 gpus_per_node: int = 0):
        self.mpi, self.bind, self.extra_args = mpi, bind, list(extra_args)
        self.cpus_per_rank, self.gpus_per_node = cpus_per_rank, gpus_per_node

    def wrap(self, rank_argv, spec, env_names, runtime_options=()):
        cpu_bind = {"core": "cores", "socket": "sockets", "none": "none"}[self.bind]
        # Explicit sizes: Snakemake's job-step plugin strips the allocation's SLURM_* defaults.
        # Every GPU of a node is visible to its ranks; the benchmark pins one per local rank
        # (no --ntasks-per-gpu: it clashes with SLURM_TRES_PER_TASK, a known plugin trap).
        gpus = [f"--gres=gpu:{self.gpus_per_node}"] if self.gpus_per_node else []
        # runtime_options: what a runtime contributes to srun itself (Pyxis: --container-image, ...)
        return ["srun", f"--mpi={self.mpi}", f"--nodes={spec.nodes}", f"--ntasks={spec.ranks}",
                f"--ntasks-per-node={spec.ranks_per_node}", f"--cpus-per-task={self.cpus_per_rank}", *gpus,
                f"--cpu-bind={cpu_bind}", "--export=ALL", *self.extra_args, *runtime_options, *rank_argv]


def launcher_for(config: dict, runtime=None):
    """The configured launcher, for `runtime`'s runs (a runtime may name its own srun MPI plugin)."""
    settings = config["launcher"]
    kind, bind, extra = settings["kind"], settings.get("bind", "core"), settings.get("extra_args", [])
    if kind == "mpirun" and getattr(runtime, "native", False):
        return Hydra(config["native_mpi"]["mpiexec"], bind)
    if kind == "mpirun":
        return Mpirun(bind, extra)
    if kind == "srun":
        slurm = config["slurm"]
        mpi = getattr(runtime, "srun_mpi", None) or settings.get("srun_mpi", "pmix")
        return Srun(mpi, bind, extra, slurm["cpus_per_rank"], slurm["gpus_per_node"])
    return NoLauncher()


def benchmark_args(spec: RunSpec, config: dict) -> list[str]:
    if spec.kind == "netbench":
        # Ping-pong is always ranks 0 and 1, i.e. the first two nodes: the 2-node run has
        # measured that pair, so larger allocations measure only the all-reduce.
        net = config["netbench"]
        backend = ["--backend", "torch-" + config["benchmark"]["torch_backend"]] if spec.framework == "pytorch" else []
        return ["--max-bytes", str(net["max_bytes"]), *backend, *(["--nccl-ring"] if backend and net["nccl_ring"] else []),
                *(["--no-pingpong"] if spec.nodes > 2 else [])]
    bench = config["benchmark"]
    args = ["--model", bench["model"], "--batch-size", str(spec.batch_size),
            "--image-size", str(bench["image_size"]), "--warmup-steps", str(bench["warmup_steps"]),
            "--steps", str(bench["steps"]), "--precision", bench["precision"],
            "--data-format", bench["data_format"], "--threads", str(bench["threads_per_rank"]),
            "--probe-steps", str(bench["node_probe_steps"]),
            "--mode", spec.mode, "--runtime", spec.runtime]
    data = ["--data-dir", os.path.abspath(dataset_dir(config))] if spec.data == "real" else []  # both frameworks'
    if spec.framework == "pytorch":
        return args + data + ["--backend", bench["torch_backend"], *(["--compile"] if bench["torch_compile"] else [])]
    if spec.mode == "collective":
        args += ["--collective", bench["collective_implementation"]]
    if spec.mode == "parameter_server":
        args += ["--parameter-servers", str(bench["parameter_servers"])]
    return args + data + (["--xla"] if bench["xla"] else [])


def clone_sources() -> str:
    """The src/ directory of the clone this package runs from, for `package: clone`."""
    source = Path(__file__).resolve().parent.parent
    if not (source.name == "src" and (source.parent / "pyproject.toml").is_file()):
        raise ValueError(f"package: clone needs containerbench run from a clone (editable install), "
                         f"not from {source}")
    return str(source)


def rdma_fabric(fabric: dict) -> bool:
    """Does this fabric ask for InfiniBand/RoCE? Then containers get the RDMA devices and memlock."""
    return expected_transport(fabric).transport == "ib"


def telemetry_settings(spec: RunSpec, config: dict) -> dict | None:
    """Where the run's samplers write (one CSV per node, merged into `file` after the run) and
    the limits its record is judged by; None with `telemetry: false`."""
    settings = config["telemetry"]
    if not settings["enabled"]:
        return None
    root = Path(config["results_dir"], "telemetry").absolute()
    return {"dir": str(root / spec.run_id), "file": str(root / f"{spec.run_id}.csv"),
            **{key: settings[key] for key in ("interval_s", "disturbed_cpu_share", "max_steal_share",
                                                "exclude_disturbed")}}


def clear_telemetry(run_plan: dict) -> None:
    """Before the run: an empty directory for the nodes' samplers (nothing left from a killed attempt)."""
    if run_plan.get("telemetry"):
        directory = Path(run_plan["telemetry"]["dir"])
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)


def collect_telemetry(run_plan: dict) -> Path | None:
    """After the run: the nodes' samples as one CSV (a host column added), the per-node files removed."""
    settings = run_plan.get("telemetry")
    if not settings:
        return None
    directory, merged = Path(settings["dir"]), Path(settings["file"])
    partial = merged.with_name(merged.name + ".partial")
    with open(partial, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["time_unix", "host", "metric", "device", "value"])
        for node_file in sorted(directory.glob("*.csv")):
            with open(node_file, newline="") as samples:
                rows = csv.reader(samples)
                next(rows, None)  # the node file's header
                writer.writerows([row[0], node_file.stem, *row[1:]] for row in rows if len(row) == 4)
    partial.replace(merged)  # whole or not at all
    shutil.rmtree(directory, ignore_errors=True)
    return merged


def measure(run_plan: dict, log_path: Path, echo=sys.stdout, allocation: str | None = None) -> int:
    """One run as the workflow makes it: its raw log (execute) and its nodes' samples beside it.
    `allocation`: the Slurm job it runs in, from outside it (fleet jobs), asked after a failure."""
    clear_telemetry(run_plan)
    # Where the launch ran, for the ranks' own view to be compared with (records.judge_container).
    context = rank_context()
    if run_plan.get("native_mpi"):  # what the ranks must report having loaded (records.judge_native_mpi)
        library = run_plan["native_mpi"]["library"]
        context["native_mpi"] = {"library": library, "version": library_mpi_version(library)}
    run_plan = {**run_plan, "launch_context": context}
    try:
        return execute(run_plan, log_path, echo, allocation)
    finally:
        collect_telemetry(run_plan)


def plan(spec: RunSpec, config: dict, allocate: bool | None = None) -> dict:
    """Everything needed to start the run, as plain JSON-able data. `allocate`: whether the run asks for an
    allocation of its own (default: allocates(config)); a fleet job's runs share their job's."""
    module = "containerbench.netbench" if spec.kind == "netbench" else BENCHMARKS[spec.framework]
    fabric = config["fabrics"][spec.fabric]
    fabric_env = {k: str(v) for k, v in fabric["env"].items()}
    # Every layer logs which network it chose, so the parser can verify the fabric.
    rank_env = {**RANK_ENV, **debug_environment(fabric_env), **fabric_env}
    runtime = runtime_for(spec.runtime, config, spec.mpi_model, spec.framework)
    binds = tuple(config["images"]["binds"]) + ((dataset_dir(config),) if spec.data == "real" else ())
    if runtime.package == "clone":
        source = clone_sources()
        binds, rank_env = binds + (source,), {**rank_env, "PYTHONPATH": source}
    arguments = benchmark_args(spec, config)
    telemetry = telemetry_settings(spec, config)
    if telemetry:
        arguments += ["--telemetry-dir", telemetry["dir"], "--telemetry-interval", str(telemetry["interval_s"])]
        binds += (telemetry["dir"],)  # the samplers write it from inside the container
    request = RunRequest(module=module, args=tuple(arguments), env=rank_env,
                         workdir=os.getcwd(), binds=binds,
                         gpus=config["slurm"]["gpus_per_node"] > 0, infiniband=rdma_fabric(fabric),
                         ranks_per_node=spec.ranks_per_node)
    env = runtime.environment(request)
    argv = launcher_for(config, runtime).wrap(runtime.rank_argv(request), spec, sorted(env), runtime.launcher_options(request))
    timeout = config["netbench" if spec.kind == "netbench" else "benchmark"]["timeout_s"]
    settings = {}
    if spec.kind == "train":
        bench = config["benchmark"]
        settings = {key: bench[key] for key in PLANNED_SETTINGS[spec.framework]}
    return {
        "run_id": spec.run_id,
        "spec": {**spec.as_dict(), "system": config["system"], "launcher": config["launcher"]["kind"],
                 "mpi_model": runtime.mpi_model, **settings},
        "argv": argv,
        "env": env,
        "timeout_s": timeout,
        "image": getattr(runtime, "image", None),
        "fabric": {"name": spec.fabric, "env": fabric_env, "expect": fabric.get("expect")},
        "telemetry": telemetry,
        **({"native_mpi": {"library": runtime.native_mpi.library}} if getattr(runtime, "native", False) else {}),
        **({"allocation": slurm.allocation_argv(config["slurm"], spec.nodes, spec.ranks_per_node,
                                                config["slurm"]["runtime_minutes"], f"containerbench-{spec.run_id}",
                                                spec.nodelist)}
           if (allocates(config) if allocate is None else allocate) else {}),
    }


def allocates(config: dict) -> bool:
    """Whether each run asks Slurm for its own allocation (salloc) from the workflow's node: with launcher
    srun, from outside any allocation. Its launcher then outlives the allocation, and a run Slurm ends
    (scancel, time limit, node failure, preemption) is recorded with sacct's state and reason instead of
    vanishing with its job. Inside an allocation (a site's salloc session), runs are its job steps."""
    return config["launcher"]["kind"] == "srun" and not slurm.in_allocation()


def _final_argv(argv: list[str]) -> list[str]:
    """Adjustments that depend on where the plan runs, decided there (and logged)."""
    # Open MPI refuses root unless told; containers and CI commonly run as root.
    if argv and Path(argv[0]).name == "mpirun" and os.geteuid() == 0 and "--allow-run-as-root" not in argv:
        return [argv[0], "--allow-run-as-root", *argv[1:]]
    # Inside a job step already (a one-rank Snakemake job runs in `srun -n1`), a
    # nested srun would wait forever for CPUs that step holds.
    if argv and Path(argv[0]).name == "srun" and "SLURM_STEP_ID" in os.environ and "--overlap" not in argv:
        return [argv[0], "--overlap", *argv[1:]]
    return argv


class RunAbandoned(SystemExit):
    """The workflow controller is gone, so no one will collect this run: `containerbench launch`
    ends with this line and a non-zero status (after measure's finally), and the run's output is
    left incomplete for the next invocation to run again (rerun-incomplete)."""


def execute(run_plan: dict, log_path: Path, echo=sys.stdout, allocation: str | None = None) -> int:
    """Run the plan, copying its output to the log (and to `echo`); return its exit code.

    A failing benchmark is a result, not an error of the workflow: the log keeps
    the evidence and the parser marks the record failed. A run whose workflow
    controller is gone is stopped and raises RunAbandoned.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = _final_argv(run_plan["argv"])
    header = {**run_plan, "argv": argv, "host": socket.gethostname(), "started_unix": time.time()}
    started = time.monotonic()
    timed_out, abandoned = threading.Event(), []
    with open(log_path, "w") as log:
        log.write(markers.line(markers.LAUNCH, header))
        log.flush()
        try:
            # Nothing of the run may outlive the workflow. Two guards, as each covers what the other
            # cannot: if this process is killed (SIGKILL: no finally runs), the kernel signals the run
            # (die_with_parent); if the controller is killed, this process lives on, orphaned with its
            # job's shell, and only the watch below notices. Popen from this thread, before any other
            # starts: the death signal follows the thread that forks, and preexec_fn is unsafe with threads.
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                env={**host_environment(), **run_plan["env"]}, start_new_session=True,
                preexec_fn=die_with_parent(),  # noqa: PLW1509 (it only calls prctl, getppid, kill)
            )
        except (OSError, subprocess.SubprocessError) as error:  # the latter: preexec_fn failed
            log.write(f"containerbench: cannot start {argv[0]!r}: {error}\n")
            returncode = 127
        else:
            returncode = _follow(process, log, echo, run_plan["timeout_s"], timed_out, abandoned)
        if abandoned:
            log.write(f"containerbench: {abandoned[0]}: run abandoned\n")
        footer = {"returncode": returncode, "wall_s": round(time.monotonic() - started, 3),
                  "timed_out": timed_out.is_set(), "ended_unix": time.time()}
        if returncode != 0 and allocation:  # ended from outside (scancel, time limit, node failure)?
            ended = slurm.job_state(allocation)
            if ended:
                footer["slurm"] = ended
        log.write(markers.line(markers.EXIT, footer))
    if abandoned:
        raise RunAbandoned(f"containerbench: {run_plan['run_id']}: {abandoned[0]}: run abandoned")
    return returncode


def write_not_run(run_plan: dict, log_path: Path, why: dict) -> None:
    """The raw log of a run that never started: its launch line and an exit line saying why (`not_run`,
    and Slurm's word in `slurm` where there is one), so it becomes a failed record, not a missing one."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    Path(log_path).write_text(
        markers.line(markers.LAUNCH, {**run_plan, "host": socket.gethostname(), "started_unix": time.time()})
        + markers.line(markers.EXIT, {"returncode": None, "wall_s": 0.0, "timed_out": False,
                                      "ended_unix": time.time(), **why}))


def run_in_allocation(plans: list[dict], logs: list, echo=sys.stdout) -> int:
    """Runs one after another in the allocation salloc made (SLURM_JOB_ID), launched from outside it:
    when Slurm ends it (scancel, time limit, node failure, preemption), the run under way gets Slurm's
    state and reason in its log, and the runs after it a log saying they did not run, so each becomes a
    failed record instead of a job Snakemake would quietly submit again."""
    allocation = os.environ.get("SLURM_JOB_ID")
    why = None
    for run_plan, log in zip(plans, logs):
        if why:
            write_not_run(run_plan, log, why)
            continue
        if measure(run_plan, Path(log), echo, allocation=allocation) != 0 and allocation:
            last = (Path(log).read_text(errors="replace").splitlines() or [""])[-1]
            ended = (markers.payload(last, markers.EXIT) or {}).get("slurm") if last.startswith(markers.EXIT) else None
            if ended:
                why = {"not_run": f"its allocation ended before it: Slurm job {ended['job']} {ended['state']}",
                       "slurm": ended}
    return 0


def run_allocated_plans(plans: list[dict], logs: list, allocation: list[str], command: list[str]) -> int:
    """A job of runs with an allocation of its own (`allocation`, salloc's argv), asked for from here, and
    `containerbench COMMAND --in-allocation` (which comes to run_in_allocation) run in it. Where Slurm gave
    none, or revoked it before the command ran, every log not yet written says why and those written stay;
    where the command itself failed, its status is returned for the workflow to show."""
    inner = [sys.executable, "-m", "containerbench", *command, "--in-allocation"]
    returncode, refused = slurm.run_allocated(allocation, inner)
    if refused is None:
        return returncode
    for run_plan, log in zip(plans, logs):
        if not Path(log).exists():
            write_not_run(run_plan, log, {"not_run": refused})
    return 0


def _follow(process, log, echo, timeout_s: float, timed_out: threading.Event, abandoned: list) -> int:
    """Copy the run's output until it ends; stop its whole session on a timeout, when the controller
    is gone (its description appended to `abandoned`), when this process is interrupted, and after."""
    def time_out():
        if process.poll() is None:  # a run that ended at its deadline did not time out
            timed_out.set()
            stop_session(process.pid)

    def controller_gone(what: str):
        if process.poll() is None:
            abandoned.append(what)
            stop_session(process.pid)

    watchdog = threading.Timer(timeout_s, time_out)
    watchdog.start()
    watch = watch_controller(controller_gone)
    try:
        for line in process.stdout:
            log.write(line)
            if echo:
                echo.write(line)
        return process.wait()
    finally:
        watchdog.cancel()
        if watch:
            watch.set()
        # Interrupted, or a process of the run still there after it ended: none outlives the run.
        stop_session(process.pid, grace_s=1.0)


@dataclass
class Sweep:
    """The sweep made ready to run: every run planned, and what the plans depend on."""

    runs: list[RunSpec]
    plans: dict[str, dict]  # run id -> plan
    image_files: dict[cb_config.ImageUse, str] = field(default_factory=dict)  # who runs a built image -> its file
    skipped: dict[str, str] = field(default_factory=dict)  # runtime -> why it cannot run here
    dataset_sample: str | None = None  # the sample directory to generate for real-data runs, if any

    @functools.cached_property
    def inputs(self) -> dict[str, dict[str, str]]:
        """run id -> the files the run needs first: its runtime's built image, the generated sample."""
        needs = {}
        for run in self.runs:
            needs[run.run_id] = {}
            image = self.image_files.get(cb_config.ImageUse.of(run))
            if image:
                needs[run.run_id]["image"] = image
            if self.dataset_sample and run.data == "real":
                needs[run.run_id]["data"] = self.dataset_sample
        return needs


def check_site_images(config: dict, built: dict[cb_config.ImageUse, str]) -> None:
    """An image the site supplies (not one the workflow builds) exists, or is pinned by digest."""
    for runtime in site_images(config, built):
        problem = runtime.site_image_problem()
        if problem:
            raise cb_config.ConfigError(f"config: {problem}")


def site_images(config: dict, built: dict[cb_config.ImageUse, str]) -> list:
    """The runtimes (one per MPI model and framework) that run an image the site supplies."""
    uses = [cb_config.ImageUse(name, model, framework) for name in config["runtimes"] if name != "bare-metal"
            for framework in config["benchmark"]["frameworks"] for model in cb_config.mpi_models(config, name)]
    return [runtime_for(use.runtime, config, use.mpi_model, use.framework) for use in uses if use not in built]


def site_image_files(config: dict, built: dict[cb_config.ImageUse, str]) -> list[str]:
    """The image files the site supplies: the pre-flight check checks that the compute nodes see them."""
    return sorted({os.path.abspath(runtime.image) for runtime in site_images(config, built)
                   if runtime.image_is_file(runtime.image)})


def prepare(config: dict, repo: Path, *, probe: bool = True) -> Sweep:
    """Everything checked before any job: runtimes' images and launchers, the dataset, the sweep,
    and (with `probe`) which runtimes can run here and what the Slurm cluster can give.
    `config` must be validated (config.validated); it is completed in place. Raises ConfigError."""
    try:
        artifacts = resolve_images(config, repo / IMAGES)
        check_launchers(config)  # before any probe: an option a runtime does not take is a config error
        skipped = select_runtimes(config, artifacts) if probe else {}
        if probe:
            check_site_images(config, artifacts)
            if artifacts:
                check_bench_env(config, repo, artifacts)
        artifacts = {use: path for use, path in artifacts.items() if use.runtime in config["runtimes"]}
        cb_config.check_dataset(config)
        sample = None
        if "real" in config["benchmark"]["data"] and not config["dataset"]["path"]:
            sample = config["dataset"]["path"] = str(repo / cb_config.SAMPLE_DIR)  # one sample for every results dir
        runs = cb_config.plan_runs(config)
        cb_config.check_runs(config, runs)
        if config["launcher"]["kind"] == "srun":
            slurm.check_time_limit(config)
            if probe:
                slurm.check_cluster(config, runs)
        plans = {run.run_id: plan(run, config) for run in runs}
    except cb_config.ConfigError:
        raise
    except ValueError as error:  # a runtime refusing what the config asks (an option, a launcher, a bind)
        raise cb_config.ConfigError(f"config: {error}") from None
    return Sweep(runs, plans, artifacts, skipped, sample)


# What a sweep costs, worked out before anything is submitted (`containerbench plan --estimate`,
# and the workflow before it submits). Each run holds `nodes` nodes for as long as it runs.

# The benchmark's step counts: the same sweep point with other counts still gives its step time.
STEP_FLAGS = ("--warmup-steps", "--steps", "--probe-steps")
# What does not make a run another sweep point: which repetition it is, and how many steps it takes.
NOT_THE_POINT = {"run_id", "repetition", "warmup_steps", "steps"}
# Benchmark flags that say where a run writes, not what it measures (the path holds the run id).
NOT_THE_POINT_FLAGS = ("--telemetry-dir", "--telemetry-interval")
BENCHMARK_MODULES = ("containerbench.bench", "containerbench.torchbench", "containerbench.netbench")


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
    expected_node_hours: float | None  # over the runs with a measurement at their point; None if none has
    expected_runs: int  # the runs expected_node_hours covers
    unmeasured_runs: int  # runs with no ok record at their point: no figure is made up for them
    records_read: int
    records_ok: int
    records_used: int  # the records the expected figure came from: the last ok one at each point
    measured_unix: tuple[float, float] | None  # when the first and the last of those records started

    @property
    def runs(self) -> int:
        return sum(self.jobs.values())

    @property
    def nodes(self) -> int:
        return sum(nodes * count for nodes, count in self.allocations.items())

    def as_dict(self) -> dict:
        return {**asdict(self), "runs": self.runs, "nodes": self.nodes}


def _benchmark_args(argv) -> list[str] | None:
    """What the benchmark itself is given: the words after the last `-m containerbench.(net)bench`."""
    argv = list(argv or [])
    for index in range(len(argv) - 2, -1, -1):
        if argv[index] == "-m" and argv[index + 1] in BENCHMARK_MODULES:
            return argv[index + 2:]
    return None


def _point_and_steps(spec: dict, argv) -> tuple[tuple, int] | None:
    """A run's sweep point (its spec and benchmark arguments, repetition and step counts aside) and
    how many steps it takes (warmup, measured and probe); None for an argv that runs no benchmark."""
    args = _benchmark_args(argv)
    if args is None:
        return None
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
    point = tuple(sorted((key, value) for key, value in spec.items()
                         if key not in NOT_THE_POINT and not isinstance(value, (dict, list))))
    return (point, tuple(rest)), steps


def _step_seconds(record: dict) -> float | None:
    """The median measured step time of a train record, over every rank's steps."""
    per_rank = (record.get("result") or {}).get("per_rank") or []
    steps = [s for rank in per_rank for s in rank.get("step_s") or []]
    return statistics.median(steps) if steps else None


def _last_ok_records(records) -> dict[tuple, tuple[dict, int]]:
    """point -> (the last ok record there, its step count): the freshest measurement of each point."""
    def started(record):
        spec = record.get("spec") or {}
        return record.get("started_unix") or 0.0, spec.get("repetition") or 0, str(record.get("run_id"))

    last = {}
    for record in records:
        if record.get("status") != "ok" or not isinstance(record.get("wall_s"), (int, float)):
            continue
        found = _point_and_steps(record.get("spec") or {}, record.get("argv"))
        if found and (found[0] not in last or started(record) > started(last[found[0]][0])):
            last[found[0]] = (record, found[1])
    return last


def expected_seconds(run_plan: dict, measured: tuple[dict, int] | None) -> float | None:
    """A run's expected wall time from the last ok run at its point: that run's wall time (launch to exit),
    plus or minus its median step time for each step more or fewer than it took. None: no measurement."""
    if measured is None:
        return None
    record, its_steps = measured
    found = _point_and_steps(run_plan["spec"], run_plan["argv"])
    more = found[1] - its_steps if found else 0
    if more == 0:
        return float(record["wall_s"])
    step = _step_seconds(record)
    return None if step is None else max(float(record["wall_s"]) + more * step, 0.0)


def estimate(plans, config: dict, records, node_jobs: int = 1) -> Estimate:
    """What the planned runs cost: jobs, node allocations, worst-case node-hours and, where earlier runs
    measured the same point, expected node-hours. `plans`: the sweep's plans (Sweep.plans.values());
    `records`: run records (records.load_records) from earlier runs, of this sweep or another."""
    plans, records = list(plans), list(records)
    jobs, allocations = {}, {}
    for run_plan in plans:
        spec = run_plan["spec"]
        jobs[spec["kind"]] = jobs.get(spec["kind"], 0) + 1
        allocations[spec["nodes"]] = allocations.get(spec["nodes"], 0) + 1
    launcher = config["launcher"]["kind"]
    # Each run's own timeout (launch.execute kills it there and records it failed).
    to_timeouts = sum(p["spec"]["nodes"] * p["timeout_s"] for p in plans) / 3600
    limits = ", ".join(f"{kind}.timeout_s = {config[kind]['timeout_s']} s"
                       for kind, run_kind in (("benchmark", "train"), ("netbench", "netbench")) if run_kind in jobs)
    if launcher == "srun":
        # What Slurm can charge: a job ends at its time limit, whatever runs in it.
        minutes = config["slurm"]["runtime_minutes"]
        worst = (sum(p["spec"]["nodes"] for p in plans) + node_jobs) * minutes / 60
        basis = f"every job to its time limit, slurm.runtime_minutes = {minutes}"
    else:
        worst, to_timeouts = to_timeouts, None
        basis = f"every run to its own timeout, {limits}"
    last = _last_ok_records(records)
    expected, covered, used = 0.0, 0, {}
    for run_plan in plans:
        found = _point_and_steps(run_plan["spec"], run_plan["argv"])
        measured = last.get(found[0]) if found else None
        seconds = expected_seconds(run_plan, measured)
        if seconds is not None:
            expected += run_plan["spec"]["nodes"] * seconds / 3600
            covered += 1
            used[measured[0]["run_id"]] = measured[0]
    starts = [r["started_unix"] for r in used.values() if r.get("started_unix")]
    return Estimate(
        jobs=dict(sorted(jobs.items(), key=lambda item: item[0] != "train")), local_jobs=len(plans) + 2, node_jobs=node_jobs,
        allocations=dict(sorted(allocations.items())), slurm=launcher == "srun", launcher=launcher,
        worst_node_hours=worst, worst_basis=basis, timeout_node_hours=to_timeouts,
        expected_node_hours=expected if covered else None,
        expected_runs=covered, unmeasured_runs=len(plans) - covered, records_read=len(records),
        records_ok=sum(r.get("status") == "ok" for r in records), records_used=len(used),
        measured_unix=(min(starts), max(starts)) if starts else None)


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
        f"               {cost.node_jobs} one-node job{'' if cost.node_jobs == 1 else 's'} besides: the pre-flight check"
        f"{', image conversions on the nodes' if cost.node_jobs > 1 else ''}",
        f"               {cost.local_jobs} more{' on the workflow node, in no allocation' if cost.slurm else ''}: "
        "a parse per run, tables, report",
        f"  allocations  {cost.nodes:,} nodes in {cost.runs} {'allocations' if cost.slurm else 'runs'}: {shapes}",
        f"  worst case   {worst}",
    ]
    if cost.expected_node_hours is None:
        lines.append(f"  expected     none: no earlier ok run at the point of any of the {cost.runs} runs")
    else:
        missing = (f"; {_plural(cost.unmeasured_runs, 'run')} without an earlier ok run at its point, "
                   "no figure for those" if cost.unmeasured_runs else "")
        lines.append(f"  expected     {_node_hours(cost.expected_node_hours)} node-hours for {cost.expected_runs} "
                     f"of {cost.runs} runs, from the last ok run at each point{missing}")
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


def sweep_records(config: dict, given=None) -> tuple[list[dict], str]:
    """The run records an estimate reads, and where they came from: each of `given` (a directory's
    *.json, a record file, or a glob), else the config's own <results_dir>/runs/*.json, if any.
    Raises ConfigError naming a given path that does not exist or a glob that matches nothing."""
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
        runs = Path(config["results_dir"]) / "runs"
        paths = sorted(runs.glob("*.json"))
        source = f"{runs}/*.json"
    records, problems = load_records(paths)
    return records, source + (f" ({_plural(len(problems), 'unreadable file')} skipped)" if problems else "")


def first_plans(sweep: Sweep, config: dict) -> list[dict]:
    """The plans of the runs made whatever the results: every plan, except with `repetitions: auto`
    the repetitions after the minimum, which only the rounds ask for (config.first_runs)."""
    return [sweep.plans[run.run_id] for run in cb_config.first_runs(config, sweep.runs)]


def most_estimate(sweep: Sweep, config: dict, records) -> Estimate | None:
    """With `repetitions: auto`: what the sweep costs if every point runs max_repetitions (None otherwise)."""
    if config["benchmark"]["repetitions"] != cb_config.AUTO:
        return None
    return estimate(sweep.plans.values(), config, records, one_node_jobs(sweep, config))


def format_most(most: Estimate, config: dict) -> str:
    """The line format_estimate's block gets with `repetitions: auto`: the minimum was counted, this is the most."""
    bench = config["benchmark"]
    fewest, at_most = cb_config.repetition_bounds(bench)
    return (f"  repetitions  auto: {fewest} per train point counted above, more until the 95% interval of the mean "
            f"is within +-{bench['target_ci_percent']:g}%; at most {at_most} each: {most.runs} measurement jobs, "
            f"{_node_hours(most.worst_node_hours)} node-hours worst case")


def cost_summary(sweep: Sweep, config: dict, given_records=None) -> str:
    """The estimate of the whole sweep, from the records of earlier runs, as format_estimate prints it
    (with `repetitions: auto`: of the minimum, and a line for the most)."""
    records, source = sweep_records(config, given_records)
    text = format_estimate(estimate(first_plans(sweep, config), config, records, one_node_jobs(sweep, config)), source)
    most = most_estimate(sweep, config, records)
    return text if most is None else f"{text}\n{format_most(most, config)}"


def one_node_jobs(sweep: Sweep, config: dict) -> int:
    """The jobs besides the runs that hold a node: the pre-flight check, and the image conversions of
    runtimes installed only on the compute nodes (images.smk runs those there)."""
    converted_on_nodes = {path for use, path in sweep.image_files.items()
                          if runtime_for(use.runtime, config).available == "compute-nodes"}
    return 1 + len(converted_on_nodes)
