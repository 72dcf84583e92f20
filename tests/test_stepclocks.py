"""Which clock times a TensorFlow run's steps (rank/stepclocks.py), what is refused (with what else a mode cannot
do), and both clocks against steps of known length (benchmarks/tf_step_clock.py --logic, in the benchmark venv)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from containerbench.rank import bench, stepclocks


@pytest.mark.parametrize(("choice", "gpus", "queues", "expected"), [
    ("auto", False, True, stepclocks.HostClock),  # every CPU run: the recorded runs' figures stand
    ("auto", True, True, stepclocks.QueuedClock),  # a GPU must not drain between steps
    ("auto", True, False, stepclocks.HostClock),  # a parameter-server coordinator's steps are its coordinator's
    ("host", True, True, stepclocks.HostClock),
    ("queued", False, True, stepclocks.QueuedClock),  # on CPUs, to set it beside the host clock
])
def test_the_clock_follows_the_devices_unless_one_is_asked_for(choice, gpus, queues, expected):
    clock = stepclocks.for_tensorflow(object(), choice, gpus, queues)
    assert clock is expected or isinstance(clock, expected)


def test_a_queued_clock_for_a_parameter_server_mode_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(["--mode", "parameter_server_async", "--step-clock", "queued"])
    assert raised.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(  # after the program's name, argparse's "error:"
        " error: --step-clock queued: mode parameter_server_async's steps are scheduled by its coordinator; "
        "allowed there: auto, host")
    assert bench.parse_args(["--step-clock", "queued"]).step_clock == "queued"  # horovod, the default mode


def test_float16_loss_scaling_under_parameter_servers_is_refused_in_one_line(capsys):
    """Keras' loss-scale optimizer refuses ParameterServerStrategy (keras/src/mixed_precision/loss_scale_optimizer.py,
    _raise_if_strategy_unsupported): said before TensorFlow starts, not as a traceback from build_model."""
    with pytest.raises(SystemExit):
        bench.parse_args(["--mode", "parameter_server", "--precision", "mixed_float16"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        " error: --precision mixed_float16: mode parameter_server cannot scale the loss (Keras' loss-scale optimizer "
        "refuses ParameterServerStrategy); allowed there: fp32, mixed_bfloat16")
    assert bench.parse_args(["--mode", "parameter_server", "--precision", "mixed_bfloat16"]).precision == (
        "mixed_bfloat16")


def test_an_unknown_clock_is_refused_with_the_allowed_ones(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--step-clock", "device"])
    refusal = capsys.readouterr().err.splitlines()[-1]
    assert "argument --step-clock: invalid choice: 'device'" in refusal
    assert all(f"'{allowed}'" in refusal for allowed in stepclocks.CHOICES)


def test_each_clock_reads_every_step_with_its_own_loss_and_times_it_as_it_ran(root, bench_python):
    """The clocks' bookkeeping on CPUs (what a GPU's streams do is not shown here): 8 steps of 200-360 ms, each
    stamped by its own graph (tf.timestamp), behind 50 ms of host work before each. A step misattributed (the next
    one waited for as well, the last one near zero) would be off by 200 ms or more; the bounds are half that and
    half the host's work, so a busy machine's delays of tens of milliseconds do not decide the test."""
    done = subprocess.run([sys.executable, "benchmarks/tf_step_clock.py", "--logic", "--ranks", "--bench-python",
                           str(bench_python)], cwd=root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("tf-clock-logic "))[15:])
    for name, clocked in found.items():
        assert clocked["losses"] == list(range(8)), (name, clocked)  # each step read with its own loss, in order
        assert len(clocked["measured"]) == len(clocked["true"]) == 6, (name, clocked)
        assert max(abs(m - t) for m, t in zip(clocked["measured"], clocked["true"])) < 0.1, (name, clocked)
    assert min(found["host"]["gaps"]) >= 0.05, found["host"]  # the 'device' waited for the host's work every step
    assert max(found["queued"]["gaps"]) < 0.025, found["queued"]  # never: the next step was already queued
