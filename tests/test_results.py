"""Records -> tables: recorded records of real tiny runs, and variants of them for the edge cases."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pandas as pd
import pytest

from containerbench.records import load_records
from containerbench.results import (build_tables, markdown_summary, netbench_table,
                                    runs_table, summary_table, write_tables)


def variant(record: dict, run_id: str, rate: float | None = None, repetition: int | None = None, status=None,
            **spec) -> dict:
    """A copy of a real record as another repetition or point (spec keys), with its rate set to `rate`."""
    copied = copy.deepcopy(record)
    copied["run_id"] = run_id
    copied["spec"].update(spec)
    if repetition is not None:
        copied["spec"]["repetition"] = repetition
    if rate is not None:
        copied["result"]["images_per_sec"] = rate
    if status is not None:
        copied["status"], copied["reasons"] = status, ["exit code 1"]
    return copied


@pytest.fixture
def five_runs(recorded_runs):
    one, two = recorded_runs[("train", 1)], recorded_runs[("train", 2)]
    return [
        variant(one, "one-rep1", 10.0, 1), variant(one, "one-rep2", 12.0, 2), variant(one, "one-rep3", 11.0, 3),
        variant(two, "two-rep1", 18.0, 1), variant(two, "two-rep2", 99.0, 2, status="failed"),
    ]


def test_summary_has_median_spread_and_scaling_per_point(five_runs):
    summary = summary_table(runs_table(five_runs)).set_index("ranks")
    one, two = summary.loc[1], summary.loc[2]
    assert one["repetitions"] == 3 and one["failed_or_invalid"] == 0
    assert one["images_per_sec_median"] == 11.0
    assert one["images_per_sec_std"] == pytest.approx(1.0)
    assert one["cv_percent"] == pytest.approx(100 / 11)
    # 95% CI with Student's t, 2 degrees of freedom: 4.303 * 1 / sqrt(3)
    assert one["ci95_low"] == pytest.approx(11 - 4.302653 / np.sqrt(3), rel=1e-5)
    assert one["speedup"] == 1.0 and one["scaling_efficiency_percent"] == 100.0
    # Rank 2: the failed repetition is counted but kept out of every statistic.
    assert two["repetitions"] == 1 and two["failed_or_invalid"] == 1
    assert two["images_per_sec_median"] == 18.0
    assert np.isnan(two["images_per_sec_std"]) and np.isnan(two["ci95_low"])  # one repetition: no spread
    assert two["speedup"] == pytest.approx(18 / 11)
    assert two["scaling_efficiency_percent"] == pytest.approx(100 * 18 / 11 / 2)


def test_a_point_whose_runs_all_failed_still_shows_up(recorded_runs):
    failed = variant(recorded_runs[("train", 2)], "two-failed", status="failed")
    summary = summary_table(runs_table([failed]))
    assert len(summary) == 1
    assert summary.loc[0, "repetitions"] == 0 and summary.loc[0, "failed_or_invalid"] == 1
    assert np.isnan(summary.loc[0, "images_per_sec_median"]) and np.isnan(summary.loc[0, "scaling_efficiency_percent"])


def test_runs_table_traces_every_row_to_its_log(recorded_runs):
    runs = runs_table([recorded_runs[("train", 1)], recorded_runs[("train", 2)]])
    assert list(runs["ranks"]) == [1, 2]
    for _, row in runs.iterrows():
        assert row["log"].endswith(f"{row['run_id']}.log")
        assert row["rank_images_per_sec_min"] <= row["images_per_sec"]
        assert row["peak_host_memory_gib"] > 0.1


def test_netbench_table_is_the_long_form_of_the_curves(recorded_runs):
    table = netbench_table([recorded_runs[("netbench", 2)]])
    pingpong = table[table["test"] == "pingpong"]
    assert list(pingpong["bytes"]) == [2**k for k in range(17)]
    assert (pingpong["latency_us"] > 0).all()
    assert table[table["test"] == "allreduce"]["busbw_GBps"].gt(0).all()


def test_container_overhead_with_interval_and_significance(recorded_runs):
    one = recorded_runs[("train", 1)]
    records = [variant(one, f"bare{i}", rate, i) for i, rate in enumerate([100.0, 102.0, 98.0], 1)]
    records += [variant(one, f"pod{i}", rate, i, runtime="podman") for i, rate in enumerate([90.0, 91.0, 89.0], 1)]
    records += [variant(one, f"ch{i}", rate, i, runtime="charliecloud") for i, rate in enumerate([99.0, 103.0, 98.0], 1)]
    overhead = build_tables(records)["overhead"].set_index("runtime")
    podman, charliecloud = overhead.loc["podman"], overhead.loc["charliecloud"]
    assert podman["overhead_percent"] == pytest.approx(10.0)  # (100 - 90) / 100
    assert podman["overhead_ci95_low"] > 0 and podman["significance"] == "significant"
    assert charliecloud["overhead_percent"] == pytest.approx(0.0)
    assert charliecloud["overhead_ci95_low"] < 0 < charliecloud["overhead_ci95_high"]
    assert charliecloud["significance"] == "not significant"


def test_zero_spread_on_both_sides_gives_no_interval_and_no_verdict(recorded_runs):
    # Issue 13: with identical repetitions the interval has zero width; it is not "significant".
    one = recorded_runs[("train", 1)]
    records = [variant(one, f"bare{i}", 100.0, i) for i in (1, 2)]
    records += [variant(one, f"pod{i}", 99.0, i, runtime="podman") for i in (1, 2)]
    [row] = build_tables(records)["overhead"].to_dict("records")
    assert row["overhead_percent"] == pytest.approx(1.0)
    assert np.isnan(row["overhead_ci95_low"]) and np.isnan(row["overhead_ci95_high"])
    assert row["significance"] == "n/a: no spread in either side's repetitions"


def test_the_step_time_median_of_an_even_count_is_the_mean_of_the_middle_two(recorded_runs):
    record = copy.deepcopy(recorded_runs[("train", 1)])
    record["result"]["per_rank"] = [dict(record["result"]["per_rank"][0], step_s=[0.4, 0.1, 0.3, 0.2])]
    assert runs_table([record]).loc[0, "step_s_median"] == pytest.approx(0.25)  # not the upper median 0.3


def test_overhead_is_refused_between_different_benchmarks(recorded_runs):
    one = recorded_runs[("train", 1)]
    other = variant(one, "pod1", 90.0, 1, runtime="podman")
    other["result"]["provenance"] = dict(other["result"]["provenance"], hash="different0000000",
                                         packages={**other["result"]["provenance"]["packages"], "tensorflow-cpu": "2.16.2"})
    overhead = build_tables([variant(one, "bare1", 100.0, 1), other])["overhead"]
    assert overhead.loc[0, "note"] == "not comparable: packages differ: tensorflow-cpu 2.15.1 vs 2.16.2"
    assert np.isnan(overhead.loc[0, "overhead_percent"])


def test_overhead_without_a_bare_metal_baseline_says_so(recorded_runs):
    overhead = build_tables([variant(recorded_runs[("train", 1)], "pod1", 90.0, 1, runtime="podman")])["overhead"]
    assert overhead.loc[0, "note"] == "no bare-metal baseline at this point"


def test_fabric_ratio_and_input_overhead_at_the_same_point(recorded_runs):
    two = recorded_runs[("train", 2)]
    records = [variant(two, "ib", 130.0, 1, fabric="infiniband"), variant(two, "eth", 100.0, 1, fabric="ethernet"),
               variant(two, "ib-real", 104.0, 1, fabric="infiniband", data="real")]
    tables = build_tables(records)
    fabrics = tables["fabrics"]
    synthetic = fabrics[fabrics["data"] == "synthetic"].iloc[0]
    assert (synthetic["faster_fabric"], synthetic["slower_fabric"]) == ("infiniband", "ethernet")
    assert synthetic["ratio"] == pytest.approx(1.3)
    inputs = tables["input"]
    assert len(inputs) == 1 and inputs.loc[0, "fabric"] == "infiniband"
    assert inputs.loc[0, "input_overhead_percent"] == pytest.approx(20.0)  # (130 - 104) / 130


def test_memory_per_batch_and_the_study_table(recorded_runs):
    tables = build_tables([recorded_runs[("train", 1)], recorded_runs[("train", 2)]])
    memory = tables["memory"]
    assert list(memory["batch_size"]) == [2] and memory.loc[0, "runs"] == 2
    assert 0.1 < memory.loc[0, "peak_host_memory_gib"] < 16
    table1 = tables["table1"]
    assert list(table1.columns) == ["ranks", "mode", "data", "runtime", "fabric", "batch/rank", "img/s", "std"]
    assert list(table1["ranks"]) == [1, 2] and set(table1["mode"]) == {"horovod"}
    markdown = markdown_summary(tables)
    assert re.search(r"^\|\s+ranks \| mode\s+\| data\s+\|", markdown, re.M)
    assert "### Container overhead vs bare metal (%)" in markdown and "_none_" in markdown


def test_corrupt_and_truncated_records_are_reported_and_skipped(recorded_runs, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(recorded_runs[("train", 1)]))
    truncated = tmp_path / "truncated.json"
    truncated.write_text(good.read_text()[:200])
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"hello": 1}')
    records, problems = load_records([good, truncated, foreign])
    assert [r["run_id"] for r in records] == [recorded_runs[("train", 1)]["run_id"]]
    assert {p for p, _ in problems} == {str(truncated), str(foreign)}
    tables = write_tables([good, truncated, foreign], tmp_path)
    failures = pd.read_csv(tmp_path / "failures.csv")
    assert set(failures["status"]) == {"unreadable"} and len(failures) == 2
    assert len(tables["summary"]) == 1
