"""The pre-flight check: what a compute node must see before any benchmark job runs there.

The workflow plans on one machine (a login node) and measures on others. Before it
submits any job (Snakemake's onstart, not in a dry run), it runs this check where
the measurements run (`srun` on one compute node; here, this machine) and stops
with one line per problem:

- the clone is at the same path with the same package sources (every job runs
  `python -m containerbench` from it, and containers bind the working directory);
- the bare-metal interpreter exists there and imports the benchmark's packages;
- the runtimes installed only there (`available: compute-nodes`) answer their
  probe there (they are not probed when planning);
- the image files the site supplies (a SIF, a squashfs) are there.

It is not a rule: a job that every measurement depended on would, whenever it ran
again (after a code or config change), make every finished measurement run again.

    python -m containerbench preflight --repo R --sources-digest D --bench-python P \
        --probes '{"apptainer": ["apptainer", "--version"]}' [--out preflight.json]
"""

from __future__ import annotations

import hashlib
import json
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from containerbench.launchers import Srun, uses_slurm
from containerbench.runtimes import run_probe

PACKAGE = Path("src") / "containerbench"
# The srun allocation's time limit: the check takes seconds, the queue may take longer.
SRUN_MINUTES = 10
# How long the workflow waits for it, queue included.
TIMEOUT_S = 3600
# What a rank imports first: fails fast, without TensorFlow's seconds-long import. Each framework's
# bare-metal interpreter, and the config key that names it.
BENCH_IMPORT_CHECK = "import containerbench.provenance, mpi4py, horovod, tensorflow"
IMPORT_CHECKS = {"tensorflow": ("bare_metal.python", "bench", BENCH_IMPORT_CHECK),
                 "pytorch": ("bare_metal.torch_python", "bench-torch", "import containerbench.provenance, mpi4py, torch")}


def sources_digest(repo: Path) -> str:
    """A digest of the package's sources in `repo`: the same clone, at the same commit and edits."""
    digest = hashlib.sha256()
    for path in sorted((Path(repo) / PACKAGE).rglob("*.py")):
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def check_clone(repo: Path, expected_digest: str) -> str | None:
    if not (repo / PACKAGE).is_dir():
        return (f"the clone is not at {repo} on this node; allowed: a clone on a filesystem the compute "
                "nodes mount at the same path as the login node")
    found = sources_digest(repo)
    if found != expected_digest:
        return (f"the clone at {repo} differs from the one the workflow planned with (package sources "
                f"{found} here, {expected_digest} there); allowed: one shared clone")
    return None


def check_bench_python(python: str, timeout: float = 300, framework: str = "tensorflow") -> str | None:
    key, side, check = IMPORT_CHECKS[framework]
    try:
        done = subprocess.run([python, "-c", check], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return (f"'{key}' = {python!r} does not exist on this node; allowed: a venv on a shared "
                f"filesystem (scripts/setup-venv.sh {side}) or an interpreter every node has")
    except subprocess.TimeoutExpired:
        return f"'{key}' = {python!r} did not import the benchmark's packages within {timeout:g} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"'{key}' = {python!r} cannot import the benchmark's packages on this node: {last[:200]}"
    return None


def run_checks(repo: Path, expected_digest: str, bench_python: str | None,
               probes: dict[str, list[str]], image_files=(), torch_python: str | None = None) -> dict:
    """Every check, run here; the result names each problem in one line."""
    started = time.time()
    problems = []
    if problem := check_clone(repo, expected_digest):
        problems.append(problem)
    for framework, python in (("tensorflow", bench_python), ("pytorch", torch_python)):
        if python and (problem := check_bench_python(python, framework=framework)):
            problems.append(problem)
    for image in image_files:
        if not Path(image).exists():
            problems.append(f"the image {image} does not exist on this node; allowed: an image on a filesystem "
                            "the compute nodes mount")
    probed = {}
    for runtime, argv in sorted(probes.items()):
        ok, detail = run_probe(argv, timeout=60)
        probed[runtime] = {"argv": argv, "ok": ok, "detail": detail}
        if not ok:
            problems.append(f"runtime {runtime!r} cannot run on this node: {detail}")
    return {"host": socket.gethostname(), "repo": str(repo), "sources_digest": expected_digest,
            "bench_python": bench_python, "torch_python": torch_python, "image_files": list(image_files),
            "probes": probed, "problems": problems,
            "seconds": round(time.time() - started, 3)}


def check_argv(config: dict, repo: Path, python: str, bench_python: str | None, probes: dict[str, list[str]],
               image_files=(), torch_python: str | None = None) -> list[str]:
    """The check's command line: on one compute node through srun when the runs use srun, else here."""
    argv = [python, "-m", "containerbench", "preflight", "--repo", str(repo), "--sources-digest", sources_digest(repo),
            *(["--bench-python", str(bench_python)] if bench_python else []),
            *(["--torch-python", str(torch_python)] if torch_python else []), "--probes", json.dumps(probes),
            *(f"--image-file={path}" for path in image_files)]
    if not uses_slurm(config):
        return argv
    slurm = config["slurm"]
    placement = [f"--{key}={slurm[key]}" for key in ("partition", "account", "qos", "constraint") if slurm[key]]
    return [Srun.program, "--nodes=1", "--ntasks=1", f"--time={SRUN_MINUTES}", "--job-name=containerbench-preflight",
            *placement, *argv]


def run_before_jobs(argv: list[str], timeout: float = TIMEOUT_S) -> None:
    """Run the check before any job is submitted; its problems, one line each, stop the workflow."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        sys.exit(f"containerbench: preflight: {argv[0]} is not installed here")
    except subprocess.TimeoutExpired:
        sys.exit(f"containerbench: preflight: no answer within {timeout:g} s from {shlex.join(argv[:6])} ...")
    if done.returncode != 0:
        problems = [line for line in done.stderr.splitlines() if line.startswith("containerbench: ")]
        sys.exit("\n".join(problems) or f"containerbench: preflight failed (exit {done.returncode}): "
                 f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    print(done.stdout.strip(), file=sys.stderr)
