"""`benchmark.repetitions: auto`: which sweep points need more repetitions, and how many.

The workflow runs min_repetitions of every train point, then rounds: a round reads the records of the
points still going and decides, for each, whether the 95% interval of its mean images/s (Student's t
interval, the summary's ci95_low..ci95_high) is within +-target_ci_percent of the mean, or
max_repetitions ran. A point that is neither is asked for the runs its own spread says it needs: the
fewest n whose t(n-1) x CV / sqrt(n) reaches the target, the CV being the spread of its runs' means at
their steps (precision.py's S1, T1^2 + T2^2 / n2 of the two levels). An estimate from a few runs is
itself rough, so a round at most doubles a point's repetitions, and asks at least one more. A round's
file carries the points stopped earlier, so the last round says why every point stopped (the summary's
repetitions_stop). Failed and disturbed runs count as repetitions made but give no figure to the
interval, as in the summary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from containerbench import outputs
from containerbench.point import Point
from containerbench.precision import runs_for_mean
from containerbench.records import load_records
from containerbench.runtables import runs_table, summary_table
from containerbench.status import Status

INTERVAL = "95% Student's t interval of the mean images/s of the ok repetitions"


def _interval_and_spread(runs) -> tuple[float, int, float]:
    """From the summary's row of one point: its 95% interval of the mean as +- percent of that mean (nan:
    fewer than 2 ok runs), and the ok runs and their CV that the interval was made from."""
    row = summary_table(runs).iloc[0]
    half = (row["ci95_high"] - row["ci95_low"]) / 2
    half = 100 * half / row["images_per_sec_mean"] if row["images_per_sec_mean"] > 0 else math.nan
    return half, int(row["repetitions"]), row["cv_percent"]


def _interval_words(half: float) -> str:
    return f"ci95 +-{half:.3g}%" if not math.isnan(half) else "ci95 n/a (fewer than 2 ok runs)"


def asked_repetitions(made: int, ok_runs: int, cv_percent: float, target_ci_percent: float,
                      max_repetitions: int) -> int:
    """How many repetitions a point that goes on should have: the CV of its `ok_runs` says how many ok
    runs reach the target; the failed ones made so far are not made up for in advance. At least one
    more, at most twice `made`, never past max_repetitions."""
    wanted = made + 1
    if ok_runs >= 2 and not math.isnan(cv_percent):
        needed = runs_for_mean(cv_percent, target_ci_percent, most=max_repetitions)
        wanted = max(wanted, made + (needed or max_repetitions) - ok_runs)
    return min(wanted, 2 * made, max_repetitions)


def decide(records: list[dict], round_number: int, target_ci_percent: float, max_repetitions: int,
           previous: dict | None = None) -> dict:
    """Round `round_number`'s decision from the records of the points still going (all train points
    in the first round, with min_repetitions each; else those `previous` sent on, with the repetitions
    it asked for).

    Returns {"round", "target_ci_percent", "max_repetitions", "interval", "points": {point id:
    {"repetitions", "ok", "ci95_percent", "stop", "asked"}}, "next": [run ids of the repetitions
    asked for]}; a point whose "stop" is None goes on to "asked" repetitions. Points stopped in earlier
    rounds are carried over unchanged."""
    earlier = (previous or {}).get("points", {})
    carried = {point: entry for point, entry in earlier.items() if entry["stop"]}
    going = None if previous is None else {Point.id_of(run_id) for run_id in previous["next"]}
    expected = {point: entry.get("asked") or round_number for point, entry in earlier.items()}
    runs = runs_table(records)
    runs = runs.assign(point=runs["run_id"].map(Point.id_of))
    points, following = dict(carried), []
    for point, group in runs.groupby("point", sort=True):
        if point in carried or (going is not None and point not in going):
            continue
        made = int(group["repetition"].max())
        if made != expected.get(point, round_number):
            raise ValueError(f"round {round_number}: point {point} has {made} repetitions, "
                             f"expected {expected.get(point, round_number)}")
        half, measured, cv = _interval_and_spread(group)
        ok = int((group["status"] == Status.OK).sum())
        asked = None
        if ok == 0:  # failing every time: more repetitions would fail (or time out) the same way
            stop = f"no ok run in {made} repetition(s): not repeated further"
        elif half <= target_ci_percent:  # nan compares false: no interval yet, go on
            stop = f"target reached: {_interval_words(half)}"
        elif made >= max_repetitions:
            stop = f"max_repetitions ({max_repetitions}) reached: {_interval_words(half)}"
        else:
            stop, asked = None, asked_repetitions(made, measured, cv, target_ci_percent, max_repetitions)
            following += [Point.run_id_of(point, repetition) for repetition in range(made + 1, asked + 1)]
        points[point] = {"repetitions": made, "ok": ok,
                         "ci95_percent": None if math.isnan(half) else round(half, 4), "stop": stop, "asked": asked}
    missing = sorted((going or set()) - set(points))
    if missing:
        raise ValueError(f"round {round_number}: no records of {', '.join(missing)}")
    return {"round": round_number, "target_ci_percent": target_ci_percent, "max_repetitions": max_repetitions,
            "interval": INTERVAL, "points": dict(sorted(points.items())), "next": following}


def write_round(record_paths, round_number: int, target_ci_percent: float, max_repetitions: int, out: str | Path,
                previous: str | Path | None = None) -> dict:
    """decide() on the records at `record_paths` (records.load_records), written as JSON to `out`."""
    records, problems = load_records(record_paths)
    if problems:
        raise ValueError("unreadable records: " + "; ".join(f"{path}: {why}" for path, why in problems))
    earlier = json.loads(Path(previous).read_text()) if previous else None
    decision = decide(records, round_number, target_ci_percent, max_repetitions, earlier)
    outputs.write_text(out, json.dumps(decision, indent=1) + "\n")
    return decision


def stops(round_path: str | Path) -> dict[str, str]:
    """point id -> why its repetitions stopped, from the last round's file (for runtables.summary_table)."""
    points = json.loads(Path(round_path).read_text())["points"]
    return {point: entry["stop"] for point, entry in points.items() if entry["stop"]}
