"""The two levels of a point's spread (precision.py), checked on runs whose spread is known: records of a real
run with their step times drawn from a process level and a step level of set sizes."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from helpers import ROOT

from containerbench.precision import (
    cheapest_steps,
    levels,
    machine_seconds,
    overhead_half_width_percent,
    runs_for,
    step_times,
)
from containerbench.records import parse_log

RECORDED = ROOT / "tests" / "data" / "runs" / "train_bare-metal_tcp-loopback_1x2_b2_rep1.log"


@pytest.fixture(scope="module")
def two_rank_record():
    return parse_log(RECORDED)


def with_steps(record: dict, repetition: int, per_rank: list[np.ndarray], wall_s: float) -> dict:
    copied = copy.deepcopy(record)
    copied["run_id"] = record["run_id"].replace("_rep1", f"_rep{repetition}")
    copied["spec"]["repetition"] = repetition
    copied["wall_s"] = wall_s
    for rank, times in zip(copied["result"]["per_rank"], per_rank):
        rank["step_s"] = list(times)
    return copied


def test_a_step_lasts_as_long_as_its_slowest_rank(two_rank_record):
    record = with_steps(two_rank_record, 1, [np.array([1.0, 2.0, 3.0]), np.array([1.5, 1.0, 3.5])], 20.0)
    assert list(step_times(record)) == [1.5, 2.0, 3.5]


def test_the_two_levels_come_back_from_runs_drawn_with_them(two_rank_record):
    rng = np.random.default_rng(2013)
    processes, steps, between, within = 300, 40, 0.03, 0.05  # as fractions of the 0.2 s mean step
    records = []
    for repetition in range(1, processes + 1):
        process_mean = 0.2 * (1 + rng.normal(0, between))
        times = process_mean + 0.2 * rng.normal(0, within, steps)
        # Both ranks alike, so the slowest rank's step is the drawn one.
        records.append(with_steps(two_rank_record, repetition, [times, times - 1e-9], 12.0 + times.sum()))
    records.append({**records[0], "run_id": "failed_rep999", "status": "failed"})  # not counted
    [level] = levels(records).to_dict("records")
    assert level["runs"] == processes and level["steps"] == steps
    assert level["between_cv_percent"] == pytest.approx(100 * between, rel=0.15)
    assert level["within_cv_percent"] == pytest.approx(100 * within, rel=0.03)
    assert level["unmeasured_s"] == pytest.approx(12.0) and level["step_cost_s"] == pytest.approx(0.2, rel=0.01)


def test_the_cheapest_steps_a_run_are_the_ones_that_cost_least_at_a_fixed_precision():
    level = {"between_cv_percent": 2.0, "within_cv_percent": 8.0, "unmeasured_s": 12.0, "step_cost_s": 0.15}
    formula = cheapest_steps(level)
    # By brute force: the cost of reaching one variance of the mean, n1 (c1 + n2 c2) with n1 from the variance.
    variance = 0.5
    candidates = np.arange(1, 2001)
    cost = ((level["between_cv_percent"] ** 2 + level["within_cv_percent"] ** 2 / candidates) / variance
            * (level["unmeasured_s"] + candidates * level["step_cost_s"]))
    assert abs(formula - candidates[cost.argmin()]) <= 1
    assert math.isinf(cheapest_steps({**level, "between_cv_percent": 0.0}))


def test_the_runs_for_a_target_are_the_fewest_that_reach_it():
    level = {"between_cv_percent": 3.0, "within_cv_percent": 6.0, "unmeasured_s": 12.0, "step_cost_s": 0.15}
    runs = runs_for(level, 5.0, 10)
    assert overhead_half_width_percent(level, runs, 10) <= 5.0 < overhead_half_width_percent(level, runs - 1, 10)
    assert runs_for(level, 0.001, 10, most=50) is None
    assert machine_seconds(level, 3, 10) == pytest.approx(3 * (12.0 + 1.5))
