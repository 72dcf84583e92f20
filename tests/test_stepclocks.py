"""Which clock times a TensorFlow run's steps (rank/stepclocks.py), and what is refused. The clocks themselves are
timed against steps of known length in test_benchmarks (benchmarks/tf_step_clock.py, in the benchmark venv)."""

from __future__ import annotations

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


def test_an_unknown_clock_is_refused_with_the_allowed_ones(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--step-clock", "device"])
    assert "argument --step-clock: invalid choice: 'device' (choose from 'auto', 'host', 'queued')" in (
        capsys.readouterr().err)
