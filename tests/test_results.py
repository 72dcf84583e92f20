"""Records -> tables: recorded records of real tiny runs, and variants of them for the edge cases."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pandas as pd
import pytest

from containerbench.comparisons import ONE_NODE_NOTE, headline
from containerbench.intervals import ratio_interval, t_quantile
from containerbench.records import load_records
from containerbench.results import (
    build_tables,
    markdown_summary,
    netbench_table,
    runs_table,
    summary_table,
    write_tables,
    write_tensorboard,
)


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


def test_a_disturbed_run_is_counted_apart_from_the_failed_and_invalid_ones(recorded_runs):
    one = recorded_runs[("train", 1)]
    runs = [variant(one, "ok", 10.0, 1), variant(one, "disturbed", 8.0, 2, status="disturbed"),
            variant(one, "failed", 9.0, 3, status="failed"), variant(one, "invalid", 9.5, 4, status="invalid")]
    [row] = summary_table(runs_table(runs)).to_dict("records")
    assert (row["repetitions"], row["failed_or_invalid"], row["disturbed"]) == (1, 2, 1)
    assert row["images_per_sec_median"] == 10.0  # only the ok run is a figure


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
    assert set(table["backend"]) == {"mpi"}  # the recorded run predates the field: MPI's own


def test_netbench_curves_over_torch_distributed_stand_apart_from_mpis(recorded_runs, tmp_path):
    mpi = recorded_runs[("netbench", 2)]
    gloo = variant(mpi, "netbench-gloo", framework="pytorch")
    gloo["result"]["backend"] = "gloo"
    table = netbench_table([mpi, gloo])
    assert table.groupby("backend")["run_id"].unique().to_dict() == {
        "gloo": ["netbench-gloo"], "mpi": [mpi["run_id"]]}
    from containerbench.report import network_plot

    assert network_plot(table).startswith("data:image/png;base64,")


def test_container_overhead_with_interval_and_significance(recorded_runs):
    one = recorded_runs[("train", 1)]
    records = [variant(one, f"bare{i}", rate, i) for i, rate in enumerate([100.0, 102.0, 98.0], 1)]
    records += [variant(one, f"pod{i}", rate, i, runtime="podman") for i, rate in enumerate([90.0, 91.0, 89.0], 1)]
    records += [variant(one, f"ch{i}", rate, i, runtime="charliecloud")
                for i, rate in enumerate([99.0, 103.0, 98.0], 1)]
    overhead = build_tables(records)["overhead"].set_index("runtime")
    podman, charliecloud = overhead.loc["podman"], overhead.loc["charliecloud"]
    assert podman["overhead_percent_of_means"] == pytest.approx(10.0)  # (100 - 90) / 100
    assert podman["overhead_ci95_low"] > 0 and podman["significance"] == "significant"
    assert charliecloud["overhead_percent_of_means"] == pytest.approx(0.0)
    assert charliecloud["overhead_ci95_low"] < 0 < charliecloud["overhead_ci95_high"]
    assert charliecloud["significance"] == "not significant"
    # The answer in one sentence (issue 37): each runtime at its largest point, with its interval and verdict.
    low, high = charliecloud["overhead_ci95_low"], charliecloud["overhead_ci95_high"]
    assert headline(build_tables(records)["overhead"]) == (
        "Container overhead against bare metal (of the mean throughputs, Fieller 95% interval): charliecloud +0.0% "
        f"({low:+.1f} to {high:+.1f}%) at 1 ranks over tcp-loopback, batch 2: not significant; podman +10.0% "
        f"({podman['overhead_ci95_low']:+.1f} to {podman['overhead_ci95_high']:+.1f}%) at 1 ranks over tcp-loopback, "
        "batch 2: significant.")
    assert headline(build_tables(records[:3])["overhead"]) == (
        "No container runtime was measured against bare metal at the same point.")


def test_the_overhead_table_pairs_each_repetitions_runs_so_drift_between_repetitions_cancels(recorded_runs):
    """Issue 37: the machine drifts 10% a repetition and podman is 10% slower within each. Fieller's interval of
    the means counts the drift as noise on both sides; the paired one, repetition by repetition, does not. A
    repetition with only one side ok is no pair."""
    one = recorded_runs[("train", 1)]
    records = [variant(one, f"bare{i}", rate, i) for i, rate in enumerate([100.0, 110.0, 120.0, 130.0], 1)]
    records += [variant(one, f"pod{i}", rate, i, runtime="podman") for i, rate in enumerate([90.0, 99.5, 107.5], 1)]
    records.append(variant(one, "pod4", 117.0, 4, runtime="podman", status="failed"))
    [row] = build_tables(records)["overhead"].to_dict("records")
    assert row["significance"] == "not significant"
    ratios = np.array([90 / 100, 99.5 / 110, 107.5 / 120])
    assert row["pairs"] == 3
    assert row["paired_overhead_percent"] == pytest.approx(100 * (1 - np.exp(np.log(ratios).mean())))
    half = t_quantile(0.975, 2) * np.log(ratios).std(ddof=1) / np.sqrt(3)
    assert row["paired_ci95_low"] == pytest.approx(100 * (1 - np.exp(np.log(ratios).mean() + half)))
    assert row["paired_ci95_high"] == pytest.approx(100 * (1 - np.exp(np.log(ratios).mean() - half)))
    assert 0 < row["paired_ci95_low"] < row["paired_ci95_high"] < 15
    assert row["paired_significance"] == "significant"


def test_zero_spread_on_both_sides_gives_no_interval_and_no_verdict(recorded_runs):
    # Issue 13: with identical repetitions the interval has zero width; it is not "significant".
    one = recorded_runs[("train", 1)]
    records = [variant(one, f"bare{i}", 100.0, i) for i in (1, 2)]
    records += [variant(one, f"pod{i}", 99.0, i, runtime="podman") for i in (1, 2)]
    [row] = build_tables(records)["overhead"].to_dict("records")
    assert row["overhead_percent_of_means"] == pytest.approx(1.0)
    assert np.isnan(row["overhead_ci95_low"]) and np.isnan(row["overhead_ci95_high"])
    assert row["significance"] == "n/a: no spread in either side's repetitions"
    assert headline(build_tables(records)["overhead"]).endswith(
        "podman +1.0% (no interval) at 1 ranks over tcp-loopback, batch 2: n/a: no spread in either side's "
        "repetitions.")


def test_the_step_time_median_of_an_even_count_is_the_mean_of_the_middle_two(recorded_runs):
    record = copy.deepcopy(recorded_runs[("train", 1)])
    record["result"]["per_rank"] = [dict(record["result"]["per_rank"][0], step_s=[0.4, 0.1, 0.3, 0.2])]
    assert runs_table([record]).loc[0, "step_s_median"] == pytest.approx(0.25)  # not the upper median 0.3


def test_overhead_is_refused_between_different_benchmarks(recorded_runs):
    one = recorded_runs[("train", 1)]
    other = variant(one, "pod1", 90.0, 1, runtime="podman")
    other["result"]["provenance"] = dict(other["result"]["provenance"], hash="different0000000",
                                         packages={**other["result"]["provenance"]["packages"],
                                                   "tensorflow-cpu": "2.16.2"})
    overhead = build_tables([variant(one, "bare1", 100.0, 1), other])["overhead"]
    assert overhead.loc[0, "note"] == "not comparable: packages differ: tensorflow-cpu 2.15.1 vs 2.16.2"
    assert np.isnan(overhead.loc[0, "overhead_percent_of_means"])


def test_overhead_without_a_bare_metal_baseline_says_so(recorded_runs):
    overhead = build_tables([variant(recorded_runs[("train", 1)], "pod1", 90.0, 1, runtime="podman")])["overhead"]
    assert overhead.loc[0, "note"] == "no bare-metal baseline at this point"


# Fieller's interval for a ratio of means (containerbench.intervals), checked against independent computations.
# Two small samples with unequal spread: the numerator's CV 2%, the denominator's 6%.
NUMERATOR, DENOMINATOR = [91.0, 94.0, 89.5, 92.5], [100.0, 108.0, 95.0]


def test_fieller_endpoints_are_where_welchs_test_of_the_ratio_turns_significant():
    """The interval is the set of R that Welch's test of mean(x) = R * mean(y) keeps: at each endpoint
    scipy's Welch statistic of x against R * y is exactly the t quantile, with scipy's Welch degrees
    of freedom at the estimate (Tamhane and Logan 2004; mratios::ttestratio, var.equal = FALSE)."""
    from scipy import stats

    interval = ratio_interval(NUMERATOR, DENOMINATOR)
    x, y = np.array(NUMERATOR), np.array(DENOMINATOR)
    assert interval.ratio == pytest.approx(x.mean() / y.mean())
    assert interval.dof == pytest.approx(stats.ttest_ind(x, interval.ratio * y, equal_var=False).df)
    t = t_quantile(0.975, interval.dof)
    assert stats.ttest_ind(x, interval.low * y, equal_var=False).statistic == pytest.approx(t)
    assert stats.ttest_ind(x, interval.high * y, equal_var=False).statistic == pytest.approx(-t)
    assert interval.low < interval.ratio < interval.high
    # 1 lies inside (0.79..1.06): Welch's ordinary test of equal means does not reject either.
    assert interval.significance() == "not significant" and stats.ttest_ind(x, y, equal_var=False).pvalue > 0.05


def test_fieller_meets_the_delta_method_when_the_denominator_is_precise_and_leans_up_when_it_is_not():
    """Delta method: R +- t * sqrt(v_x + R^2 v_y) / mean(y), symmetric. Fieller's interval tends to it
    as the denominator's relative error shrinks; with a noisy denominator it reaches further up
    than down (a low denominator mean inflates the ratio more than a high one deflates it)."""
    def delta(x, y):
        x, y = pd.Series(x), pd.Series(y)
        ratio = x.mean() / y.mean()
        se = np.sqrt(x.var() / x.count() + ratio**2 * y.var() / y.count()) / y.mean()
        t = t_quantile(0.975, ratio_interval(x, y).dof)
        return ratio - t * se, ratio + t * se

    precise_y = [100 + 0.01 * (v - 100) for v in DENOMINATOR]  # the same shape, CV 0.06%
    fieller = ratio_interval(NUMERATOR, precise_y)
    assert (fieller.low, fieller.high) == pytest.approx(delta(NUMERATOR, precise_y), rel=1e-5)
    noisy = ratio_interval(NUMERATOR, DENOMINATOR)
    delta_low, delta_high = delta(NUMERATOR, DENOMINATOR)
    assert noisy.high - noisy.ratio > noisy.ratio - noisy.low
    assert noisy.high > delta_high and noisy.low > delta_low


def test_fieller_covers_the_true_ratio_95_times_in_100():
    """Brute force with a known answer: 4000 experiments of 3 repetitions a side (the default),
    true ratio 95 / 100, unequal spreads. Welch-Satterthwaite with 3 values a side is known to be
    slightly conservative, so the bounds leave room above 95%."""
    rng = np.random.default_rng(13)
    covered = [ratio_interval(rng.normal(95, 5, 3), rng.normal(100, 3, 3)) for _ in range(4000)]
    assert 0.94 <= np.mean([i.low <= 0.95 <= i.high for i in covered]) <= 0.97


def test_no_interval_when_the_denominator_mean_is_not_distinguishable_from_zero(recorded_runs):
    # A bare-metal side this noisy (4.7 +- 4.5 img/s over 3 runs) leaves every ratio in Fieller's set.
    one = recorded_runs[("train", 1)]
    records = [variant(one, f"bare{i}", rate, i) for i, rate in enumerate([0.1, 5.0, 9.0], 1)]
    records += [variant(one, f"pod{i}", rate, i, runtime="podman") for i, rate in enumerate([4.0, 5.0, 6.0], 1)]
    [row] = build_tables(records)["overhead"].to_dict("records")
    assert row["significance"] == "n/a: bare-metal mean not distinguishable from 0"
    assert np.isnan(row["overhead_ci95_low"]) and np.isnan(row["overhead_ci95_high"])
    assert row["overhead_percent_of_means"] == pytest.approx(100 * (1 - 5.0 / (14.1 / 3)))


def test_the_overhead_table_says_it_is_computed_from_means_and_shows_them_beside_the_medians(recorded_runs):
    # Skewed repetitions: the medians say 5%, the means 13.6%; the figure and its name must agree.
    one = recorded_runs[("train", 1)]
    records = [variant(one, f"bare{i}", rate, i) for i, rate in enumerate([100.0, 100.0, 130.0], 1)]
    records += [variant(one, f"pod{i}", rate, i, runtime="podman") for i, rate in enumerate([90.0, 95.0, 100.0], 1)]
    overhead = build_tables(records)["overhead"]
    assert "overhead_percent" not in overhead  # a bare percentage could be read as a ratio of medians
    [row] = overhead.to_dict("records")
    assert (row["bare_metal_runs"], row["runtime_runs"]) == (3, 3)
    assert (row["bare_metal_median"], row["runtime_median"]) == (100.0, 95.0)
    assert (row["bare_metal_mean"], row["runtime_mean"]) == (110.0, 95.0)
    assert row["overhead_percent_of_means"] == pytest.approx(100 * 15 / 110)
    interval = ratio_interval([90.0, 95.0, 100.0], [100.0, 100.0, 130.0])
    assert row["overhead_ci95_low"] == pytest.approx(100 * (1 - interval.high))
    assert row["overhead_ci95_high"] == pytest.approx(100 * (1 - interval.low))


def test_fabric_modes_and_input_tables_carry_counts_means_and_intervals(recorded_runs):
    two = recorded_runs[("train", 2)]
    rates = {("horovod", "infiniband", "synthetic"): [130.0, 128.0, 133.0],
             ("horovod", "ethernet", "synthetic"): [100.0, 97.0, 102.0],
             ("horovod", "infiniband", "real"): [104.0, 101.0, 106.0],
             ("collective", "infiniband", "synthetic"): [120.0, 126.0, 118.0],
             ("local", "infiniband", "synthetic"): [150.0, 149.0, 153.0, 151.0]}
    records = [variant(two, f"{mode}-{fabric}-{data}-{i}", rate, i, mode=mode, fabric=fabric, data=data)
               for (mode, fabric, data), values in rates.items() for i, rate in enumerate(values, 1)]
    tables = build_tables(records)

    [fabric] = tables["fabrics"].query("mode == 'horovod' and data == 'synthetic'").to_dict("records")
    horovod = rates[("horovod", "infiniband", "synthetic")]
    expected = ratio_interval(horovod, rates[("horovod", "ethernet", "synthetic")])
    assert (fabric["faster_fabric"], fabric["faster_runs"], fabric["slower_runs"]) == ("infiniband", 3, 3)
    assert fabric["faster_mean"] == pytest.approx(391 / 3) and fabric["slower_median"] == 100.0
    assert (fabric["ratio_of_means"], fabric["ratio_ci95_low"], fabric["ratio_ci95_high"]) == pytest.approx(
        (expected.ratio, expected.low, expected.high))
    assert fabric["ratio_ci95_low"] > 1 and fabric["significance"] == "significant"

    modes = tables["modes"].query("fabric == 'infiniband' and data == 'synthetic'").set_index("mode")
    collective = modes.loc["collective"]
    expected = ratio_interval(rates[("collective", "infiniband", "synthetic")], horovod)
    assert (collective["mode_runs"], collective["baseline_runs"]) == (3, 3)
    assert (collective["ratio_to_baseline_of_means"], collective["ratio_ci95_low"], collective["ratio_ci95_high"]) == \
        pytest.approx((expected.ratio, expected.low, expected.high))
    assert np.isnan(collective["communication_overhead_percent_of_means"])  # only the local mode has one
    # Communication overhead = 1 - horovod / local; its interval is the local/horovod interval turned over.
    row = modes.loc["local"]
    assert row["mode_runs"] == 4 and row["mode_mean"] == pytest.approx(150.75)
    assert row["communication_overhead_percent_of_means"] == pytest.approx(100 * (1 - (391 / 3) / 150.75))
    assert row["communication_overhead_ci95_low"] == pytest.approx(100 * (1 - 1 / row["ratio_ci95_low"]))
    assert row["communication_overhead_ci95_high"] == pytest.approx(100 * (1 - 1 / row["ratio_ci95_high"]))
    assert 0 < row["communication_overhead_ci95_low"] < row["communication_overhead_percent_of_means"]

    assert modes["sync_mode"].isna().all()  # no asynchronous mode here

    [inputs] = tables["input"].query("mode == 'horovod'").to_dict("records")
    expected = ratio_interval(rates[("horovod", "infiniband", "real")], horovod)
    assert (inputs["synthetic_runs"], inputs["real_runs"]) == (3, 3)
    assert inputs["input_overhead_percent_of_means"] == pytest.approx(100 * (1 - expected.ratio))
    assert (inputs["input_overhead_ci95_low"], inputs["input_overhead_ci95_high"]) == pytest.approx(
        (100 * (1 - expected.high), 100 * (1 - expected.low)))
    assert inputs["input_overhead_ci95_low"] > 0 and inputs["significance"] == "significant"


def test_asynchronous_parameter_servers_stand_beside_their_synchronous_rounds(recorded_runs):
    """The modes table sets each asynchronous run against the synchronous rounds at its point: Fieller's interval of
    the throughput ratio, and the learning side of it, loss at equal images and staleness, from each record."""
    two = recorded_runs[("train", 2)]
    runs = {"parameter_server": [(40.0, 0.36, 0.5), (42.0, 0.30, 0.5), (41.0, 0.33, 0.5)],
            "parameter_server_async": [(52.0, 0.02, 1.0), (50.0, 0.05, 1.2), (53.0, 0.04, 0.9)],
            "horovod": [(60.0, None, None)] * 3}
    records = []
    for mode, figures in runs.items():
        for repetition, (rate, loss, staleness) in enumerate(figures, 1):
            record = variant(two, f"{mode}-{repetition}", rate, repetition, mode=mode)
            if loss is not None:
                record["result"]["updates"] = {"loss_at_equal_images": loss, "staleness_mean": staleness,
                                               "worker_weights": [{"worker": 0}, {"worker": 1}]}
            records.append(record)
    modes = build_tables(records)["modes"].set_index("mode")
    async_row, sync_row = modes.loc["parameter_server_async"], modes.loc["parameter_server"]
    expected = ratio_interval([52.0, 50.0, 53.0], [40.0, 42.0, 41.0])
    assert (async_row["sync_mode"], async_row["sync_runs"]) == ("parameter_server", 3)
    assert (async_row["ratio_to_sync_of_means"], async_row["ratio_to_sync_ci95_low"],
            async_row["ratio_to_sync_ci95_high"]) == pytest.approx((expected.ratio, expected.low, expected.high))
    assert async_row["sync_significance"] == "significant"
    assert (async_row["mode_loss_at_equal_images"], async_row["sync_loss_at_equal_images"]) == pytest.approx(
        (0.11 / 3, 0.99 / 3))
    assert (async_row["mode_staleness_mean"], async_row["sync_staleness_mean"]) == pytest.approx((3.1 / 3, 0.5))
    # Both still stand against the framework's baseline (Horovod); the synchronous mode has no other to meet.
    assert async_row["ratio_to_baseline_of_means"] == pytest.approx(155 / 180)
    assert pd.isna(sync_row["sync_mode"]) and sync_row["ratio_to_baseline_of_means"] == pytest.approx(123 / 180)
    runs_csv = build_tables(records)["runs"].set_index("run_id")
    assert runs_csv.loc["parameter_server_async-2", "loss_at_equal_images"] == 0.05
    assert np.isnan(runs_csv.loc["horovod-1", "staleness_mean"])


def test_fabric_ratio_and_input_overhead_at_the_same_point(recorded_runs):
    two = recorded_runs[("train", 2)]
    records = [variant(two, "ib", 130.0, 1, fabric="infiniband"), variant(two, "eth", 100.0, 1, fabric="ethernet"),
               variant(two, "ib-real", 104.0, 1, fabric="infiniband", data="real")]
    tables = build_tables(records)
    fabrics = tables["fabrics"]
    synthetic = fabrics[fabrics["data"] == "synthetic"].iloc[0]
    assert (synthetic["faster_fabric"], synthetic["slower_fabric"]) == ("infiniband", "ethernet")
    assert synthetic["ratio_of_means"] == pytest.approx(1.3)
    # Issue 36: these two ranks' traffic went over TCP on lo (their transport check says so): a network stack
    # even on one node, so the row stands. One rank's runs used no network at all: that row says so.
    assert synthetic["nodes"] == 1 and "tcp over lo" in two["fabric_check"]["reason"] and synthetic["note"] == ""
    one = recorded_runs[("train", 1)]
    assert one["fabric_check"]["status"] == "not applicable"
    alone = build_tables([variant(one, "ib1", 13.0, 1, fabric="infiniband"),
                          variant(one, "eth1", 10.0, 1, fabric="ethernet")])["fabrics"]
    assert alone.loc[0, "nodes"] == 1 and alone.loc[0, "note"] == ONE_NODE_NOTE
    inputs = tables["input"]
    assert len(inputs) == 1 and inputs.loc[0, "fabric"] == "infiniband"
    assert inputs.loc[0, "input_overhead_percent_of_means"] == pytest.approx(20.0)  # (130 - 104) / 130


def test_memory_per_batch_and_the_study_table(recorded_runs):
    tables = build_tables([recorded_runs[("train", 1)], recorded_runs[("train", 2)]])
    memory = tables["memory"]
    assert list(memory["batch_size"]) == [2] and memory.loc[0, "runs"] == 2
    assert 0.1 < memory.loc[0, "peak_host_memory_gib"] < 16
    table1 = tables["table1"]
    assert list(table1.columns) == ["framework", "ranks", "mode", "data", "runtime", "fabric", "batch/rank",
                                    "img/s median", "std"]  # the figure says it is a median
    assert list(table1["ranks"]) == [1, 2] and set(table1["mode"]) == {"horovod"}
    markdown = markdown_summary(tables)
    assert re.search(r"^\| framework\s+\|\s+ranks \| mode\s+\| data\s+\|", markdown, re.M)
    assert ("### Container overhead vs bare metal (% of the means, Fieller 95% interval; paired by repetition beside "
            "it)") in markdown
    assert "_none_" in markdown


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


def test_overhead_flags_ranks_bound_differently_from_bare_metal(recorded_runs):
    # Issue 10, finding 4: docker ranks escaping the Slurm step's binding are not compared silently.
    one = recorded_runs[("train", 1)]
    bare = [variant(one, f"bare{i}", 100.0 + i, i) for i in (1, 2)]
    docker = [variant(one, f"dock{i}", 90.0 + i, i, runtime="docker") for i in (1, 2)]
    for record in docker:
        for process in record["result"]["processes"]:
            process["context"] = dict(process["context"], affinity=[0, 1],
                                      limits={"memory_max": 2**31, "cpu_max": None})
    [row] = build_tables(bare + docker)["overhead"].to_dict("records")
    assert row["overhead_percent_of_means"] == pytest.approx(100 * (1 - 91.5 / 101.5))  # still computed
    assert row["note"] == ("binding differs: bare-metal ranks had 1 CPU, memory -, quota -, "
                           "docker ranks 2 CPU, memory 2 GiB, quota -")
    same = [variant(one, f"pod{i}", 90.0 + i, i, runtime="podman") for i in (1, 2)]
    assert not isinstance(build_tables(bare + same)["overhead"].loc[0, "note"], str)


def test_frameworks_table_sets_pytorch_beside_tensorflow_at_the_same_point(recorded_runs):
    two = recorded_runs[("train", 2)]
    rates = {("tensorflow", "horovod"): [30.0, 31.0, 29.0], ("pytorch", "ddp"): [45.0, 44.0, 46.5],
             ("tensorflow", "local"): [33.0, 34.0, 32.5], ("pytorch", "local"): [50.0, 49.0, 51.0]}
    records = [variant(two, f"{framework}-{mode}-{i}", rate, i, framework=framework, mode=mode)
               for (framework, mode), values in rates.items() for i, rate in enumerate(values, 1)]
    tables = build_tables(records)
    compared = tables["frameworks"].set_index("pytorch_mode")
    assert list(compared["tensorflow_mode"]) == ["horovod", "local"]  # each mode beside its counterpart
    for torch_mode, tf_mode in (("ddp", "horovod"), ("local", "local")):
        row = compared.loc[torch_mode]
        expected = ratio_interval(rates[("pytorch", torch_mode)], rates[("tensorflow", tf_mode)])
        assert (row["tensorflow_runs"], row["pytorch_runs"]) == (3, 3)
        assert (row["ratio_to_tensorflow_of_means"], row["ratio_ci95_low"], row["ratio_ci95_high"]) == \
            pytest.approx((expected.ratio, expected.low, expected.high))
        assert row["pytorch_cv_percent"] > 0 and row["tensorflow_cv_percent"] > 0
    # Each framework's modes against its own baseline: PyTorch's local beside DDP, TF's beside Horovod.
    modes = tables["modes"].set_index("framework")
    assert modes.loc["pytorch", "baseline_mode"] == "ddp" and modes.loc["tensorflow", "baseline_mode"] == "horovod"
    assert set(tables["table1"]["framework"]) == {"tensorflow", "pytorch"}


def with_losses(record: dict, losses: list[float]) -> dict:
    record["result"]["per_rank"][0]["loss"] = list(losses)
    return record


def read_events(directory) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every scalar in a TensorBoard event file, read record by record (TFRecord
    framing: length, its CRC, the Event protobuf, its CRC)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    [path] = list(directory.glob("events.out.tfevents.*"))
    data, offset, scalars = path.read_bytes(), 0, []
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        event = Event.FromString(data[offset + 12:offset + 12 + length])
        offset += 12 + length + 4
        scalars += [(event.step, value.tag, value.simple_value) for value in event.summary.value]
    return scalars


def test_a_container_whose_loss_trajectory_parts_from_bare_metals_is_flagged_at_that_step(recorded_runs, tmp_path):
    two = recorded_runs[("train", 2)]
    same = [6.9, 5.1, 3.8, 2.9, 2.4]
    parted = [6.9, 5.1, 4.2, 3.5, 3.1]  # step 3 is 10% from bare metal's
    records = [with_losses(variant(two, f"bare-{i}", 30.0 + i, i, runtime="bare-metal"), same) for i in (1, 2)]
    records += [with_losses(variant(two, f"podman-{i}", 29.0 + i, i, runtime="podman"), same) for i in (1, 2)]
    records += [with_losses(variant(two, "ch-1", 28.0, 1, runtime="charliecloud"), same),
                with_losses(variant(two, "ch-2", 28.5, 2, runtime="charliecloud"), parted)]
    tables = build_tables(records)
    trajectories = tables["trajectories"].set_index("runtime")
    assert trajectories.loc["podman", "loss_trajectory"] == (
        "same as bare metal (5 steps; tolerance 3x the spread of bare metal's 2 repetition(s), at least 1e-05 of "
        "the first loss)")
    assert trajectories.loc["podman", "max_relative_difference"] == 0
    assert (trajectories.loc["charliecloud", "first_parting_step"], trajectories.loc["charliecloud", "parting_run"]) \
        == (3, "ch-2")
    overhead = tables["overhead"].set_index("runtime")
    assert overhead.loc["charliecloud", "note"] == "loss trajectory parts from bare metal at step 3"
    assert overhead.loc["charliecloud", "loss_trajectory"].startswith("parts from bare metal at step 3 (ch-2")
    assert pd.isna(overhead.loc["podman", "note"])
    # The curves themselves: rank 0's loss per step, warmup marked, and as TensorBoard scalars per run.
    losses = tables["losses"]
    assert list(losses.loc[losses["run_id"] == "ch-2", "loss"]) == parted
    assert list(losses.loc[losses["run_id"] == "ch-2", "measured"]) == [False, True, True, True, True]
    write_tensorboard(losses, tmp_path)
    assert read_events(tmp_path / "ch-2") == [(step, "loss", pytest.approx(loss))
                                              for step, loss in enumerate(parted, 1)]


def test_a_loss_near_zero_that_rounding_moves_is_the_same_training_and_another_curve_is_not(recorded_runs):
    """Issue 37: a relative tolerance called any run of a loss that falls to 0.001 diverging unless it was
    bit-exact. Bare metal's own repetitions of the same seed say how far rounding moves the loss: a GPU-like
    pair whose tail differs by 20% of the loss (0.0010 and 0.0012) allows a run between them, and a run that
    trained something else is still caught where the loss is large."""
    two = recorded_runs[("train", 2)]
    falling = np.geomspace(6.9, 0.001, 12)
    bare = [falling, falling * np.linspace(1.0, 1.2, 12)]  # their spread grows to 20% of the tail
    between = falling * np.linspace(1.0, 1.1, 12)
    other = falling * 1.01  # another seed: 1% off from the first step
    records = [with_losses(variant(two, f"bare-{i}", 30.0, i, runtime="bare-metal"), curve)
               for i, curve in enumerate(bare, 1)]
    records += [with_losses(variant(two, "pod-1", 29.0, 1, runtime="podman"), between),
                with_losses(variant(two, "ch-1", 29.0, 1, runtime="charliecloud"), other),
                with_losses(variant(two, "sh-3", 29.0, 3, runtime="shifter"), falling)]
    trajectories = build_tables(records)["trajectories"].set_index("runtime")
    podman = trajectories.loc["podman"]
    assert podman["loss_trajectory"].startswith("same as bare metal (12 steps;")
    assert podman["max_relative_difference"] == pytest.approx(0.1)  # 10%: over the 2% a relative rule allowed
    assert trajectories.loc["charliecloud", "first_parting_step"] == 1
    # Bare metal ran no repetition 3: said, not set against repetition 1's curve.
    assert trajectories.loc["shifter", "loss_trajectory"] == "not checked: no bare-metal run of repetition 3"
    assert np.isnan(trajectories.loc["shifter", "runs_compared"])


def test_runs_csv_keeps_each_runs_start_to_the_millisecond(recorded_runs, tmp_path):
    """The report's time line (issue 37, item 1) reads the starts from runs.csv: written with the tables'
    six significant digits, every run of a sweep started at one moment, 10,000 s wide."""
    one = recorded_runs[("train", 1)]
    paths = []
    for repetition in (1, 2, 3):
        record = variant(one, f"one-rep{repetition}", 10.0 + repetition, repetition)
        record["started_unix"] = 1795860000.25 + 41.5 * repetition
        paths.append(tmp_path / f"one-rep{repetition}.json")
        paths[-1].write_text(json.dumps(record))
    write_tables(paths, tmp_path / "tables")
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv").sort_values("repetition")
    assert list(runs["started_unix"]) == pytest.approx([1795860041.75, 1795860083.25, 1795860124.75], abs=5e-4)
    assert list(runs["order_in_repetition"]) == [1, 1, 1]
