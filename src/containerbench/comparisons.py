"""The runs table -> the tables that set runs side by side at the same point: each runtime against
bare metal, fabrics, distribution modes, frameworks, synthetic against real data, with Fieller's 95%
interval of each ratio of means (intervals.py); and memory per batch size, the study's Table 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from containerbench.fabrics import SHARED_MEMORY_ONLY
from containerbench.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, SYNCHRONOUS_OF, Framework, framework
from containerbench.intervals import RatioInterval, paired_ratio_interval, ratio_interval
from containerbench.point import Point, default_mode
from containerbench.rank.distribution import LOCAL as LOCAL_MODE
from containerbench.rank.provenance import difference as provenance_difference
from containerbench.runtables import BASELINE_RUNTIME, cv_percent, ok_runs
from containerbench.status import Check


def _basis(side: str, rates: pd.Series) -> dict:
    """What a comparison is computed from, shown with it: count, mean (the figures) and median (for reading)."""
    return {f"{side}_runs": int(rates.count()), f"{side}_median": rates.median(), f"{side}_mean": rates.mean()}


def _ratio_columns(name: str, interval: RatioInterval) -> dict:
    return {f"{name}_of_means": interval.ratio, "ratio_ci95_low": interval.low, "ratio_ci95_high": interval.high,
            "significance": interval.significance()}


def _overhead_columns(name: str, interval: RatioInterval) -> dict:
    """How much slower a side is than its reference, in percent: 100 * (1 - R) and its interval, from
    Fieller's interval of R = mean(side) / mean(reference); the interval turns over with the sign."""
    return {f"{name}_percent_of_means": 100 * (1 - interval.ratio),
            f"{name}_ci95_low": 100 * (1 - interval.high), f"{name}_ci95_high": 100 * (1 - interval.low)}


def _paired_columns(contained: pd.DataFrame, bare: pd.DataFrame) -> dict:
    """The overhead from the repetitions run side by side: each repetition's runtime run over its bare-metal
    run (intervals.paired_ratio_interval). A repetition with only one side ok is left out."""
    pairs = pd.concat([contained.groupby("repetition")["images_per_sec"].mean().rename("runtime"),
                       bare.groupby("repetition")["images_per_sec"].mean().rename("bare")], axis=1, join="inner")
    interval = paired_ratio_interval(pairs["runtime"], pairs["bare"])
    return {"pairs": len(pairs), "paired_overhead_percent": 100 * (1 - interval.ratio),
            "paired_ci95_low": 100 * (1 - interval.high), "paired_ci95_high": 100 * (1 - interval.low),
            "paired_significance": interval.significance()}


