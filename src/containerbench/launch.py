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

from containerbench.config import RunSpec
from containerbench.runtimes import RunRequest, runtime_for

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

    def wrap(self, rank_argv: list[str], spec: RunSpec, env_names: list[str]) -> list[str]:
        if spec.ranks != 1:
            raise ValueError(f"launcher 'none' starts one rank, {spec.run_id} needs {spec.ranks}")
        return rank_argv


class Mpirun:
    """Open MPI's mpirun: one node here, or the nodes of the enclosing allocation."""

    name = "mpirun"

    def __init__(self, bind: str = "core", extra_args=()):
        self.bind, self.extra_args = bind, list(extra_args)

    def wrap(self, rank_argv, spec, env_names):
        argv = ["mpirun", "-np", str(spec.ranks), "--map-by", f"ppr:{spec.ranks_per_node}:node",
                "--bind-to", self.bind, "--report-bindings"]
        for name in env_names:  # -x forwards each variable to remote ranks too
            argv += ["-x", name]
        return argv + self.extra_args + rank_argv


class Srun:
    """Slurm's srun inside the job's allocation; the MPI plugin comes from the config."""

    name = "srun"

    def __init__(self, mpi: str = "pmix", bind: str = "core", extra_args=()):
        self.mpi, self.bind, self.extra_args = mpi, bind, list(extra_args)

    def wrap(self, rank_argv, spec, env_names):
        cpu_bind = {"core": "cores", "socket": "sockets", "none": "none"}[self.bind]
        return ["srun", f"--mpi={self.mpi}", f"--nodes={spec.nodes}", f"--ntasks={spec.ranks}",
                f"--ntasks-per-node={spec.ranks_per_node}", f"--cpu-bind={cpu_bind}", "--export=ALL",
                *self.extra_args, *rank_argv]


def launcher_for(config: dict):
    settings = config["launcher"]
    kind, bind, extra = settings["kind"], settings.get("bind", "core"), settings.get("extra_args", [])
    if kind == "mpirun":
        return Mpirun(bind, extra)
    if kind == "srun":
        return Srun(settings.get("srun_mpi", "pmix"), bind, extra)
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
            "--runtime", spec.runtime]
    return args + (["--xla"] if bench["xla"] else [])


def plan(spec: RunSpec, config: dict) -> dict:
    """Everything needed to start the run, as plain JSON-able data."""
    module = "containerbench.netbench" if spec.kind == "netbench" else "containerbench.bench"
    fabric_env = {k: str(v) for k, v in config["fabrics"][spec.fabric]["env"].items()}
    request = RunRequest(module=module, args=tuple(benchmark_args(spec, config)), env={**RANK_ENV, **fabric_env})
    runtime = runtime_for(spec.runtime, config)
    env = runtime.environment(request)
    argv = launcher_for(config).wrap(runtime.rank_argv(request), spec, sorted(env))
    timeout = config["netbench" if spec.kind == "netbench" else "benchmark"]["timeout_s"]
    settings = {}
    if spec.kind == "train":
        bench = config["benchmark"]
        settings = {key: bench[key] for key in PLANNED_SETTINGS} | {"mode": "horovod", "data": "synthetic"}
    return {
        "run_id": spec.run_id,
        "spec": {**spec.as_dict(), "system": config["system"], "launcher": config["launcher"]["kind"], **settings},
        "argv": argv,
        "env": env,
        "timeout_s": timeout,
    }


def _final_argv(argv: list[str]) -> list[str]:
    # Open MPI refuses root unless told; containers and CI commonly run as root.
    if argv and Path(argv[0]).name == "mpirun" and os.geteuid() == 0 and "--allow-run-as-root" not in argv:
        return [argv[0], "--allow-run-as-root", *argv[1:]]
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
        log.write(LAUNCH_PREFIX + json.dumps(header, sort_keys=True) + "\n")
        log.flush()
        try:
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                env={**os.environ, **run_plan["env"]}, start_new_session=True,
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
