"""`repetitions: auto`: which points need another repetition, from recorded records of real tiny runs
given other rates (the workflow's own rounds: tests/test_workflow.py)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from scipy import stats

from containerbench import cli, repetitions
from containerbench.results import runs_table, summary_table

ONE = "train_bare-metal_tcp-loopback_1x1_b2"  # the recorded 1-rank run's point
TWO = "train_bare-metal_tcp-loopback_1x2_b2"


def repetition(recorded_runs, point: str, number: int, rate: float, status: str = "ok") -> dict:
    """The recorded run of `point` as its repetition `number`, measuring `rate` images/s."""
    copied = copy.deepcopy(recorded_runs[("train", 1 if point == ONE else 2)])
    copied["run_id"], copied["spec"]["repetition"] = f"{point}_rep{number}", number
    copied["result"]["images_per_sec"] = rate
    if status != "ok":
        copied["status"], copied["reasons"] = status, ["exit code 1"]
    return copied


def half_width_percent(rates) -> float:
    n, mean = len(rates), sum(rates) / len(rates)
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1))
    return 100 * stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n) / mean


def test_a_round_sends_on_only_the_points_whose_interval_is_too_wide(recorded_runs):
    tight, wide = [100.0, 101.0, 99.0], [100.0, 120.0, 80.0]
    records = [repetition(recorded_runs, ONE, i + 1, rate) for i, rate in enumerate(tight)]
    records += [repetition(recorded_runs, TWO, i + 1, rate) for i, rate in enumerate(wide)]
    first = repetitions.decide(records, 3, target_ci_percent=3, max_repetitions=4)
    assert half_width_percent(tight) == pytest.approx(2.48, abs=0.01)  # 4.303 * 1 / sqrt(3)
    assert first["points"][ONE] == {"repetitions": 3, "ok": 3, "ci95_percent": pytest.approx(2.4841, abs=1e-4),
                                    "stop": "target reached: ci95 +-2.48%", "asked": None}
    assert first["points"][TWO]["stop"] is None and first["points"][TWO]["asked"] == 4  # max_repetitions
    assert first["next"] == [f"{TWO}_rep4"]

    # The next round reads only the point still going; the stopped one is carried over.
    records = [r for r in records if r["run_id"].startswith(TWO)] + [repetition(recorded_runs, TWO, 4, 100.0)]
    last = repetitions.decide(records, 4, target_ci_percent=3, max_repetitions=4, previous=first)
    assert last["next"] == []
    assert last["points"][ONE] == first["points"][ONE]
    half_width = half_width_percent(wide + [100.0])
    assert last["points"][TWO]["stop"] == f"max_repetitions (4) reached: ci95 +-{half_width:.3g}%"


def test_failed_repetitions_count_but_give_no_interval(recorded_runs):
    records = [repetition(recorded_runs, ONE, 1, 100.0), repetition(recorded_runs, ONE, 2, 0.0, status="failed")]
    going = repetitions.decide(records, 2, target_ci_percent=50, max_repetitions=3)
    # One ok run gives no spread to size the next round by: one more repetition.
    assert going["points"][ONE] == {"repetitions": 2, "ok": 1, "ci95_percent": None, "stop": None, "asked": 3}
    records.append(repetition(recorded_runs, ONE, 3, 0.0, status="failed"))
    stopped = repetitions.decide(records, 3, target_ci_percent=50, max_repetitions=3, previous=going)
    assert stopped["points"][ONE]["stop"] == "max_repetitions (3) reached: ci95 n/a (fewer than 2 ok runs)"


def test_a_point_that_never_ran_ok_is_not_repeated_up_to_the_maximum(recorded_runs):
    # Say a runtime that always times out: each more repetition would cost its timeout, for nothing.
    records = [repetition(recorded_runs, ONE, n, 0.0, status="failed") for n in (1, 2, 3)]
    records += [repetition(recorded_runs, TWO, n, rate) for n, rate in ((1, 100.0), (2, 120.0), (3, 80.0))]
    decision = repetitions.decide(records, 3, target_ci_percent=2, max_repetitions=10)
    assert decision["points"][ONE] == {"repetitions": 3, "ok": 0, "ci95_percent": None,
                                       "stop": "no ok run in 3 repetition(s): not repeated further",
                                       "asked": None}
    # A CV of 20% would need over 10 runs for +-2%: the round doubles the point's 3, and no more.
    assert decision["next"] == [f"{TWO}_rep{n}" for n in (4, 5, 6)]


def test_a_round_asks_for_the_runs_the_points_spread_needs_at_once(recorded_runs):
    """Kalibera and Jones: the repetitions from the variance measured. A CV of 4% over 3 runs reaches +-5%
    at 5 runs (t(4) x 4 / sqrt(5) = 4.97), so the round asks for repetitions 4 and 5 together; the next
    round reads all five."""
    rates = [100.0, 104.0, 96.0]
    records = [repetition(recorded_runs, ONE, n + 1, rate) for n, rate in enumerate(rates)]
    first = repetitions.decide(records, 3, target_ci_percent=5, max_repetitions=10)
    assert half_width_percent(rates) > 5 and half_width_percent([100.0, 104.0, 96.0, 100.0, 100.0]) <= 5
    assert first["points"][ONE]["asked"] == 5 and first["next"] == [f"{ONE}_rep4", f"{ONE}_rep5"]
    records += [repetition(recorded_runs, ONE, n, 100.0) for n in (4, 5)]
    last = repetitions.decide(records, 4, target_ci_percent=5, max_repetitions=10, previous=first)
    assert last["points"][ONE]["repetitions"] == 5 and last["points"][ONE]["stop"].startswith("target reached: ")
    with pytest.raises(ValueError, match=f"round 4: point {ONE} has 4 repetitions, expected 5"):
        repetitions.decide(records[:4], 4, target_ci_percent=5, max_repetitions=10, previous=first)


def test_a_round_missing_a_point_it_should_read_is_refused(recorded_runs):
    previous = {"points": {ONE: {"repetitions": 2, "ok": 2, "ci95_percent": 80.0, "stop": None}},
                "next": [f"{ONE}_rep3"]}
    records = [repetition(recorded_runs, TWO, n, 10.0) for n in (1, 2, 3)]
    with pytest.raises(ValueError, match=f"round 3: no records of {ONE}"):
        repetitions.decide(records, 3, target_ci_percent=5, max_repetitions=5, previous=previous)


def test_the_summary_says_why_each_point_stopped_only_with_auto(recorded_runs, tmp_path):
    records = [repetition(recorded_runs, point, n, rate) for point in (ONE, TWO) for n, rate in ((1, 10.0), (2, 11.0))]
    paths = []
    for record in records:
        paths.append(tmp_path / f"{record['run_id']}.json")
        paths[-1].write_text(json.dumps(record))
    out = tmp_path / "round-2.json"
    assert cli.main(["round", *map(str, paths), "--round", "2", "--target-ci-percent", "100", "--max-repetitions", "2",
                     "--out", str(out)]) == 0
    stops = repetitions.stops(out)
    assert set(stops) == {ONE, TWO} and all(stop.startswith("target reached: ci95 +-") for stop in stops.values())
    summary = summary_table(runs_table(records), stops)
    assert list(summary["repetitions_stop"]) == [stops[ONE], stops[TWO]]
    assert "repetitions_stop" not in summary_table(runs_table(records))  # fixed repetitions: as before
    # Through the command line the rule runs: the column in summary.csv and summary.md.
    assert cli.main(["tables", *map(str, paths), "--repetition-stops", str(out), "--out-dir", str(tmp_path / "t")]) == 0
    assert stops[ONE] in (tmp_path / "t" / "summary.csv").read_text()
    assert stops[ONE] in (tmp_path / "t" / "summary.md").read_text()