def overhead_table(runs: pd.DataFrame, provenance: dict[str, dict],
                   trajectories: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each runtime's cost relative to bare metal at the same point, with Fieller's 95% interval.

    (bare - runtime) / bare in percent of the means of the repetitions, 100 * (1 - R)
    with R = runtime mean / bare-metal mean; its interval is 1 - Fieller's interval of
    R (intervals.ratio_interval), so the bare-metal mean's own uncertainty counts.
    Positive means the container is slower. Beside it, the paired overhead: the
    repetitions' runtime-over-bare-metal ratios (their geometric mean and t interval,
    intervals.paired_ratio_interval), in which drift between repetitions cancels; the
    headline keeps Fieller's, which assumes nothing of how the runs were ordered.
    Counts and medians stand beside the means for reading; nothing is computed from the medians. Refused, with the
    differing field named, when the two did not run the same benchmark
    (provenance hashes differ), and flagged in the note when the ranks were bound
    differently (CPUs, memory or CPU limits, as each rank saw them). With `trajectories`
    (trajectory_table), each row says whether its loss trajectory followed bare metal's, and the
    note flags one that parted, with the first step where it did.
    """
    others = Point.columns("runtime")
    columns = [*others, "runtime", "bare_metal_runs", "runtime_runs", "bare_metal_median", "runtime_median",
               "bare_metal_mean", "runtime_mean", "overhead_percent_of_means", "overhead_ci95_low",
               "overhead_ci95_high", "significance", "pairs", "paired_overhead_percent", "paired_ci95_low",
               "paired_ci95_high", "paired_significance", "startup_overhead_s", "loss_trajectory", "note"]
    ok = ok_runs(runs)
    rows = []
    for point, group in ok.groupby(others, dropna=False, sort=True):
        bare = group[group["runtime"] == BASELINE_RUNTIME]
        for runtime, contained in group[group["runtime"] != BASELINE_RUNTIME].groupby("runtime"):
            row = {**dict(zip(others, point)), "runtime": runtime, **_basis("runtime", contained["images_per_sec"])}
            if bare.empty:
                rows.append({**row, "note": "no bare-metal baseline at this point"})
                continue
            row |= _basis("bare_metal", bare["images_per_sec"])
            differences = (provenance_difference(provenance.get(a), provenance.get(b))
                           for a in bare["provenance"].unique() for b in contained["provenance"].unique())
            mismatch = next(filter(None, differences), None)
            if mismatch:
                rows.append({**row, "note": f"not comparable: {mismatch}"})
                continue
            interval = ratio_interval(contained["images_per_sec"], bare["images_per_sec"], BASELINE_RUNTIME)
            row |= _overhead_columns("overhead", interval)
            row["significance"] = interval.significance()
            row |= _paired_columns(contained, bare)
            row["startup_overhead_s"] = contained["startup_s"].median() - bare["startup_s"].median()
            bound = {side: sorted(set(runs_of["binding"].dropna())) for side, runs_of in (("bare", bare),
                                                                                           ("runtime", contained))}
            if bound["bare"] and bound["runtime"] and bound["bare"] != bound["runtime"]:
                # Not refused (the numbers are real), but not like with like: say what each rank had.
                row["note"] = (f"binding differs: bare-metal ranks had {' / '.join(bound['bare'])}, "
                               f"{runtime} ranks {' / '.join(bound['runtime'])}")
            rows.append(row)
    checked = {} if trajectories is None else {
        tuple(row[c] for c in [*others, "runtime"]): row for row in trajectories.to_dict("records")}
    for row in rows:
        found = checked.get(tuple(row[c] for c in [*others, "runtime"]))
        if not found:
            continue
        row["loss_trajectory"] = found["loss_trajectory"]
        if pd.notna(found.get("first_parting_step")):
            flag = f"loss trajectory parts from bare metal at step {int(found['first_parting_step'])}"
            row["note"] = f"{flag}; {row['note']}" if row.get("note") else flag
    return pd.DataFrame(rows, columns=columns)


# On one node the ranks' traffic may never reach a network: NCCL and MPI carry it through shared memory
# (NVLink, PCIe) whatever the fabric asks of the network. Where every run's transport check says so (or
# there was one rank), the row compares no network. A fabric that shuts shared memory out (btl self,tcp)
# does cross its network stack on one node, and its row stands.
# This is the rule judged from what the runs did; the estimate predicts the same rule before a sweep from
# the fabrics' settings (fabrics.keeps_shared_memory, in cost._one_node_repeats).
ONE_NODE_NOTE = "one node: the traffic stayed in the node, so this is not a comparison of the fabrics"


def _network_unused(runs: pd.DataFrame) -> bool:
    """Did none of these runs' traffic use a network, by their own transport checks?"""
    return bool(((runs["fabric_check"] == Check.NOT_APPLICABLE)
                 | runs["transport"].fillna("").str.contains(SHARED_MEMORY_ONLY, regex=False)).all())


