"""Run records -> tables: the second step of the one-way flow (log -> record -> table -> report).

Every function here reads records (records.py) or tables made from them, never
a raw log. `write_tables` writes each table as results/<name>.csv (TABLE_FILES
lists them all, for the workflow to declare), plus table1.md and summary.md.
"""

from __future__ import annotations

from itertools import chain
from pathlib import Path

import numpy as np
import pandas as pd

from containerbench.distribution import LOCAL as LOCAL_MODE
from containerbench.intervals import RatioInterval, ratio_interval, t_quantile
from containerbench.point import DEFAULT_MODE, Point, runtime_label
from containerbench.provenance import difference as provenance_difference
from containerbench.records import load_records

# A sweep point's columns: runs that differ only in repetition.
POINT = Point.columns()
# Runs whose scaling is compared: a point without its rank count.
SERIES = Point.columns("nodes", "ranks")

RUN_COLUMNS = ["run_id", "status", "reason", "evidence", "system", *POINT, "repetition", "images_per_sec",
               "rank_images_per_sec_min", "rank_images_per_sec_max", "rank_spread_percent", "step_s_median",
               "peak_host_memory_gib", "peak_gpu_memory_gib", "startup_s", "wall_s", "provenance", "image",
               "fabric_check", "transport", "cpu_utilisation_percent", "foreign_cpu_percent", "disturbed",
               "traffic_check", "mpi_model", "mpi_library", "binding", "hosts", "log"]
BASELINE_RUNTIME = "bare-metal"


def _mpi_library(result: dict) -> str | None:
    """The MPI library the ranks reported (MPI_Get_library_version), distinct values joined."""
    versions = {((p.get("context") or {}).get("mpi") or {}).get("version") for p in result.get("processes") or []}
    versions = sorted(v for v in versions if v) or ([result["versions"]["mpi"]] if (result.get("versions") or {}).get("mpi") else [])
    return " | ".join(versions) or None


def binding(result: dict) -> str | None:
    """What each rank was given, as the ranks saw it from inside: CPUs in its affinity, and its
    cgroup's memory and CPU limits ("-" = none). Ranks that differ are listed apart."""
    seen = []
    for process in result.get("processes") or []:
        context = process.get("context") or {}
        if context.get("affinity") is None:
            continue
        limits = context.get("limits") or {}
        memory = limits.get("memory_max")
        described = (f"{len(context['affinity'])} CPU, memory {f'{memory / 2**30:.3g} GiB' if memory else '-'}, "
                     f"quota {limits.get('cpu_max') or '-'}")
        seen.append(described)
    return " | ".join(sorted(set(seen))) or None

def _usage(record: dict) -> dict:
    """The telemetry's figures for the runs table: the busiest node's foreign share, the mean utilisation."""
    telemetry = record.get("telemetry") or {}
    nodes = list((telemetry.get("nodes") or {}).values())
    return {
        "cpu_utilisation_percent": float(np.mean([n["cpu_utilisation_percent"] for n in nodes])) if nodes else np.nan,
        "foreign_cpu_percent": 100 * max(n["foreign_cpu_share"] for n in nodes) if nodes else np.nan,
        "disturbed": telemetry.get("disturbed"),
        "traffic_check": (telemetry.get("traffic_check") or {}).get("status"),
    }


