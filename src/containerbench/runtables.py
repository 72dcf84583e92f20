"""Run records -> the runs table, one row per training run, and its summary, one row per sweep point.

The first tables of the one-way flow (log -> record -> table -> report): every other table of runs
compares or regroups these rows (comparisons.py, losses.py), and validate and the repetition rounds
read their figures from the summary.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import pandas as pd

from containerbench.frameworks import DEFAULT_FRAMEWORK
from containerbench.intervals import median_interval, t_quantile
from containerbench.point import Point, runtime_label
from containerbench.runtimes import BareMetal
from containerbench.status import Check, Status

# A sweep point's columns: runs that differ only in repetition.
POINT = Point.columns()
# Runs whose scaling is compared: a point without its rank count.
SERIES = Point.columns("nodes", "ranks")

RUN_COLUMNS = ["run_id", "status", "reason", "evidence", "system", *POINT, "repetition", "started_unix",
               "order_in_repetition", "images_per_sec",
               "rank_images_per_sec_min", "rank_images_per_sec_max", "rank_spread_percent", "step_s_median",
               "peak_host_memory_gib", "peak_gpu_memory_gib", "staleness_mean", "loss_at_equal_images",
               "startup_s", "wall_s", "provenance", "image",
               "fabric_check", "transport", "cpu_utilisation_percent", "foreign_cpu_percent", "service_cpu_percent",
               "disturbed", "disturbance_check", "disturbance_reason", "traffic_check", "mpi_model", "mpi_library",
               "binding", "hosts", "log"]
BASELINE_RUNTIME = BareMetal.name


def _mpi_library(result: dict) -> str | None:
    """The MPI library the ranks reported (MPI_Get_library_version), distinct values joined."""
    versions = {((p.get("context") or {}).get("mpi") or {}).get("version") for p in result.get("processes") or []}
    versions = sorted(v for v in versions if v) or (
        [result["versions"]["mpi"]] if (result.get("versions") or {}).get("mpi") else [])
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
    telemetry = record["telemetry"] or {}  # null: the run had none
    nodes = list((telemetry.get("nodes") or {}).values())
    return {
        "cpu_utilisation_percent": float(np.mean([n["cpu_utilisation_percent"] for n in nodes])) if nodes else np.nan,
        "foreign_cpu_percent": 100 * max(n["foreign_cpu_share"] for n in nodes) if nodes else np.nan,
        # A record parsed before the runtime's processes were counted apart has no such figure.
        "service_cpu_percent": max((n.get("service_cpu_percent", np.nan) for n in nodes), default=np.nan),
        "disturbed": telemetry.get("disturbed"),
        # ok, disturbed or unjudged (too few samples in the window), and why; empty in a record made before the check
        "disturbance_check": (telemetry.get("disturbance_check") or {}).get("status"),
        "disturbance_reason": (telemetry.get("disturbance_check") or {}).get("reason"),
        "traffic_check": (telemetry.get("traffic_check") or {}).get("status"),
    }


def train_row(record: dict) -> dict:
    """A training record's row of the runs table (RUN_COLUMNS); losses.py keys its steps by it too."""
    spec, result = record["spec"], record["result"] or {}  # null: the run left no result line
    ok = record["status"] == Status.OK
    per_rank = result.get("per_rank") or []
    rank_rates = [r["images_per_sec"] for r in per_rank]
    steps = sorted(chain.from_iterable(r["step_s"] for r in per_rank))
    gpu_peaks = [r["peak_gpu_memory_bytes"] for r in per_rank if r.get("peak_gpu_memory_bytes") is not None]
    rate = result.get("images_per_sec", np.nan) if ok else np.nan
    updates = result.get("updates") or {}
    fabric_check = record["fabric_check"] or {}  # null in a record made before the check
    return {
        "run_id": record["run_id"],
        "status": record["status"],
        "reason": "; ".join(record["reasons"]),
        "evidence": record["evidence"],
        "system": spec.get("system"),
        # The point comes from the plan, so a failed run still belongs to it.
        **{key: spec.get(key, result.get(key)) for key in POINT},
        "runtime": runtime_label(spec.get("runtime"), spec.get("mpi_model")),  # native beside hybrid
        "framework": spec.get("framework") or result.get("framework") or DEFAULT_FRAMEWORK,  # older records: TF's
        "repetition": spec.get("repetition"),
        "started_unix": record["started_unix"],  # null in records older than 3ea4052
        "images_per_sec": rate,
        "rank_images_per_sec_min": min(rank_rates, default=np.nan),
        "rank_images_per_sec_max": max(rank_rates, default=np.nan),
        "rank_spread_percent": 100 * (max(rank_rates) - min(rank_rates)) * len(rank_rates) / sum(rank_rates)
        if rank_rates else np.nan,
        "step_s_median": float(np.median(steps)) if steps else np.nan,  # of an even count: the mean of the middle two
        "peak_host_memory_gib": max((r["peak_host_memory_bytes"] for r in per_rank), default=np.nan) / 2**30,
        "peak_gpu_memory_gib": max(gpu_peaks) / 2**30 if gpu_peaks else np.nan,
        # Parameter servers' (rank/parameterservers.py): updates applied by others while one was computed, and
        # the final weights' loss on a fixed batch after (warmup + steps) x workers batches; the sync/async pair.
        "staleness_mean": updates.get("staleness_mean", np.nan) if ok else np.nan,
        "loss_at_equal_images": updates.get("loss_at_equal_images", np.nan) if ok else np.nan,
        "startup_s": record["startup_s"],
        "wall_s": record["wall_s"],
        "provenance": (result.get("provenance") or {}).get("hash"),
        "image": record["image"],
        "fabric_check": fabric_check.get("status"),
        "transport": fabric_check.get("reason"),
        **_usage(record),
        "mpi_model": spec.get("mpi_model") or ("host" if spec.get("runtime") == BASELINE_RUNTIME else "hybrid"),
        "mpi_library": _mpi_library(result),
        "binding": binding(result),
        "hosts": ",".join(sorted(set(result.get("hostnames") or []))),
        "log": record["log"]["path"],
    }