def fabric_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Throughput ratio of each pair of fabrics at the same point: faster over slower, of the means of
    the repetitions, with Fieller's 95% interval ("significant": it leaves out 1). A one-node point
    whose runs used no network says so (ONE_NODE_NOTE)."""
    others = Point.columns("fabric")
    columns = [*others, "faster_fabric", "slower_fabric", "faster_runs", "slower_runs", "faster_median",
               "slower_median", "faster_mean", "slower_mean", "ratio_of_means", "ratio_ci95_low", "ratio_ci95_high",
               "significance", "note"]
    rows = []
    for point, group in ok_runs(runs).groupby(others, dropna=False, sort=True):
        rates = {fabric: series for fabric, series in group.groupby("fabric", dropna=False)["images_per_sec"]}
        ranked = sorted(rates, key=lambda fabric: rates[fabric].mean(), reverse=True)
        for i, fast in enumerate(ranked):
            for slow in ranked[i + 1:]:
                one_node = dict(zip(others, point))["nodes"] == 1 and _network_unused(
                    group[group["fabric"].isin([fast, slow])])
                rows.append({**dict(zip(others, point)), "faster_fabric": fast, "slower_fabric": slow,
                             **_basis("faster", rates[fast]), **_basis("slower", rates[slow]),
                             **_ratio_columns("ratio", ratio_interval(rates[fast], rates[slow], slow)),
                             "note": ONE_NODE_NOTE if one_node else ""})
    return pd.DataFrame(rows, columns=columns)


def modes_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Each distribution mode beside its framework's data-parallel baseline at the same point (Horovod for
    TensorFlow, DistributedDataParallel for PyTorch: Framework.default_mode).

    ratio_to_baseline_of_means = mean(mode) / mean(baseline) over the repetitions (above 1:
    faster than the baseline), with Fieller's 95% interval; medians and CVs stand beside it.
    For the `local` mode (no gradient exchange), communication_overhead_percent_of_means
    = 100 * (1 - baseline / local): what exchanging gradients costs, with its interval.
    Asynchronous parameter servers beside their synchronous rounds at the same point (SYNCHRONOUS_OF):
    ratio_to_sync_of_means with Fieller's interval, and what asynchrony costs in learning, the mean loss of
    the final weights after the same images (loss_at_equal_images) and the updates' mean staleness, each side.
    """
    others = Point.columns("mode")
    columns = [*others, "mode", "baseline_mode", "baseline_runs", "mode_runs", "baseline_median", "mode_median",
               "baseline_mean", "mode_mean", "baseline_cv_percent", "mode_cv_percent", "ratio_to_baseline_of_means",
               "ratio_ci95_low", "ratio_ci95_high", "significance", "communication_overhead_percent_of_means",
               "communication_overhead_ci95_low", "communication_overhead_ci95_high", "sync_mode", "sync_runs",
               "ratio_to_sync_of_means", "ratio_to_sync_ci95_low", "ratio_to_sync_ci95_high", "sync_significance",
               "mode_loss_at_equal_images", "sync_loss_at_equal_images", "mode_staleness_mean", "sync_staleness_mean",
               "note"]
    ok = ok_runs(runs)
    rows = []
    for point, group in ok.groupby(others, dropna=False, sort=True):
        framework_name = dict(zip(others, point))["framework"]
        base_mode = default_mode(framework_name if framework_name in FRAMEWORKS else DEFAULT_FRAMEWORK)
        baseline = group.loc[group["mode"] == base_mode, "images_per_sec"]
        for mode, rates in group[group["mode"] != base_mode].groupby("mode")["images_per_sec"]:
            row = {**dict(zip(others, point)), "mode": mode, "baseline_mode": base_mode, **_basis("mode", rates),
                   "mode_cv_percent": cv_percent(rates)}
            if (sync_mode := SYNCHRONOUS_OF.get(mode)) and (group["mode"] == sync_mode).any():
                row |= _against_sync(group[group["mode"] == mode], group[group["mode"] == sync_mode], sync_mode)
            if baseline.empty:
                rows.append({**row, "note": f"no {base_mode} run at this point"})
                continue
            row |= {**_basis("baseline", baseline), "baseline_cv_percent": cv_percent(baseline),
                    **_ratio_columns("ratio_to_baseline", ratio_interval(rates, baseline, base_mode))}
            if mode == LOCAL_MODE:
                # Fieller's set for baseline / local is the inverse of the set for local / baseline
                # (same inequality, same degrees of freedom): the same interval, turned over.
                row |= _overhead_columns("communication_overhead", ratio_interval(baseline, rates, LOCAL_MODE))
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def _against_sync(runs: pd.DataFrame, sync: pd.DataFrame, sync_mode: str) -> dict:
    interval = ratio_interval(runs["images_per_sec"], sync["images_per_sec"], sync_mode)
    return {"sync_mode": sync_mode, "sync_runs": int(sync["images_per_sec"].count()),
            "ratio_to_sync_of_means": interval.ratio, "ratio_to_sync_ci95_low": interval.low,
            "ratio_to_sync_ci95_high": interval.high, "sync_significance": interval.significance(),
            "mode_loss_at_equal_images": runs["loss_at_equal_images"].mean(),
            "sync_loss_at_equal_images": sync["loss_at_equal_images"].mean(),
            "mode_staleness_mean": runs["staleness_mean"].mean(), "sync_staleness_mean": sync["staleness_mean"].mean()}