def _train_row(record: dict) -> dict:
    spec, result = record["spec"], record.get("result") or {}
    ok = record["status"] == "ok"
    per_rank = result.get("per_rank") or []
    rank_rates = [r["images_per_sec"] for r in per_rank]
    steps = sorted(chain.from_iterable(r["step_s"] for r in per_rank))
    gpu_peaks = [r["peak_gpu_memory_bytes"] for r in per_rank if r.get("peak_gpu_memory_bytes") is not None]
    rate = result.get("images_per_sec", np.nan) if ok else np.nan
    return {
        "run_id": record["run_id"],
        "status": record["status"],
        "reason": "; ".join(record["reasons"]),
        "evidence": record.get("evidence"),
        "system": spec.get("system"),
        # The point comes from the plan, so a failed run still belongs to it.
        **{key: spec.get(key, result.get(key)) for key in POINT},
        "runtime": runtime_label(spec.get("runtime"), spec.get("mpi_model")),  # native beside hybrid
        "framework": spec.get("framework") or result.get("framework") or "tensorflow",  # older records: TF's
        "repetition": spec.get("repetition"),
        "images_per_sec": rate,
        "rank_images_per_sec_min": min(rank_rates, default=np.nan),
        "rank_images_per_sec_max": max(rank_rates, default=np.nan),
        "rank_spread_percent": 100 * (max(rank_rates) - min(rank_rates)) * len(rank_rates) / sum(rank_rates)
        if rank_rates else np.nan,
        "step_s_median": float(np.median(steps)) if steps else np.nan,  # of an even count: the mean of the middle two
        "peak_host_memory_gib": max((r["peak_host_memory_bytes"] for r in per_rank), default=np.nan) / 2**30,
        "peak_gpu_memory_gib": max(gpu_peaks) / 2**30 if gpu_peaks else np.nan,
        "startup_s": record.get("startup_s"),
        "wall_s": record.get("wall_s"),
        "provenance": (result.get("provenance") or {}).get("hash"),
        "image": (record.get("image") or None),
        "fabric_check": (record.get("fabric_check") or {}).get("status"),
        "transport": (record.get("fabric_check") or {}).get("reason"),
        **_usage(record),
        "mpi_model": spec.get("mpi_model") or ("host" if spec.get("runtime") == BASELINE_RUNTIME else "hybrid"),
        "mpi_library": _mpi_library(result),
        "binding": binding(result),
        "hosts": ",".join(sorted(set(result.get("hostnames") or []))),
        "log": record["log"]["path"],
    }


def runs_table(records: list[dict]) -> pd.DataFrame:
    rows = [_train_row(r) for r in records if r.get("kind") == "train"]
    if not rows:
        return pd.DataFrame(columns=RUN_COLUMNS)
    return pd.DataFrame(rows, columns=RUN_COLUMNS).sort_values(
        ["runtime", "fabric", "ranks", "batch_size", "repetition"], ignore_index=True)


def _ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"]


def _ci95(values: pd.Series) -> tuple[float, float]:
    n = values.count()
    if n < 2:
        return np.nan, np.nan
    half = t_quantile(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n)
    return values.mean() - half, values.mean() + half