def runs_table(records: list[dict]) -> pd.DataFrame:
    rows = [train_row(r) for r in records if r["kind"] == "train"]
    if not rows:
        return pd.DataFrame(columns=RUN_COLUMNS)
    runs = pd.DataFrame(rows, columns=RUN_COLUMNS)
    # The order the training runs of each repetition started in (1: first), as it happened: what
    # plans.run_order asked of the scheduler, and what the time-line plot shows.
    runs["order_in_repetition"] = (runs.groupby(["system", "repetition"], dropna=False)["started_unix"]
                                   .rank(method="first").astype("Int64"))
    return runs.sort_values(["runtime", "fabric", "ranks", "batch_size", "repetition"], ignore_index=True)


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs whose figures count: neither failed, invalid nor disturbed."""
    return runs[runs["status"] == Status.OK]


def _ci95(values: pd.Series) -> tuple[float, float]:
    n = values.count()
    if n < 2:
        return np.nan, np.nan
    half = t_quantile(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n)
    return values.mean() - half, values.mean() + half


def cv_percent(rates: pd.Series) -> float:
    """The coefficient of variation in percent (nan for fewer than two runs)."""
    return 100 * rates.std(ddof=1) / rates.mean() if rates.count() > 1 else np.nan


def summary_table(runs: pd.DataFrame, stops: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per sweep point: repetitions, spread, and scaling vs the fewest ranks. With `stops`
    (point id -> why its repetitions stopped, from the rounds of `repetitions: auto`), a
    repetitions_stop column says it."""
    if runs.empty:
        return pd.DataFrame()
    ok = ok_runs(runs)
    rows = []
    for point, group in runs.groupby(POINT, dropna=False, sort=True):
        good = ok.loc[ok.index.intersection(group.index)]
        rates = good["images_per_sec"]
        low, high = _ci95(rates)
        median_low, median_high = median_interval(rates)
        rows.append({
            **dict(zip(POINT, point)),
            "repetitions": int(rates.count()),
            # A disturbed run is a valid measurement left out of the figures, not a failure: counted apart.
            "failed_or_invalid": int(group["status"].isin([Status.FAILED, Status.INVALID]).sum()),
            "disturbed": int((group["status"] == Status.DISTURBED).sum()),
            # Compared, but nothing showed whether the machine was quiet while they measured.
            "unjudged": int((good["disturbance_check"] == Check.UNJUDGED).sum()),
            "images_per_sec_median": rates.median(),
            # The median's own interval, distribution-free (order statistics; none under 6 repetitions),
            # and the mean's, Student's t (ci95_low, ci95_high): each figure with its interval.
            "median_ci95_low": median_low,
            "median_ci95_high": median_high,
            "images_per_sec_mean": rates.mean(),
            "images_per_sec_std": rates.std(ddof=1),
            "cv_percent": cv_percent(rates),
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