def counterparts(reference: Framework, other: Framework) -> list[tuple[str, str]]:
    """Modes that do the same work in two frameworks: their data-parallel baselines (Horovod and DDP), and
    no exchange at all (local) where both have it."""
    alone = [(LOCAL_MODE, LOCAL_MODE)] if LOCAL_MODE in reference.modes and LOCAL_MODE in other.modes else []
    return [(reference.default_mode, other.default_mode), *alone]


def frameworks_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Each other framework beside the default one (PyTorch beside TensorFlow) at the same point, in the modes
    that do the same work (counterparts: Horovod against DDP, local against local): ratio = mean(other) /
    mean(default) over the repetitions, with Fieller's 95% interval and both CVs. Each framework has its
    columns (<name>_mode, _runs, ...); a row fills the default's and the other's."""
    others = Point.columns("framework", "mode")
    reference = framework(DEFAULT_FRAMEWORK)
    sides = [reference, *(each for each in FRAMEWORKS.values() if each is not reference)]
    columns = [*others, *(f"{each.name}_{column}" for column in ("mode", "runs", "median", "mean", "cv_percent")
                          for each in sides),
               f"ratio_to_{reference.name}_of_means", "ratio_ci95_low", "ratio_ci95_high", "significance", "note"]
    ok = ok_runs(runs)
    rows = []
    for point, group in ok.groupby(others, dropna=False, sort=True):
        for other in sides[1:]:
            for reference_mode, other_mode in counterparts(reference, other):
                rows += _framework_row(dict(zip(others, point)), group, reference, reference_mode, other, other_mode)
    return pd.DataFrame(rows, columns=columns)


def _framework_row(point: dict, group: pd.DataFrame, reference: Framework, reference_mode: str, other: Framework,
                   other_mode: str) -> list[dict]:
    """The frameworks table's row for one pair of modes at a point: none where the other framework has no run."""
    def rates(side: Framework, mode: str) -> pd.Series:
        return group.loc[(group["framework"] == side.name) & (group["mode"] == mode), "images_per_sec"]

    base, compared = rates(reference, reference_mode), rates(other, other_mode)
    if compared.empty:
        return []
    row = {**point, f"{reference.name}_mode": reference_mode, f"{other.name}_mode": other_mode,
           **_basis(other.name, compared), f"{other.name}_cv_percent": cv_percent(compared)}
    if base.empty:
        return [{**row, "note": f"no {reference.name} {reference_mode} run at this point"}]
    return [{**row, **_basis(reference.name, base), f"{reference.name}_cv_percent": cv_percent(base),
             **_ratio_columns(f"ratio_to_{reference.name}",
                              ratio_interval(compared, base, reference.name))}]