def summary_table(runs: pd.DataFrame, stops: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per sweep point: repetitions, spread, and scaling vs the fewest ranks. With `stops`
    (point id -> why its repetitions stopped, from the rounds of `repetitions: auto`), a
    repetitions_stop column says it."""
    if runs.empty:
        return pd.DataFrame()
    ok = _ok_runs(runs)
    rows = []
    for point, group in runs.groupby(POINT, dropna=False, sort=True):
        good = ok.loc[ok.index.intersection(group.index)]
        rates = good["images_per_sec"]
        low, high = _ci95(rates)
        rows.append({
            **dict(zip(POINT, point)),
            "repetitions": int(rates.count()),
            "failed_or_invalid": int((group["status"] != "ok").sum()),
            "images_per_sec_median": rates.median(),
            "images_per_sec_mean": rates.mean(),
            "images_per_sec_std": rates.std(ddof=1),
            "cv_percent": _cv(rates),
            "images_per_sec_min": rates.min(),
            "images_per_sec_max": rates.max(),
            "ci95_low": low,
            "ci95_high": high,
            "per_rank_median": rates.median() / point[POINT.index("ranks")],
            "rank_spread_percent_median": good["rank_spread_percent"].median(),
            "startup_s_median": good["startup_s"].median(),
            **({"repetitions_stop": stops.get(Point.id_of(group["run_id"].iloc[0]))} if stops is not None else {}),
        })
    summary = pd.DataFrame(rows)
    summary["speedup"] = np.nan
    summary["scaling_efficiency_percent"] = np.nan
    for _, series in summary.groupby(SERIES, dropna=False):
        measured = series.dropna(subset=["images_per_sec_median"])
        if measured.empty:
            continue
        base = measured.loc[measured["ranks"].idxmin()]
        speedup = series["images_per_sec_median"] / base["images_per_sec_median"]
        summary.loc[series.index, "speedup"] = speedup
        summary.loc[series.index, "scaling_efficiency_percent"] = 100 * speedup * base["ranks"] / series["ranks"]
    return summary


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


# Runs with the same seed, framework, precision and ranks follow one loss trajectory in every runtime
# (measured here: bit-identical on CPUs); GPU kernels that sum in another order may part by rounding.
# A trajectory further than this from bare metal's, relative to it, ran another benchmark.
LOSS_TOLERANCE = 0.02
LOSS_KEYS = Point.run_columns()


def losses_table(records: list[dict]) -> pd.DataFrame:
    """Rank 0's loss at every step (warmup included, `measured` tells) of each ok training run."""
    rows = []
    for record in records:
        if record.get("kind") != "train" or record["status"] != "ok":
            continue
        row = {key: value for key, value in _train_row(record).items() if key in LOSS_KEYS}
        rank0 = next((r for r in record["result"].get("per_rank") or [] if r.get("rank") == 0), {})
        warmup = len(rank0.get("warmup_step_s") or [])
        rows += [{**row, "step": step, "measured": step > warmup, "loss": loss}
                 for step, loss in enumerate(rank0.get("loss") or [], 1)]
    return pd.DataFrame(rows, columns=[*LOSS_KEYS, "step", "measured", "loss"])


def _parting(loss: pd.Series, reference: pd.Series) -> tuple[int | None, float]:
    """The first step where `loss` is further than LOSS_TOLERANCE from `reference` (relative), and the
    largest relative difference over the steps both have."""
    steps = min(len(loss), len(reference))
    ours, theirs = loss.to_numpy()[:steps], reference.to_numpy()[:steps]
    relative = np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-12)
    apart = np.flatnonzero(relative > LOSS_TOLERANCE)
    return (int(apart[0]) + 1 if apart.size else None), float(relative.max()) if steps else np.nan


