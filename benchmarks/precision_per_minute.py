"""What a sweep's design buys: from a sweep's records, each training point's step-time spread between
processes and within one, what a run costs unmeasured and per step (precision.py, Kalibera and Jones'
two levels), and the container overhead's 95% half-width and machine time for the design that ran
against the cheapest design that reaches the target.

    .venv/bin/python benchmarks/precision_per_minute.py [results/runs/*.json] [--target 5]

Prints a line per point and the whole sweep's minutes; asserts nothing.
"""

from __future__ import annotations

import argparse
import glob
import math
import sys

from containerbench.precision import (
    cheapest_steps,
    levels,
    machine_seconds,
    overhead_half_width_percent,
    runs_for,
)
from containerbench.records import load_records

MOST_STEPS = 1000  # where the processes add no spread, any number of steps is cheaper than another run


def design(level: dict, runs: int | None, steps: int) -> str:
    if runs is None:
        return f"{steps} steps: out of reach"
    return (f"{runs} runs x {steps} steps: +-{overhead_half_width_percent(level, runs, steps):.1f}%, "
            f"{machine_seconds(level, runs, steps) / 60:.1f} min")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="*", help="record files (default: results/runs/*.json)")
    parser.add_argument("--target", type=float, default=5.0, help="overhead half-width to reach, percent")
    args = parser.parse_args()
    paths = args.records or sorted(glob.glob("results/runs/*.json"))
    records, problems = load_records(paths)
    for path, why in problems:
        print(f"skipped {path}: {why}", file=sys.stderr)
    table = levels(records)
    print(f"records: {len(records)}; training points with 2+ ok runs: {len(table)}; target +-{args.target:g}%")
    if table.empty:
        print("nothing to tell: a point's spread needs 2 or more ok runs of it")
        return 0
    totals = {"ran": 0.0, "target": 0.0}
    for level in table.to_dict("records"):
        cheapest = cheapest_steps(level)
        steps = min(MOST_STEPS, max(2, math.ceil(cheapest))) if math.isfinite(cheapest) else MOST_STEPS
        at_target = runs_for(level, args.target, steps)
        print(f"{level['point']}: step {level['step_s_mean']:.3f} s, between processes "
              f"{level['between_cv_percent']:.2f}%, within {level['within_cv_percent']:.2f}%, unmeasured "
              f"{level['unmeasured_s']:.1f} s a run; cheapest steps a run {cheapest:.0f}")
        print(f"  ran      {design(level, level['runs'], level['steps'])}")
        print(f"  target   {design(level, at_target, steps)}")
        totals["ran"] += machine_seconds(level, level["runs"], level["steps"])
        totals["target"] += machine_seconds(level, at_target or 0, steps)
    print(f"sweep, every point above: ran {totals['ran'] / 60:.1f} min, at the target {totals['target'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
