"""tests/slurm/cluster.sh's own promises that need no Slurm: what a killed cluster leaves is cleared, and a
cluster still running is refused, not stopped."""

import subprocess
import time
from pathlib import Path

import pytest
from helpers import SLURM_CLUSTER

pytestmark = [pytest.mark.root, pytest.mark.netns]


def namespaces() -> set[str]:
    return {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                        check=True).stdout.splitlines()}


def test_namespaces_a_killed_cluster_left_are_removed_and_a_running_ones_refused():
    assert not {name for name in namespaces() if name.startswith("cb")}, "a test cluster is running here"
    # A session that ended mid-test left a node's namespace with nothing in it (2026-11-30: cbn3 and cbn4 were
    # left, and the next 4-node start failed on `ip netns add cbn3`).
    subprocess.run(["ip", "netns", "add", "cbn239"], check=True)
    cleared = subprocess.run([str(SLURM_CLUSTER), "clear-stale"], capture_output=True, text=True, timeout=30)
    assert cleared.returncode == 0 and cleared.stderr.splitlines() == [
        "cluster.sh: removed namespace cbn239, left with no process in it by a cluster that was not stopped"]
    assert "cbn239" not in namespaces()

    subprocess.run(["ip", "netns", "add", "cbctl"], check=True)
    resident = subprocess.Popen(["ip", "netns", "exec", "cbctl", "sleep", "120"])
    try:
        deadline = time.monotonic() + 10
        while not subprocess.run(["ip", "netns", "pids", "cbctl"], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, "sleep never entered the namespace"
            time.sleep(0.1)
        refused = subprocess.run([str(SLURM_CLUSTER), "clear-stale"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and refused.stderr.splitlines() == [
            "cluster.sh: a test cluster is already running (namespaces cbctl have processes); stop it first"]
        assert "cbctl" in namespaces() and resident.poll() is None
        # A start under way (its namespaces empty until its daemons start) is refused too, by its PID.
        subprocess.run(["ip", "netns", "del", "cbctl"], check=True)
        Path("/run/containerbench-cluster-starting").write_text(f"{resident.pid}\n")
        subprocess.run(["ip", "netns", "add", "cbctl"], check=True)
        refused = subprocess.run([str(SLURM_CLUSTER), "clear-stale"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and refused.stderr.splitlines() == [
            f"cluster.sh: a test cluster is starting (cluster.sh start, pid {resident.pid}); stop it first"]
        assert "cbctl" in namespaces()
    finally:
        Path("/run/containerbench-cluster-starting").unlink(missing_ok=True)
        resident.kill()
        resident.wait()
        subprocess.run(["ip", "netns", "del", "cbctl"], check=True)