def trajectory_table(losses: pd.DataFrame) -> pd.DataFrame:
    """Each container run's loss trajectory against bare metal's at the same point and repetition
    (seed, framework, precision and ranks equal): the first step where they part, if any."""
    others = Point.columns("runtime")
    columns = [*others, "runtime", "runs_compared", "steps_compared", "max_relative_difference",
               "first_parting_step", "parting_run", "loss_trajectory"]
    rows = []
    for point, group in losses.groupby(others, dropna=False, sort=True):
        bare = {rep: run.sort_values("step")["loss"] for rep, run in
                group[group["runtime"] == BASELINE_RUNTIME].groupby("repetition")}
        for runtime, contained in group[group["runtime"] != BASELINE_RUNTIME].groupby("runtime"):
            row = {**dict(zip(others, point)), "runtime": runtime}
            if dict(zip(others, point))["data"] == "real":
                rows.append({**row, "loss_trajectory": "not checked: real data is read in no fixed order"})
                continue
            compared, steps, worst, parted = 0, 0, 0.0, None
            for (run_id, rep), run in contained.groupby(["run_id", "repetition"]):
                reference = bare.get(rep, next(iter(bare.values()), None))
                if reference is None:
                    continue
                first, largest = _parting(run.sort_values("step")["loss"], reference)
                compared, steps, worst = compared + 1, max(steps, min(len(run), len(reference))), max(worst, largest)
                if first is not None and (parted is None or first < parted[0]):
                    parted = (first, run_id)
            if not compared:
                rows.append({**row, "loss_trajectory": "not checked: no bare-metal run at this point"})
                continue
            row |= {"runs_compared": compared, "steps_compared": steps, "max_relative_difference": worst}
            if parted:
                row |= {"first_parting_step": parted[0], "parting_run": parted[1],
                        "loss_trajectory": f"parts from bare metal at step {parted[0]} ({parted[1]}; tolerance "
                                           f"{LOSS_TOLERANCE:.0%})"}
            else:
                row["loss_trajectory"] = f"same as bare metal within {LOSS_TOLERANCE:.0%} ({steps} steps)"
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def overhead_table(runs: pd.DataFrame, provenance: dict[str, dict],
                   trajectories: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each runtime's cost relative to bare metal at the same point, with Fieller's 95% interval.

    (bare - runtime) / bare in percent of the means of the repetitions, 100 * (1 - R)
    with R = runtime mean / bare-metal mean; its interval is 1 - Fieller's interval of
    R (intervals.ratio_interval), so the bare-metal mean's own uncertainty counts.
    Positive means the container is slower. Counts and medians stand beside the
    means for reading; nothing is computed from the medians. Refused, with the
    differing field named, when the two did not run the same benchmark
    (provenance hashes differ), and flagged in the note when the ranks were bound
    differently (CPUs, memory or CPU limits, as each rank saw them). With `trajectories`
    (trajectory_table), each row says whether its loss trajectory followed bare metal's, and the
    note flags one that parted, with the first step where it did.
    """
    others = Point.columns("runtime")
    columns = [*others, "runtime", "bare_metal_runs", "runtime_runs", "bare_metal_median", "runtime_median",
               "bare_metal_mean", "runtime_mean", "overhead_percent_of_means", "overhead_ci95_low",
               "overhead_ci95_high", "significance", "startup_overhead_s", "loss_trajectory", "note"]
    ok = _ok_runs(runs)
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
            interval = ratio_interval(contained["images_per_sec"], bare["images_per_sec"], "bare-metal")
            row |= _overhead_columns("overhead", interval)
            row["significance"] = interval.significance()
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


def fabric_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Throughput ratio of each pair of fabrics at the same point: faster over slower, of the means of
    the repetitions, with Fieller's 95% interval ("significant": it leaves out 1)."""
    others = Point.columns("fabric")
    columns = [*others, "faster_fabric", "slower_fabric", "faster_runs", "slower_runs", "faster_median",
               "slower_median", "faster_mean", "slower_mean", "ratio_of_means", "ratio_ci95_low", "ratio_ci95_high",
               "significance"]
    rows = []
    for point, group in _ok_runs(runs).groupby(others, dropna=False, sort=True):
        rates = {fabric: series for fabric, series in group.groupby("fabric", dropna=False)["images_per_sec"]}
        ranked = sorted(rates, key=lambda fabric: rates[fabric].mean(), reverse=True)
        for i, fast in enumerate(ranked):
            for slow in ranked[i + 1:]:
                rows.append({**dict(zip(others, point)), "faster_fabric": fast, "slower_fabric": slow,
                             **_basis("faster", rates[fast]), **_basis("slower", rates[slow]),
                             **_ratio_columns("ratio", ratio_interval(rates[fast], rates[slow], slow))})
    return pd.DataFrame(rows, columns=columns)


def modes_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Each distribution mode beside its framework's data-parallel baseline at the same point (Horovod for
    TensorFlow, DistributedDataParallel for PyTorch: DEFAULT_MODE).

    ratio_to_baseline_of_means = mean(mode) / mean(baseline) over the repetitions (above 1:
    faster than the baseline), with Fieller's 95% interval; medians and CVs stand beside it.
    For the `local` mode (no gradient exchange), communication_overhead_percent_of_means
    = 100 * (1 - baseline / local): what exchanging gradients costs, with its interval.
    """
    others = Point.columns("mode")
    columns = [*others, "mode", "baseline_mode", "baseline_runs", "mode_runs", "baseline_median", "mode_median",
               "baseline_mean", "mode_mean", "baseline_cv_percent", "mode_cv_percent", "ratio_to_baseline_of_means",
               "ratio_ci95_low", "ratio_ci95_high", "significance", "communication_overhead_percent_of_means",
               "communication_overhead_ci95_low", "communication_overhead_ci95_high", "note"]
    ok = _ok_runs(runs)
    rows = []
    for point, group in ok.groupby(others, dropna=False, sort=True):
        framework = dict(zip(others, point))["framework"]
        base_mode = DEFAULT_MODE.get(framework, "horovod")
        baseline = group.loc[group["mode"] == base_mode, "images_per_sec"]
        for mode, rates in group[group["mode"] != base_mode].groupby("mode")["images_per_sec"]:
            row = {**dict(zip(others, point)), "mode": mode, "baseline_mode": base_mode, **_basis("mode", rates),
                   "mode_cv_percent": _cv(rates)}
            if baseline.empty:
                rows.append({**row, "note": f"no {base_mode} run at this point"})
                continue
            row |= {**_basis("baseline", baseline), "baseline_cv_percent": _cv(baseline),
                    **_ratio_columns("ratio_to_baseline", ratio_interval(rates, baseline, base_mode))}
            if mode == LOCAL_MODE:
                # Fieller's set for baseline / local is the inverse of the set for local / baseline
                # (same inequality, same degrees of freedom): the same interval, turned over.
                row |= _overhead_columns("communication_overhead", ratio_interval(baseline, rates, LOCAL_MODE))
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


# Modes that do the same work in each framework: its data-parallel baseline, or no exchange at all.
COUNTERPARTS = {"horovod": "ddp", LOCAL_MODE: LOCAL_MODE}


def frameworks_table(runs: pd.DataFrame) -> pd.DataFrame:
    """PyTorch beside TensorFlow at the same point (Horovod against DDP, local against local): ratio =
    mean(pytorch) / mean(tensorflow) over the repetitions, with Fieller's 95% interval and both CVs."""
    others = Point.columns("framework", "mode")
    columns = [*others, "tensorflow_mode", "pytorch_mode", "tensorflow_runs", "pytorch_runs", "tensorflow_median",
               "pytorch_median", "tensorflow_mean", "pytorch_mean", "tensorflow_cv_percent", "pytorch_cv_percent",
               "ratio_to_tensorflow_of_means", "ratio_ci95_low", "ratio_ci95_high", "significance", "note"]
    ok = _ok_runs(runs)
    rows = []
    for point, group in ok.groupby(others, dropna=False, sort=True):
        for tf_mode, torch_mode in COUNTERPARTS.items():
            tf = group.loc[(group["framework"] == "tensorflow") & (group["mode"] == tf_mode), "images_per_sec"]
            torch = group.loc[(group["framework"] == "pytorch") & (group["mode"] == torch_mode), "images_per_sec"]
            if torch.empty:
                continue
            row = {**dict(zip(others, point)), "tensorflow_mode": tf_mode, "pytorch_mode": torch_mode,
                   **_basis("pytorch", torch), "pytorch_cv_percent": _cv(torch)}
            if tf.empty:
                rows.append({**row, "note": f"no tensorflow {tf_mode} run at this point"})
                continue
            rows.append({**row, **_basis("tensorflow", tf), "tensorflow_cv_percent": _cv(tf),
                         **_ratio_columns("ratio_to_tensorflow", ratio_interval(torch, tf, "tensorflow"))})
    return pd.DataFrame(rows, columns=columns)


