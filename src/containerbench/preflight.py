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

    python -m containerbench preflight --repo R --sources-digest D --bench-python P [--torch-python T] \
        --probes '{"apptainer": ["apptainer", "--version"]}' [--out preflight.json]

(each framework's interpreter under its own option, Framework.preflight_option).
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

from containerbench.frameworks import FRAMEWORKS, framework
from containerbench.launchers import Srun, uses_slurm
from containerbench.runtimes import run_probe

PACKAGE = Path("src") / "containerbench"
# The srun allocation's time limit: the check takes seconds, the queue may take longer.
SRUN_MINUTES = 10
# How long the workflow waits for it, queue included.
TIMEOUT_S = 3600


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


def check_bench_python(python: str, timeout: float = 300, framework_name: str | None = None) -> str | None:
    """Does `python` import what a rank of the framework (default: the default one) imports first
    (Framework.import_check: fails fast, without the framework's seconds-long import of itself)?"""
    checked = framework(framework_name)
    key, side = f"bare_metal.{checked.bare_metal_key}", checked.venv_side
    try:
        done = subprocess.run([python, "-c", checked.import_check], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return (f"'{key}' = {python!r} does not exist on this node; allowed: a venv on a shared "
                f"filesystem (scripts/setup-venv.sh {side}) or an interpreter every node has")
    except subprocess.TimeoutExpired:
        return f"'{key}' = {python!r} did not import the benchmark's packages within {timeout:g} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"'{key}' = {python!r} cannot import the benchmark's packages on this node: {last[:200]}"
    return None


def run_checks(repo: Path, expected_digest: str, pythons: dict[str, str | None],
               probes: dict[str, list[str]], image_files=()) -> dict:
    """Every check, run here; the result names each problem in one line. `pythons`: framework -> its
    bare-metal interpreter, where the sweep runs it."""
    started = time.time()
    problems = []
    if problem := check_clone(repo, expected_digest):
        problems.append(problem)
    for name, python in pythons.items():
        if python and (problem := check_bench_python(python, framework_name=name)):
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
            **{each.python_key: pythons.get(each.name) for each in FRAMEWORKS.values()},
            "image_files": list(image_files), "probes": probed, "problems": problems,
            "seconds": round(time.time() - started, 3)}


def check_argv(config: dict, repo: Path, python: str, pythons: dict[str, str | None], probes: dict[str, list[str]],
               image_files=()) -> list[str]:
    """The check's command line: on one compute node through srun when the runs use srun, else here.
    `pythons`: framework -> its bare-metal interpreter (None, or left out: not checked)."""
    interpreters = [word for each in FRAMEWORKS.values() if pythons.get(each.name)
                    for word in (each.preflight_option, str(pythons[each.name]))]
    argv = [python, "-m", "containerbench", "preflight", "--repo", str(repo), "--sources-digest", sources_digest(repo),
            *interpreters, "--probes", json.dumps(probes), *(f"--image-file={path}" for path in image_files)]
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
