"""Shared fixtures: the project's paths, the benchmark venv, and real tiny runs.

The tests run in the workflow venv (.venv); benchmark processes run in the
benchmark venv (.venv-bench), exactly as the workflow runs them. Both are built
by `make setup`; a missing one is an error, not a skip.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from containerbench import config as cb_config
from containerbench.cli import load_config
from containerbench.launch import execute, plan
from containerbench.results import parse_log

ROOT = Path(__file__).resolve().parents[1]
BENCH_PYTHON = Path(os.environ.get("CONTAINERBENCH_BENCH_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))

# Small enough for CI, large enough to be real training: ResNet-50 at its
# minimum input size, two images per rank, one warmup and two measured steps.
TINY = {
    "system": "ci",
    "runtimes": ["bare-metal"],  # container runtimes: tests/test_containers.py
    "benchmark": {"image_size": 32, "batch_sizes": [2], "warmup_steps": 1, "steps": 2, "repetitions": 2,
                  "node_probe_steps": 1, "timeout_s": 600},
    "bare_metal": {"python": str(BENCH_PYTHON)},
    "netbench": {"max_bytes": 65536},
}


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def bench_python() -> Path:
    if not BENCH_PYTHON.exists():
        pytest.fail(f"benchmark venv missing: {BENCH_PYTHON} (run `make setup`)")
    return BENCH_PYTHON


def tiny_config(tmp_path: Path, **overrides) -> dict:
    """The embedded default with TINY (and `overrides`) merged in, checked and defaulted."""
    data = copy.deepcopy(TINY)
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config([str(ROOT / "config" / "config.yaml"), str(path)])


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, bench_python) -> dict:
    """Really train ResNet-50 on 1 and 2 ranks and run netbench; return their records by kind/ranks."""
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun missing (run `make setup`, which installs Open MPI)")
    workdir = tmp_path_factory.mktemp("tiny-runs")
    config = tiny_config(workdir)
    runs = [r for r in cb_config.plan_runs(config) if r.repetition == 1]
    return {(spec.kind, spec.ranks): record for spec, record in run_and_parse(runs, config, workdir)}


def run_and_parse(runs, config: dict, workdir: Path):
    """Execute each planned run as the workflow does (raw log in workdir), then parse its record."""
    for spec in runs:
        log = workdir / f"{spec.run_id}.log"
        execute(plan(spec, config), log, echo=None)
        yield spec, parse_log(log)


def exported(stdout: str) -> dict[str, str]:
    """The NAME=VALUE lines scripts/container-engines.sh prints for its callers to export."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if re.fullmatch(r"[A-Z_]+=.*", line))


@pytest.fixture(scope="session")
def container_engines(tmp_path_factory) -> dict:
    """Podman settings for this host and a dockerd of our own (stopped by its PID afterwards);
    returns the environment that reaches both."""
    engines = ROOT / "scripts" / "container-engines.sh"
    subprocess.run([str(engines), "install"], check=True, timeout=900)
    state = tmp_path_factory.mktemp("engines")
    conf = subprocess.run([str(engines), "podman-conf", str(state)], capture_output=True, text=True, check=True)
    dockerd = subprocess.run([str(engines), "start-dockerd", str(state / "docker")], capture_output=True,
                             text=True, timeout=300)
    try:
        assert dockerd.returncode == 0, dockerd.stderr
        yield {**os.environ, **exported(conf.stdout), **exported(dockerd.stdout)}
    finally:
        subprocess.run([str(engines), "stop-dockerd", str(state / "docker")], timeout=120)