def _cv(rates: pd.Series) -> float:
    return 100 * rates.std(ddof=1) / rates.mean() if rates.count() > 1 else np.nan


def input_overhead_table(runs: pd.DataFrame) -> pd.DataFrame:
    """(synthetic - real) / synthetic in percent of the means at the same point: the cost of reading
    real data, with its interval from Fieller's interval of real / synthetic."""
    others = Point.columns("data")
    columns = [*others, "synthetic_runs", "real_runs", "synthetic_median", "real_median", "synthetic_mean",
               "real_mean", "input_overhead_percent_of_means", "input_overhead_ci95_low", "input_overhead_ci95_high",
               "significance"]
    rows = []
    for point, group in _ok_runs(runs).groupby(others, dropna=False, sort=True):
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
    ok = _ok_runs(runs)
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "peak_host_memory_gib", "peak_gpu_memory_gib", "runs"])
    return ok.groupby(keys, dropna=False).agg(
        peak_host_memory_gib=("peak_host_memory_gib", "median"),
        peak_gpu_memory_gib=("peak_gpu_memory_gib", "median"),
        runs=("run_id", "count")).reset_index()


def study_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The CSCS report's Table 1 shape: ranks, mode, data, images/s (with framework, runtime and fabric)."""
    if summary.empty:
        return pd.DataFrame(columns=["framework", "ranks", "mode", "data", "runtime", "fabric", "batch/rank", "img/s",
                                     "std"])
    table = summary[["framework", "ranks", "mode", "data", "runtime", "fabric", "batch_size", "images_per_sec_median",
                     "images_per_sec_std"]].rename(columns={"batch_size": "batch/rank", "images_per_sec_median": "img/s",
                                                            "images_per_sec_std": "std"})
    return table.sort_values(["framework", "runtime", "fabric", "mode", "data", "ranks"], ignore_index=True)


