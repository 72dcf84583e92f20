"""Runs containerbench.rank.netbench for real: 2 ranks over loopback TCP, and 1 rank without mpirun."""

import math
import re
import shutil
import subprocess

import pytest

from containerbench.processes import run_group
from containerbench.rank import markers

TIMEOUT_S = 120


def prefixed_json(lines, marker):
    return markers.payloads_of(lines, marker)


@pytest.fixture(scope="module")
def two_rank_output(bench_python):
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun missing (run `make setup`, which installs Open MPI)")
    command = [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
        "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
        str(bench_python), "-m", "containerbench.rank.netbench",
        "--max-bytes", "65536", "--target-bytes", "1048576",
    ]
    completed = run_group(command, timeout=TIMEOUT_S)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout.splitlines()


def test_two_ranks_result(two_rank_output):
    results = prefixed_json(two_rank_output, markers.RESULT)
    assert len(results) == 1
    result = results[0]
    assert result["kind"] == "netbench"
    assert result["ranks"] == 2
    assert len(result["hostnames"]) == 2
    assert result["mpi_library"] and "\0" not in result["mpi_library"]

    pingpong = result["pingpong"]
    assert [entry["bytes"] for entry in pingpong] == [2**power for power in range(17)]
    assert all(entry["latency_us"] > 0 and entry["bandwidth_MBps"] > 0 for entry in pingpong)

    allreduce = result["allreduce"]
    assert allreduce[0]["bytes"] == 4 and allreduce[-1]["bytes"] == 65536
    for entry in allreduce:
        assert math.isclose(entry["busbw_GBps"], entry["algbw_GBps"] * 2 * (2 - 1) / 2, rel_tol=1e-9)

    # Each per-measurement machine line must match the summary, in order.
    assert prefixed_json(two_rank_output, markers.NETBENCH) == pingpong + allreduce


def test_two_ranks_human_lines(two_rank_output):
    pingpong_sizes = [int(m.group(1)) for line in two_rank_output
                      if (m := re.match(r"pingpong\s+(\d+) B\s+lat\s+[\d.]+ us\s+bw\s+[\d.]+ MB/s\s+iters \d+$", line))]
    allreduce_sizes = [int(m.group(1)) for line in two_rank_output
                       if (m := re.match(r"allreduce\s+(\d+) B\s+time\s+[\d.]+ us\s+algbw [\d.]+ GB/s\s+"
                                         r"busbw [\d.]+ GB/s\s+iters \d+$", line))]
    assert pingpong_sizes == [2**power for power in range(17)]
    assert allreduce_sizes == [2**power for power in range(2, 17)]


def test_single_rank_is_rejected(bench_python):
    completed = subprocess.run([str(bench_python), "-m", "containerbench.rank.netbench"], capture_output=True,
                               text=True, timeout=TIMEOUT_S)
    assert completed.returncode == 2
    assert "netbench needs at least 2 ranks, got 1" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_larger_allocations_measure_only_the_allreduce_over_every_rank(bench_python):
    # What a 4-node netbench run gets (plans.benchmark_args): ping-pong is the first two
    # ranks' pair, which the 2-node run measures, so only the all-reduce spans the rest.
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "--mca", "btl", "self,tcp",
               "--mca", "btl_tcp_if_include", "lo", str(bench_python), "-m", "containerbench.rank.netbench",
               "--max-bytes", "4096", "--target-bytes", "65536", "--no-pingpong"]
    completed = run_group(command, timeout=TIMEOUT_S)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    [result] = prefixed_json(completed.stdout.splitlines(), markers.RESULT)
    assert result["ranks"] == 3 and result["pingpong"] == []
    assert [entry["ranks"] for entry in result["allreduce"]] == [3] * 11  # 4 B .. 4 KiB
    assert all(math.isclose(e["busbw_GBps"], e["algbw_GBps"] * 4 / 3) for e in result["allreduce"])
