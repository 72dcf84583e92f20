"""Faults a test can switch on in a real run, to show that the workflow sees them for what they are.

Test aids only: set CONTAINERBENCH_TEST_FAULT in a run's environment (a fabric's `env` in a test
config), never in a site's. Each fault is real behaviour of the real benchmark, not an edited log.

    hang-at-exit   rank 0 prints its whole result, then does not exit (as a run whose MPI teardown
                   deadlocks): execution.ExitGuard must stop it and keep the measurement.
    summed-gradients-on-rank-1
                   Horovod mode: rank 1 takes part in every all-reduce but applies the sum of the
                   ranks' gradients instead of their mean (the classic op=Sum slip), so its weights
                   drift from the others': the record must be invalid (records.judge_weights).
"""

from __future__ import annotations

import os
import time

VARIABLE = "CONTAINERBENCH_TEST_FAULT"
FAULTS = ("hang-at-exit", "summed-gradients-on-rank-1")


def switched_on(fault: str) -> bool:
    assert fault in FAULTS, fault
    return os.environ.get(VARIABLE) == fault


def after_result() -> None:
    """Where rank 0 has printed its result."""
    if switched_on("hang-at-exit"):
        while True:  # stopped from outside, as a deadlocked teardown would have to be
            time.sleep(60)


def gradient_exchange(exchange, rank: int, size: int):
    """The rank's gradient exchange (Horovod's averaging all-reduce) as is, or, with
    summed-gradients-on-rank-1 on rank 1, its averaged gradients times the number of ranks (their sum)."""
    if rank != 1 or not switched_on("summed-gradients-on-rank-1"):
        return exchange

    def summed(gradients):
        return [None if gradient is None else gradient * size for gradient in exchange(gradients)]

    return summed