def netbench_table(records: list[dict]) -> pd.DataFrame:
    """Long table of every ping-pong and allreduce measurement of ok netbench runs."""
    rows = []
    for record in records:
        if record.get("kind") != "netbench" or record["status"] != "ok":
            continue
        spec = record["spec"]
        for test in ("pingpong", "allreduce"):
            for point in record["result"].get(test, []):
                # What moved the bytes: MPI, or torch.distributed's backend (Gloo, NCCL) for a PyTorch sweep.
                rows.append({"run_id": record["run_id"], "runtime": runtime_label(spec.get("runtime"), spec.get("mpi_model")),
                             "backend": record["result"].get("backend", "mpi"),
                             "fabric": spec.get("fabric"), "nodes": spec.get("nodes"), "ranks": spec.get("ranks"),
                             "repetition": spec.get("repetition"), **point})
    return pd.DataFrame(rows)


TELEMETRY_KEYS = list(Point.TELEMETRY_COLUMNS)


def telemetry_table(records: list[dict]) -> pd.DataFrame:
    """Long table of every run's sampled rates per node over time (t_s = 0: the measured window starts)."""
    rows = []
    for record in records:
        spec = record.get("spec") or {}
        keys = {"run_id": record["run_id"], "kind": record.get("kind"),
                **{key: spec.get(key) for key in TELEMETRY_KEYS[2:]}}
        for host, samples in ((record.get("telemetry") or {}).get("series") or {}).items():
            rows += [{**keys, "host": host, **sample} for sample in samples]
    return pd.DataFrame(rows, columns=None if rows else [*TELEMETRY_KEYS, "host", "t_s"])


def failures_table(records: list[dict], problems=()) -> pd.DataFrame:
    rows = [{"run_id": r["run_id"], "kind": r.get("kind"), "status": r["status"], "reason": "; ".join(r["reasons"]),
             "evidence": r.get("evidence"), "log": r["log"]["path"]} for r in records if r["status"] != "ok"]
    rows += [{"run_id": Path(path).stem, "kind": None, "status": "unreadable", "reason": why, "evidence": None,
              "log": path} for path, why in problems]
    return pd.DataFrame(rows, columns=["run_id", "kind", "status", "reason", "evidence", "log"])


def _markdown(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, floatfmt=".4g") if not frame.empty else "_none_"


