"""Launching a run: from a RunSpec to a plan (argv + environment), and from a
plan to a raw log.

The raw log is the single source of truth for a run. It starts with a
`containerbench-launch {json}` line (the spec, the exact argv and the variables
given), holds everything the ranks printed, and ends with a
`containerbench-exit {json}` line (return code, wall time, timeout). Parsing
(results.py) reads nothing else, so every figure traces back to this file.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from containerbench.config import RunSpec, dataset_dir
from containerbench.fabrics import debug_environment, expected_transport
from containerbench.runtimes import RunRequest, host_environment, runtime_for

LAUNCH_PREFIX = "containerbench-launch "
EXIT_PREFIX = "containerbench-exit "

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


def launcher_for(config: dict):
    settings = config["launcher"]
    kind, bind, extra = settings["kind"], settings.get("bind", "core"), settings.get("extra_args", [])
    if kind == "mpirun":
        return Mpirun(bind, extra)
    if kind == "srun":
        slurm = config["slurm"]
        return Srun(settings.get("srun_mpi", "pmix"), bind, extra, slurm["cpus_per_rank"], slurm["gpus_per_node"])
    return NoLauncher()


def benchmark_args(spec: RunSpec, config: dict) -> list[str]:
    if spec.kind == "netbench":
        return ["--max-bytes", str(config["netbench"]["max_bytes"])]
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
    argv = launcher_for(config).wrap(runtime.rank_argv(request), spec, sorted(env), runtime.launcher_options(request))
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


def run_group(argv: list[str], *, timeout: float, capture: bool = True, **popen) -> subprocess.CompletedProcess:
    """subprocess.run for commands that start process trees (engines, snakemake, mpirun): the
    command gets a process group of its own, and on a timeout or an interruption the whole group
    is killed, so no helper outlives it. Raises subprocess.TimeoutExpired as subprocess.run does."""
    pipe = subprocess.PIPE if capture else None
    process = subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True, start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # the timeout, Ctrl-C, a signal from snakemake or pytest-timeout
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


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
        log.write(LAUNCH_PREFIX + json.dumps(header, sort_keys=True) + "\n")
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
            def kill_group():
                timed_out.set()
                os.killpg(process.pid, signal.SIGKILL)

            watchdog = threading.Timer(run_plan["timeout_s"], kill_group)
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
                    os.killpg(process.pid, signal.SIGKILL)
        footer = {"returncode": returncode, "wall_s": round(time.monotonic() - started, 3),
                  "timed_out": timed_out.is_set(), "ended_unix": time.time()}
        log.write(EXIT_PREFIX + json.dumps(footer, sort_keys=True) + "\n")
    return returncode


def check_slurm_request(config: dict, runs: list[RunSpec], sinfo=("sinfo",)) -> None:
    """Refuse, before anything is submitted, what this Slurm cluster cannot give (from sinfo).

    Raises ValueError with one line; does nothing where sinfo is not available.
    """
    slurm = config["slurm"]
    limit = max(config["benchmark"]["timeout_s"], config["netbench"]["timeout_s"])
    if limit >= slurm["runtime_minutes"] * 60:
        raise ValueError(f"config: 'slurm.runtime_minutes' = {slurm['runtime_minutes']} ends before the benchmark's own "
                         f"timeout ({limit} s); allowed: more than {limit // 60} minutes, so a hung run is "
                         "recorded as failed instead of killed by Slurm")
    try:
        listing = subprocess.run([*sinfo, "-h", "-o", "%R|%D|%G"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return
    if listing.returncode != 0:
        return
    partitions = {}
    for line in listing.stdout.split():
        name, nodes, gres = line.split("|")
        gpus = max((int(g.split(":")[-1].split("(")[0]) for g in gres.split(",") if g.startswith("gpu")), default=0)
        known = partitions.get(name, (0, 0))
        partitions[name] = (known[0] + int(nodes), max(known[1], gpus))
    name = slurm["partition"] or next(iter(partitions), None)
    if slurm["partition"] and name not in partitions:
        raise ValueError(f"config: 'slurm.partition' = {name!r} is not a partition of this cluster; "
                         f"allowed: {', '.join(sorted(partitions))}")
    if name is None:
        return
    nodes, gpus = partitions[name]
    most = max(r.nodes for r in runs) if runs else 0
    if most > nodes:
        raise ValueError(f"config: 'scaling.nodes' asks for {most} nodes, partition {name!r} has {nodes}; allowed: at most {nodes}")
    if slurm["gpus_per_node"] > gpus:
        raise ValueError(f"config: 'slurm.gpus_per_node' = {slurm['gpus_per_node']}, nodes of partition {name!r} have "
                         f"{gpus} GPU(s); allowed: at most {gpus}")
