"""Launching runs: the sweep made ready, each RunSpec turned into a plan (argv +
environment), and each plan run into a raw log.

`prepare` is what the workflow and `containerbench plan` both do before any job:
check the config, resolve each runtime's image, probe the runtimes, expand the
sweep and plan every run. The raw log is the single source of truth for a run.
It starts with a launch marker line (the spec, the exact argv and the variables
given), holds everything the ranks printed, and ends with an exit marker line
(return code, wall time, timeout). Parsing (records.py) reads nothing else, so
every figure traces back to this file.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from containerbench import config as cb_config
from containerbench import markers, slurm
from containerbench.config import RunSpec, dataset_dir
from containerbench.fabrics import debug_environment, expected_transport
from containerbench.images import IMAGES, resolve_images
from containerbench.processes import kill_group
from containerbench.runtimes import (RunRequest, check_launchers, host_environment, is_image_path, runtime_for,
                                     select_runtimes)

# Always set in every rank: unbuffered output keeps the log in step order, and
# TensorFlow's INFO chatter would bury the lines that matter.
RANK_ENV = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}

# Benchmark settings copied into every train plan's spec: a failed run still
# belongs to its sweep point, and the parser checks that what ran is what was asked.
PLANNED_SETTINGS = ("model", "image_size", "precision", "xla", "data_format", "warmup_steps", "steps")


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
        return ["--max-bytes", str(config["netbench"]["max_bytes"]), *(["--no-pingpong"] if spec.nodes > 2 else [])]
    bench = config["benchmark"]
    args = ["--model", bench["model"], "--batch-size", str(spec.batch_size),
            "--image-size", str(bench["image_size"]), "--warmup-steps", str(bench["warmup_steps"]),
            "--steps", str(bench["steps"]), "--precision", bench["precision"],
            "--data-format", bench["data_format"], "--threads", str(bench["threads_per_rank"]),
            "--probe-steps", str(bench["node_probe_steps"]),
            "--mode", spec.mode, "--runtime", spec.runtime]
    if spec.mode == "collective":
        args += ["--collective", bench["collective_implementation"]]
    if spec.mode == "parameter_server":
        args += ["--parameter-servers", str(bench["parameter_servers"])]
    if spec.data == "real":
        args += ["--data-dir", os.path.abspath(dataset_dir(config))]
    return args + (["--xla"] if bench["xla"] else [])


def rdma_fabric(fabric: dict) -> bool:
    """Does this fabric ask for InfiniBand/RoCE? Then containers get the RDMA devices and memlock."""
    return expected_transport(fabric).transport == "ib"


def plan(spec: RunSpec, config: dict) -> dict:
    """Everything needed to start the run, as plain JSON-able data."""
    module = "containerbench.netbench" if spec.kind == "netbench" else "containerbench.bench"
    fabric = config["fabrics"][spec.fabric]
    fabric_env = {k: str(v) for k, v in fabric["env"].items()}
    # Every layer logs which network it chose, so the parser can verify the fabric.
    rank_env = {**RANK_ENV, **debug_environment(fabric_env), **fabric_env}
    request = RunRequest(module=module, args=tuple(benchmark_args(spec, config)), env=rank_env,
                         workdir=os.getcwd(), binds=tuple(config["images"]["binds"]) + (
                             (dataset_dir(config),) if spec.data == "real" else ()),
                         gpus=config["slurm"]["gpus_per_node"] > 0, infiniband=rdma_fabric(fabric))
    runtime = runtime_for(spec.runtime, config)
    env = runtime.environment(request)
    argv = launcher_for(config, runtime).wrap(runtime.rank_argv(request), spec, sorted(env), runtime.launcher_options(request))
    timeout = config["netbench" if spec.kind == "netbench" else "benchmark"]["timeout_s"]
    settings = {}
    if spec.kind == "train":
        bench = config["benchmark"]
        settings = {key: bench[key] for key in PLANNED_SETTINGS}
    return {
        "run_id": spec.run_id,
        "spec": {**spec.as_dict(), "system": config["system"], "launcher": config["launcher"]["kind"], **settings},
        "argv": argv,
        "env": env,
        "timeout_s": timeout,
        "image": getattr(runtime, "image", None),
        "fabric": {"name": spec.fabric, "env": fabric_env, "expect": fabric.get("expect")},
    }


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


def execute(run_plan: dict, log_path: Path, echo=sys.stdout) -> int:
    """Run the plan, copying its output to the log (and to `echo`); return its exit code.

    A failing benchmark is a result, not an error of the workflow: the log keeps
    the evidence and the parser marks the record failed.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = _final_argv(run_plan["argv"])
    header = {**run_plan, "argv": argv, "host": socket.gethostname(), "started_unix": time.time()}
    started = time.monotonic()
    timed_out = threading.Event()
    with open(log_path, "w") as log:
        log.write(markers.line(markers.LAUNCH, header))
        log.flush()
        try:
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                env={**host_environment(), **run_plan["env"]}, start_new_session=True,
            )
        except OSError as error:
            log.write(f"containerbench: cannot start {argv[0]!r}: {error}\n")
            returncode = 127
        else:
            def time_out():
                timed_out.set()
                kill_group(process.pid)

            watchdog = threading.Timer(run_plan["timeout_s"], time_out)
            watchdog.start()
            try:
                for line in process.stdout:
                    log.write(line)
                    if echo:
                        echo.write(line)
                returncode = process.wait()
            finally:
                watchdog.cancel()
                if process.poll() is None:  # interrupted: leave no ranks behind
                    kill_group(process.pid)
        footer = {"returncode": returncode, "wall_s": round(time.monotonic() - started, 3),
                  "timed_out": timed_out.is_set(), "ended_unix": time.time()}
        log.write(markers.line(markers.EXIT, footer))
    return returncode


@dataclass
class Sweep:
    """The sweep made ready to run: every run planned, and what the plans depend on."""

    runs: list[RunSpec]
    plans: dict[str, dict]  # run id -> plan
    image_files: dict[str, str] = field(default_factory=dict)  # runtime -> the built file its runs need
    skipped: dict[str, str] = field(default_factory=dict)  # runtime -> why it cannot run here
    dataset_sample: str | None = None  # the sample directory to generate for real-data runs, if any

    @functools.cached_property
    def inputs(self) -> dict[str, dict[str, str]]:
        """run id -> the files the run needs first: its runtime's built image, the generated sample."""
        needs = {}
        for run in self.runs:
            needs[run.run_id] = {}
            if run.runtime in self.image_files:
                needs[run.run_id]["image"] = self.image_files[run.runtime]
            if self.dataset_sample and run.data == "real":
                needs[run.run_id]["data"] = self.dataset_sample
        return needs


def check_site_images(config: dict, built: dict[str, str]) -> None:
    """An image the site supplies (not one the workflow builds) exists, or is pinned by digest."""
    for name in config["runtimes"]:
        if name != "bare-metal" and name not in built:
            problem = runtime_for(name, config).site_image_problem()
            if problem:
                raise cb_config.ConfigError(f"config: {problem}")


def site_image_files(config: dict, built: dict[str, str]) -> list[str]:
    """The image files the site supplies: the pre-flight job checks that the compute nodes see them."""
    images = (runtime_for(name, config).image for name in config["runtimes"]
              if name != "bare-metal" and name not in built)
    return sorted(os.path.abspath(image) for image in images if is_image_path(image))


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
        artifacts = {name: path for name, path in artifacts.items() if name in config["runtimes"]}
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
