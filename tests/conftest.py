"""Fixtures: the benchmark venv, real tiny runs, recorded runs, container engines.

The tests run in the workflow venv (.venv); benchmark processes run in the
benchmark venv (.venv-bench), exactly as the workflow runs them. Markers say what
a test needs (pyproject.toml); `make test-fast` leaves out all that needs more
than the workflow venv. A test that needs root skips, with that reason, when the
suite does not run as root; any other missing piece is an error, not a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from diskwatch import GB, DiskWatch
from helpers import (
    BENCH_PYTHON,
    ROOT,
    TORCH_PYTHON,
    exported,
    recorded_records,
    run_and_parse,
    tiny_config,
)

from containerbench import config as cb_config

# What a fixture needs, as markers: a test that uses one (directly or through another
# fixture) gets its markers, so `-m` selects by what a test really needs.
FIXTURE_MARKS = {
    "bench_python": ("bench",),
    "tiny_runs": ("bench", "slow"),
    "torch_python": ("bench",),
    "torch_runs": ("bench", "slow"),
    "netns": ("root", "netns"),
    "container_engines": ("root", "containers"),
    "cluster": ("root", "slurm", "netns"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marks in FIXTURE_MARKS.items():
            if fixture in item.fixturenames:
                for mark in marks:
                    item.add_marker(mark)


# The most the container modules add to the disk at once, the venvs already there: test_containers' two flavours
# in podman, docker, podman-hpc and Charliecloud, while the archive and the conversions' temporary tars exist (11.6
# GB alone on 2026-12-01, an empty podman store; 14.2 GB before the wheelhouse left the image; docs/developing.md).
# In `make test` on a fresh clone the slow session used 12.8 GB at most, the tests before test_containers included.
# Below this they fail halfway.
CONTAINER_TESTS_NEED_GB = 13
DISK = DiskWatch.for_suite(ROOT)


def pytest_sessionstart(session):
    DISK.start()


def pytest_runtest_logstart(nodeid, location):
    DISK.current = nodeid


@pytest.hookimpl(trylast=True)  # after the durations: the last lines CI shows
def pytest_terminal_summary(terminalreporter):
    DISK.stop()
    for line in DISK.summary():
        terminalreporter.write_line(line)


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root: it installs system packages, starts daemons or makes network namespaces")


@pytest.fixture(autouse=True)
def no_site_pmix_base(monkeypatch):
    """A plan made in the test process does not read this machine's Slurm (slurm.pmix_client_base): where a cluster
    answers, its TmpFS would change the argv the tests hold. test_slurm reads a real one, in a process of its own."""
    from containerbench import slurm

    monkeypatch.setattr(slurm, "pmix_client_base", lambda: "")


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def bench_python():
    if not BENCH_PYTHON.exists():
        pytest.fail(f"benchmark venv missing: {BENCH_PYTHON} (run `make setup`)")
    return BENCH_PYTHON


def planned_tiny_runs(tmp_path_factory, name: str, **overrides) -> dict:
    """The tiny config's first repetition, each run made as the workflow makes it; records by kind/ranks. Their
    tests read what each record holds, not its figures (helpers.measured): a run the hypervisor's steal alone
    disturbed is kept, flagged with it, rather than waited on and measured again."""
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun missing (run `make setup`, which installs Open MPI)")
    workdir = tmp_path_factory.mktemp(name)
    config = tiny_config(workdir, **overrides)
    runs = [r for r in cb_config.plan_runs(config) if r.repetition == 1]
    return {(spec.kind, spec.ranks): record
            for spec, record in run_and_parse(runs, config, workdir, stolen_kept=True)}


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, bench_python) -> dict:
    """Really train ResNet-50 on 1 and 2 ranks and run netbench; return their records by kind/ranks."""
    return planned_tiny_runs(tmp_path_factory, "tiny-runs")


@pytest.fixture(scope="session")
def imagenet_sample(tmp_path_factory, bench_python):
    """A tiny ImageNet-shaped TFRecord set, written by the generator the workflow uses (both
    frameworks' real-data pipelines read it)."""
    out = tmp_path_factory.mktemp("imagenet-sample")
    subprocess.run([str(bench_python), "-m", "containerbench.rank.datasets", "generate", str(out), "--images", "24",
                    "--shards", "3", "--size", "48"], check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def torch_python():
    if not TORCH_PYTHON.exists():
        pytest.fail(f"PyTorch benchmark venv missing: {TORCH_PYTHON} (run `make setup`)")
    return TORCH_PYTHON


@pytest.fixture(scope="session")
def torch_runs(tmp_path_factory, torch_python) -> dict:
    """Really train ResNet-50 with PyTorch DDP on 1 and 2 ranks and run the torch.distributed netbench on 2,
    bare metal, as the workflow plans them; their records by kind/ranks."""
    return planned_tiny_runs(tmp_path_factory, "torch-runs", benchmark={"frameworks": ["pytorch"]})


@pytest.fixture(scope="session")
def recorded_runs() -> dict:
    """The same shape as tiny_runs, parsed from raw logs of real tiny runs kept in tests/data/runs:
    what the tables, the report and validation need, without training anything."""
    return recorded_records()


@pytest.fixture(scope="session")
def container_engines(tmp_path_factory) -> dict:
    """Podman settings for this host and a dockerd of our own (stopped by its PID afterwards);
    returns the environment that reaches both."""
    for path in (ROOT, "/var/lib/containers" if os.path.exists("/var/lib/containers") else "/var/lib"):
        if (free := DISK.free(str(path)) / GB) < CONTAINER_TESTS_NEED_GB:
            pytest.fail(f"{free:.1f} GB free on {path}'s file system; the container tests need "
                        f"{CONTAINER_TESTS_NEED_GB} GB there for their images (make clean-images frees built ones)")
    engines = ROOT / "scripts" / "container-engines.sh"
    subprocess.run([str(engines), "install"], check=True, timeout=900)
    state = tmp_path_factory.mktemp("engines")
    conf = subprocess.run([str(engines), "podman-conf", str(state)], capture_output=True, text=True, check=True)
    dockerd = subprocess.run([str(engines), "start-dockerd", str(state / "docker")], capture_output=True,
                             text=True, timeout=300)
    started = time.time()
    try:
        assert dockerd.returncode == 0, dockerd.stderr
        yield {**os.environ, **exported(conf.stdout), **exported(dockerd.stdout)}
    finally:
        subprocess.run([str(engines), "stop-dockerd", str(state / "docker")], timeout=120)
        shutil.rmtree(state / "docker", ignore_errors=True)  # its store: gigabytes, of no use after the session
        # The stamps written of images loaded into it name copies that are gone: forgotten, so that `make
        # clean-images` does not keep them for a store that will never answer again (imagebuild.remove_image), and
        # a run loads them again. An older stamp names another dockerd's image (a site's own), and stays.
        for stamp in (ROOT / "build" / "images").glob("docker-*.json"):
            if stamp.stat().st_mtime >= started:
                stamp.unlink(missing_ok=True)
