"""The step clocks of the training harnesses (bench.measure, shared by TensorFlow's and PyTorch's), shown on a
device simulated on the CPU: a call queues a step on the device's own thread and returns at once, and reading
the step's loss waits for that step alone, as TensorFlow's eager calls on a GPU behave. No GPU with TensorFlow
was at hand to time the real one (the lent GPU machines have PyTorch only): this proves the logic, not the GPU."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

import pytest

from containerbench.rank import bench

STEP_S = 0.1  # the simulated device's time per step: far above a host's scheduling delay, even a loaded one


class Loss:
    def __init__(self, done: threading.Event, value: float):
        self.done, self.value = done, value

    def __float__(self) -> float:
        self.done.wait()
        return self.value


class Device:
    """One stream: steps run in the order queued, one at a time, each for STEP_S."""

    def __init__(self):
        self.queue, self.ran = queue.Queue(), []  # ran: (queued, started, ended) per step, in order
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while (item := self.queue.get()) is not None:
            queued, done = item
            started = time.perf_counter()
            time.sleep(STEP_S)
            self.ran.append((queued, started, time.perf_counter()))
            done.set()

    def step(self) -> Loss:
        done = threading.Event()
        self.queue.put((time.perf_counter(), done))
        return Loss(done, 10.0 - self.queue.qsize() - len(self.ran))

    def stop(self):
        self.queue.put(None)
        self.thread.join(timeout=10)


@pytest.fixture
def device():
    simulated = Device()
    yield simulated
    simulated.stop()


ARGS = SimpleNamespace(warmup_steps=2, steps=4)


def test_the_completion_clock_times_each_step_while_the_next_is_already_queued(device, capsys):
    warmup, steps, overhead, _, losses = bench.measure(device.step, tuple, ARGS, 0, 8, bench.CompletionClock())
    assert len(warmup) == 2 and len(steps) == 4 and len(losses) == 6
    # The device never waited for the host: every step was queued before the one ahead of it ended.
    assert all(queued < previous_end for (queued, _, _), (_, _, previous_end) in zip(device.ran[1:], device.ran))
    # So each step's time is the device's own (the first warmup step's includes its queueing, as tracing).
    assert steps == pytest.approx([STEP_S] * 4, abs=0.05)
    assert abs(overhead) < 0.05  # the loop's wall time is the steps' own
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["warmup 1/2", "warmup 2/2", "step 1/4", "step 2/4",
                                                              "step 3/4", "step 4/4"]


def test_reading_every_loss_at_once_drains_the_device_between_steps(device):
    # The host clock (right on a CPU, where a call returns with its step done): on this device each step
    # is queued only after the one before has ended, which is why GPUs get the completion clock.
    _, steps, _, _, _ = bench.measure(device.step, tuple, ARGS, 1, 8, bench.HostClock)
    assert all(queued >= previous_end for (queued, _, _), (_, _, previous_end) in zip(device.ran[1:], device.ran))
    assert steps == pytest.approx([STEP_S] * 4, abs=0.05)


@pytest.mark.parametrize("gpus, measures_all_ranks, clock", [
    (["GPU:0"], True, bench.CompletionClock),
    ([], True, bench.HostClock),  # a CPU: the call returns with the step done
    (["GPU:0"], False, bench.HostClock),  # a parameter-server coordinator's step joins its workers
])
def test_the_clock_follows_the_device_and_the_mode(gpus, measures_all_ranks, clock):
    chosen = bench.clock_for(SimpleNamespace(measures_all_ranks=measures_all_ranks), gpus)
    assert isinstance(chosen, clock) or chosen is clock
