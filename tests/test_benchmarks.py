"""The speed scripts run, in their quick settings, and print their figures.

Timings are machine-dependent and are read, never asserted: these tests only
prove the scripts work, so the figures in the README can be reproduced.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
from helpers import measured

from containerbench.processes import run_group

pytestmark = pytest.mark.slow


def run(argv, root, timeout=900):
    done = run_group(argv, cwd=root, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_harness_speed_compares_ours_with_horovod_and_keras(root, bench_python):
    out = run([str(bench_python), "benchmarks/harness_speed.py", "--quick"], root)
    assert re.search(r"^1 rank\(s\): ours .* horovod .* keras ", out, re.M)
    assert re.search(r"ours/horovod = \d+\.\d{3} \(95% CI \d+\.\d{3}\.\.\d+\.\d{3}\)\s+ours/keras = \d+\.\d{3}", out)
    assert re.search(r"^2 rank\(s\): ours .* horovod ", out, re.M) and out.count("harness overhead per step") == 2


def test_tf_peer_speed_sets_our_harness_against_tf_cnn_benchmarks(root, bench_python):
    out = run([sys.executable, "benchmarks/tf_peer_speed.py", "--quick", "--causes", "--bench-python",
               str(bench_python)], root)
    for method in ("ours", "peer"):  # the peer's rate is the vendored tf_cnn_benchmarks' own "total images/sec"
        assert re.search(rf"^tf-peer: 1 rank\(s\) \(unbound\) {method} +\d+\.\d\d img/s \(CV nan%; runs: \d+\.\d\d\)$",
                         out, re.M), out
    assert re.search(r"^tf-peer: 1 rank\(s\) ours/peer \d\.\d{3} \(nan\.\.nan, 1 paired rounds, paired 95%\), n/a: ",
                     out, re.M), out
    # The rebuilt network is ResNet-50 as the peer builds it: each of its 53 convolutions, every one followed by a
    # batch norm, loses its bias (26,560 weights); the batch norms keep scale and offset, as the peer's do.
    assert re.search(r"one core: keras +step \d\.\d{3} s \(median\), 214 trainable tensors, 25,636,712 weights$",
                     out, re.M), out
    assert re.search(r"one core: peer_layers step \d\.\d{3} s \(median\), 161 trainable tensors, 25,610,152 "
                     r"weights$", out, re.M), out
    assert re.search(r"^tf-peer: model definition: Keras' step / the peer's layer choices' \d\.\d{3} \((\d+\.\d{3}|nan)"
                     r"\.\.(\d+\.\d{3}|nan), 2 paired steps, paired 95%\)$", out, re.M), out


def test_torch_harness_speed_compares_ours_with_a_plain_ddp_loop(root, torch_python):
    out = run([str(torch_python), "benchmarks/torch_harness_speed.py", "--quick"], root)
    for ranks in (1, 2):
        assert re.search(rf"^{ranks} rank\(s\) on cpu: ours \d+\.\d\d img/s, reference DDP loop \d+\.\d\d img/s; "
                         r"ratio ours/reference \d\.\d{3}; harness overhead per step \d+\.\d\d%$", out, re.M), out
    # One process needs no DDP: at one rank the tutorial's loop also runs without it, and only there.
    assert re.findall(r"^(\d) rank\(s\) on cpu: the reference loop without DDP \d+\.\d\d img/s; ratio ours/plain "
                      r"\d\.\d{3}$", out, re.M) == ["1"], out


def test_dag_speed_plans_a_thousand_run_sweep(root):
    out = run([sys.executable, "benchmarks/dag_speed.py", "--tries", "1"], root)
    assert re.search(r"snakemake -n, 1081 benchmark runs: \d+\.\d\d s .* time/target = \d", out)


def test_aggregate_times_the_tables(root, tiny_runs, tmp_path):
    record = tmp_path / "record.json"
    # The aggregation of ok runs is what is timed: a template the steal flagged (test_bench asserts its cause) stands in
    # as an ok one, or every copy would be left out of the figures and the timing would skip their arithmetic.
    record.write_text(json.dumps({**tiny_runs[("train", 2)], "status": "ok", "reasons": []}))
    out = run([sys.executable, "benchmarks/aggregate.py", "--records", "2000", "--from", str(record)], root)
    assert out.startswith("records: 2000") and re.search(r"^total: .* records/s$", out, re.M)


def test_ps_async_sets_asynchronous_parameter_servers_against_synchronous_rounds(root, bench_python):
    out = run([sys.executable, "benchmarks/ps_async.py", "--quick", "--bench-python", str(bench_python)], root)
    for mode in ("parameter_server", "parameter_server_async"):
        assert re.search(rf"^ps-async: 2 workers \(a core per rank\) {mode} +\d+\.\d\d img/s \(CV nan%\), loss at "
                         r"equal images \d+\.\d{4} \(runs: \d+\.\d{4}\), staleness \d\.\d\d$", out, re.M), out
    assert re.search(r"^ps-async: 2 workers async/sync \d+\.\d{3} \(nan\.\.nan, Fieller 95%\), n/a", out, re.M), out


def test_telemetry_cost_prints_the_samplers_share_of_a_core_and_the_ratio(root, bench_python):
    out = run([sys.executable, "benchmarks/telemetry_cost.py", "--quick", "--bench-python", str(bench_python)], root)
    assert re.search(r"^  every 0\.5 s: \d+\.\d{3}% of one core$", out, re.M)
    assert re.search(r"^  with / without\s+\d+\.\d{3}$", out, re.M)


def test_fleet_speed_plans_and_judges_a_fleet_and_finds_what_it_slowed(root):
    out = run([sys.executable, "benchmarks/fleet_speed.py", "--nodes", "64", "--tries", "1"], root)
    assert re.search(r"^plan, 64 nodes: 96 links in \d rounds, 160 jobs: \d+\.\d{3} s .* time/target = \d", out, re.M)
    # The workflow's DAG: the node jobs in one allocation of 64 nodes, then each of 3 rounds of links in one.
    assert re.search(r"^snakemake -n validate_nodes, 64 nodes: 64 node and 96 link jobs in 4 allocations \(Slurm "
                     r"submissions\), \d+ workflow jobs in all: \d+\.\d\d s ", out, re.M), out
    assert re.search(r"^verdict, 64 nodes x 3 repetitions \(\d+ records\): \d+\.\d{3} s .* time/target", out, re.M)
    slowed = re.search(r"failed nodes: (\S+) \(slowed: (\S+)\); bad links: (\S+) \(slowed: (\S+)\)", out)
    assert slowed and slowed[1] == slowed[2] and slowed[3] == slowed[4], out


def test_history_speed_times_compare_over_stored_records(root):
    out = run([sys.executable, "benchmarks/history_speed.py", "--records", "2000", "--tries", "1"], root)
    assert re.search(r"^compare over 2000 stored records: \d+\.\d\d s \(target 2 s, time/target = \d+\.\d\d\)$",
                     out, re.M)
    assert re.search(r"^variables: 200; significant: \d+ of the 50 made 5% faster", out, re.M)


def test_killing_the_tables_store_and_report_steps_never_leaves_a_partial_file(root):
    out = run([sys.executable, "benchmarks/atomic_outputs.py", "--kills", "8", "--records", "60"], root)
    assert re.search(r"^8 kills \(seed 34\): \d+ while the step ran, \d+ while it was writing .*; "
                     r"partial outputs read back: 0$", out, re.M), out


def test_precision_per_minute_reads_a_sweeps_records_and_prints_each_design(root, tiny_runs, tmp_path):
    # Two repetitions of a real 2-rank run, the second 5% slower in every step: a point of two processes.
    record = tiny_runs[("train", 2)]
    assert measured(record), record["reasons"]
    for repetition, scale in ((1, 1.0), (2, 1.05)):
        copied = json.loads(json.dumps(record))
        # Made-up repetitions of one real run: the script's arithmetic over two ok runs is what is tested,
        # so a copy of a run flagged disturbed (its cause asserted above) stands in as an ok one.
        copied.update(status="ok", reasons=[])
        copied["run_id"] = re.sub(r"_rep\d+$", f"_rep{repetition}", record["run_id"])
        for rank in copied["result"]["per_rank"]:
            rank["step_s"] = [scale * step for step in rank["step_s"]]
        (tmp_path / f"{copied['run_id']}.json").write_text(json.dumps(copied))
    out = run([sys.executable, "benchmarks/precision_per_minute.py", *map(str, sorted(tmp_path.glob("*.json")))],
              root)
    assert out.startswith("records: 2; training points with 2+ ok runs: 1; target +-5%")
    assert re.search(r"^train_bare-metal_\S+: step \d+\.\d{3} s, between processes \d+\.\d\d%, within "
                     r"\d+\.\d\d%, unmeasured \d+\.\d s a run; cheapest steps a run (\d+|inf)$", out, re.M), out
    assert re.search(r"^  ran      2 runs x \d+ steps: \+-\d+\.\d%, \d+\.\d min$", out, re.M), out
    assert re.search(r"^sweep, every point above: ran \d+\.\d min, at the target \d+\.\d min$", out, re.M), out



def test_tf_step_clock_sets_the_two_clocks_side_by_side(root, bench_python):
    """The quick case of benchmarks/tf_step_clock.py's ResNet-50 runs (its --logic is test_stepclocks')."""
    out = run([sys.executable, "benchmarks/tf_step_clock.py", "--quick", "--bench-python", str(bench_python)], root)
    for clock in ("host", "queued"):  # each run's record names its clock (the script checks it)
        assert re.search(rf"^tf-clock: 1 rank\(s\) {clock} +\d+\.\d\d img/s \(CV nan%; runs: \d+\.\d\d\)$", out,
                         re.M), out
    assert re.search(r"^tf-clock: 1 rank\(s\) queued/host \d\.\d{3} \(nan\.\.nan, 1 paired rounds", out, re.M), out