def input_overhead_table(runs: pd.DataFrame) -> pd.DataFrame:
    """(synthetic - real) / synthetic in percent of the means at the same point: the cost of reading
    real data, with its interval from Fieller's interval of real / synthetic."""
    others = Point.columns("data")
    columns = [*others, "synthetic_runs", "real_runs", "synthetic_median", "real_median", "synthetic_mean",
               "real_mean", "input_overhead_percent_of_means", "input_overhead_ci95_low", "input_overhead_ci95_high",
               "significance"]
    rows = []
    for point, group in ok_runs(runs).groupby(others, dropna=False, sort=True):
        synthetic = group.loc[group["data"] == "synthetic", "images_per_sec"]
        real = group.loc[group["data"] == "real", "images_per_sec"]
        if synthetic.empty or real.empty:
            continue
        interval = ratio_interval(real, synthetic, "synthetic")
        rows.append({**dict(zip(others, point)), **_basis("synthetic", synthetic), **_basis("real", real),
                     **_overhead_columns("input_overhead", interval), "significance": interval.significance()})
    return pd.DataFrame(rows, columns=columns)


def memory_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Peak memory per rank (largest rank of a run, median over runs) for each batch size."""
    keys = ["runtime", "model", "image_size", "precision", "batch_size"]
    ok = ok_runs(runs)
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "peak_host_memory_gib", "peak_gpu_memory_gib", "runs"])
    return ok.groupby(keys, dropna=False).agg(
        peak_host_memory_gib=("peak_host_memory_gib", "median"),
        peak_gpu_memory_gib=("peak_gpu_memory_gib", "median"),
        runs=("run_id", "count")).reset_index()


def study_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The CSCS report's Table 1 shape: ranks, mode, data, images/s (with framework, runtime and fabric). Its
    figure is the median over the repetitions, and its headings say so; std is the repetitions' spread."""
    headings = {"batch_size": "batch/rank", "images_per_sec_median": "img/s median", "images_per_sec_std": "std"}
    if summary.empty:
        return pd.DataFrame(columns=["framework", "ranks", "mode", "data", "runtime", "fabric", *headings.values()])
    table = summary[["framework", "ranks", "mode", "data", "runtime", "fabric", "batch_size", "images_per_sec_median",
                     "images_per_sec_std"]].rename(columns=headings)
    return table.sort_values(["framework", "runtime", "fabric", "mode", "data", "ranks"], ignore_index=True)


def headline(overhead: pd.DataFrame) -> str:
    """The answer in one sentence, for the top of the report and of summary.md: each runtime's overhead
    against bare metal at its largest measured point (most ranks, then the smallest batch; its fabric
    named), of the means, with Fieller's 95% interval and whether it is significant. Fieller's, not the
    paired interval beside it in the table: on the machines measured the spread was mostly each run's
    own, not a drift that one repetition's runs share, and the paired interval, with n - 1 degrees of
    freedom, came out wider as often as narrower (benchmarks/README.md, "Precision per machine-minute")."""
    measured = overhead.dropna(subset=["overhead_percent_of_means"]) if "runtime" in overhead else overhead
    if measured.empty:
        return "No container runtime was measured against bare metal at the same point."
    parts = []
    for runtime, rows in measured.groupby("runtime", sort=True):
        row = rows.sort_values(["ranks", "batch_size"], ascending=[False, True], kind="stable").iloc[0]
        low, high = row["overhead_ci95_low"], row["overhead_ci95_high"]
        interval = f"{low:+.1f} to {high:+.1f}%" if np.isfinite([low, high]).all() else "no interval"
        parts.append(f"{runtime} {row['overhead_percent_of_means']:+.1f}% ({interval}) at {int(row['ranks'])} "
                     f"ranks over {row['fabric']}, batch {int(row['batch_size'])}: {row['significance']}")
    return ("Container overhead against bare metal (of the mean throughputs, Fieller 95% interval): "
            + "; ".join(parts) + ".")
