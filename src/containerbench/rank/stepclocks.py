"""How a harness times its steps (bench.measure's `clock`): when a step starts, when it has run, and what the
host waits on to read its loss.

    HostClock    CPUs: a step has run when its call returns and its loss is on the host.
    QueuedClock  TensorFlow on a GPU: steps queued one ahead, each timed from the last one's completion to its own.
    CudaClock    PyTorch on a GPU (torchbench.py): CUDA events around each step, its loss read a step later.

A clock has `lag` (how many steps are queued before one is read), `running()` (the context the steps run in),
`mark()`, `hold(loss)` and `seconds(start, end, held)`.
"""

from __future__ import annotations

import contextlib
import time

HOST, QUEUED = "host", "queued"
CHOICES = ("auto", HOST, QUEUED)


class HostClock:
    """A step has run when its call returns (the gradient exchange included) and its loss is on the host: both are
    inside the span timed. On a GPU this drains the device at every step: TensorFlow's device-to-host copy waits
    for all the device holds (TensorHandle::CopyToDevice's sync, GPUUtil::CopyGPUTensorToCPU), and the next step is
    queued only once Python has read this one and printed its line; hence QueuedClock and torchbench.CudaClock
    there."""
    name = HOST
    lag = 0
    running = staticmethod(contextlib.nullcontext)

    @staticmethod
    def mark():
        return time.perf_counter()

    @staticmethod
    def hold(loss):
        return float(loss)

    @staticmethod
    def seconds(start, end, held) -> float:
        return end - start


class QueuedClock:
    """TensorFlow on a GPU, which has no device events. The steps run under eager's asynchronous executor: a call
    returns once it is queued, and the executor's one thread runs what is queued in order (a step's function is
    done there once its kernels are queued on the device). The host queues step i, then an eager copy of its loss
    to the host (`hold`), then step i+1, and only then waits for step i's copy. The copy blocks the executor's
    thread until step i has run to its end (TensorHandle::CopyToDevice syncs the source device, and the copy itself
    waits on the compute stream, GPUUtil::CopyGPUTensorToCPU), so it waits for step i alone, and step i+1 is
    started as soon as it is done, with no Python between them. The device still empties at every step: it idles
    for the copy's round trip, the wake-up and the next step's dispatch up to its first kernel, where a loop that
    reads nothing would queue step i+1 while step i runs; what it no longer waits for is Python's loop, its read
    and its per-step line. (A copy inside the step would not end the step sooner: every value a tf.function returns
    is ordered after its stateful ops, the update among them, by auto_control_deps' mark_as_return.) This assumes
    the step returns its loss on the device: a loss already on the host needs no copy, and its read would not wait
    for the rest of the step, whose time would fall to the next (the times would still add up to the window). A
    step's time runs from the last step's loss reaching the host to its own: the steps tile the measured window.
    The loop's own work overlaps the steps, so harness_overhead_fraction comes out about 0 (a few microseconds
    below: the last warmup line's print)."""
    name = QUEUED
    lag = 1

    def __init__(self, tf):
        self.tf = tf
        self.previous: float | None = None

    @contextlib.contextmanager
    def running(self):
        self.previous = None
        self.tf.config.experimental.set_synchronous_execution(False)
        try:
            yield
        except BaseException:
            # The executor keeps an asynchronous step's error and raises it again at every wait: cleared, so the
            # switch back neither fails nor hides the error being raised.
            self.tf.experimental.async_clear_error()
            self.tf.config.experimental.set_synchronous_execution(True)
            raise
        self.tf.config.experimental.set_synchronous_execution(True)  # waits for everything queued

    @staticmethod
    def mark():
        return time.perf_counter()

    def hold(self, loss):
        """The loss copied to the host, queued behind its step: a handle, not waited on until seconds()."""
        with self.tf.device("/CPU:0"):
            return self.tf.identity(loss)

    def seconds(self, start, end, held) -> float:
        held.numpy()  # this step's completion (errors of an asynchronous step surface here)
        now = time.perf_counter()
        elapsed = now - (start if self.previous is None else self.previous)
        self.previous = now
        return elapsed


def for_tensorflow(tf, choice: str, gpus: bool, queues: bool):
    """The clock for a TensorFlow run: `choice` from --step-clock; auto is QueuedClock where the run has GPUs and
    its mode's step is this rank's own (`queues`; a parameter-server coordinator's steps are scheduled by its
    ClusterCoordinator; bench.parse_args refuses queued there), else HostClock, whose figures on CPUs are those of
    every recorded run."""
    if choice == QUEUED or (choice == "auto" and gpus and queues):
        return QueuedClock(tf)
    return HostClock