def markdown_summary(tables: dict[str, pd.DataFrame]) -> str:
    """The headline tables as Markdown, for pasting into a ticket."""
    summary = tables["summary"]
    headline = summary[[c for c in ("framework", "runtime", "fabric", "mode", "data", "nodes", "ranks", "batch_size",
                                    "repetitions", "images_per_sec_median", "cv_percent", "scaling_efficiency_percent", "repetitions_stop")
                        if c in summary]] if not summary.empty else summary
    sections = [
        ("Throughput (images/s, median over repetitions)", headline),
        ("Container overhead vs bare metal (% of the means, Fieller 95% interval)", tables["overhead"]),
        ("Interconnects (ratio of mean throughputs, Fieller 95% interval)", tables["fabrics"]),
        ("Distribution modes (ratio of means to the framework's baseline, Fieller 95% interval)", tables["modes"]),
        ("Frameworks (PyTorch / TensorFlow, ratio of means, Fieller 95% interval)", tables["frameworks"]),
        ("Input overhead (% of the means, Fieller 95% interval)", tables["input"]),
        ("Table 1 (ranks, mode, data, images/s)", tables["table1"]),
        ("Failed, invalid, disturbed and unreadable runs", tables["failures"]),
    ]
    return "\n\n".join(f"### {title}\n\n{_markdown(frame)}" for title, frame in sections) + "\n"


def build_tables(records: list[dict], problems=(), stops: dict[str, str] | None = None) -> dict[str, pd.DataFrame]:
    runs = runs_table(records)
    summary = summary_table(runs, stops)
    provenance = {(r["result"].get("provenance") or {}).get("hash"): r["result"].get("provenance")
                  for r in records if r.get("kind") == "train" and r.get("result")}
    losses = losses_table(records)
    trajectories = trajectory_table(losses)
    return {
        "runs": runs,
        "summary": summary,
        "overhead": overhead_table(runs, provenance, trajectories),
        "losses": losses,
        "trajectories": trajectories,
        "fabrics": fabric_table(runs),
        "modes": modes_table(runs),
        "frameworks": frameworks_table(runs),
        "input": input_overhead_table(runs),
        "memory": memory_table(runs),
        "table1": study_table(summary),
        "netbench": netbench_table(records),
        "telemetry": telemetry_table(records),
        "failures": failures_table(records, problems),
    }


# Every file write_tables makes, by name: the workflow declares each as an output.
TABLES = ("runs", "summary", "overhead", "losses", "trajectories", "fabrics", "modes", "frameworks", "input",
          "memory", "table1", "netbench", "telemetry", "failures")
TABLE_FILES = {**{name: f"{name}.csv" for name in TABLES}, "table1_md": "table1.md", "summary_md": "summary.md"}


# TensorBoard event files, one directory per training run, beside the tables.
TENSORBOARD_DIR = "tensorboard"


def write_tensorboard(losses: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Each run's loss per step as TensorBoard scalars (OUT_DIR/<run_id>/events.out.tfevents.*), the studies'
    tool for loss curves: `tensorboard --logdir results/tensorboard` overlays the runtimes."""
    from tensorboardX import SummaryWriter

    Path(out_dir).mkdir(parents=True, exist_ok=True)  # a declared output, even with no training run
    written = []
    for run_id, run in losses.groupby("run_id", sort=True):
        with SummaryWriter(str(Path(out_dir) / run_id)) as writer:
            for step, loss in zip(run["step"], run["loss"]):
                writer.add_scalar("loss", float(loss), int(step))
        written.append(Path(out_dir) / run_id)
    return written


def write_tables(record_paths, out_dir: str | Path, stops: dict[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """Every table as OUT_DIR/<name>.csv, plus table1.md and summary.md (TABLE_FILES), and the runs'
    TensorBoard files under OUT_DIR/tensorboard."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records, problems = load_records(record_paths)
    tables = build_tables(records, problems, stops)
    for name in TABLES:
        tables[name].to_csv(out_dir / TABLE_FILES[name], index=False, float_format="%.6g")
    (out_dir / TABLE_FILES["table1_md"]).write_text(_markdown(tables["table1"]) + "\n")
    (out_dir / TABLE_FILES["summary_md"]).write_text(markdown_summary(tables))
    write_tensorboard(tables["losses"], out_dir / TENSORBOARD_DIR)
    return tables
