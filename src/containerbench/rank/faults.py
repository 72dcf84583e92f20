"""Faults a test can switch on in a real run, to show that the workflow sees them for what they are.

Test aids only: set CONTAINERBENCH_TEST_FAULT in a run's environment (a fabric's `env` in a test
config), never in a site's. Each fault is real behaviour of the real benchmark, not an edited log.

    hang-at-exit   rank 0 prints its whole result, then does not exit (as a run whose MPI teardown
                   deadlocks): execution.ExitGuard must stop it and keep the measurement.
"""

from __future__ import annotations

import os
import time

VARIABLE = "CONTAINERBENCH_TEST_FAULT"
FAULTS = ("hang-at-exit",)


def switched_on(fault: str) -> bool:
    assert fault in FAULTS, fault
    return os.environ.get(VARIABLE) == fault


def after_result() -> None:
    """Where rank 0 has printed its result."""
    if switched_on("hang-at-exit"):
        while True:  # stopped from outside, as a deadlocked teardown would have to be
            time.sleep(60)
