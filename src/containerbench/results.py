"""Results flow one way: raw log -> run record -> tables.

`parse_log` reads only the raw log written by launch.execute and turns it into
a run record (JSON): the spec, the benchmark's result line, the exit status,
and the verdict (ok, failed or invalid, with reasons and the evidence line).
The table functions read only records.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from containerbench.launch import EXIT_PREFIX, LAUNCH_PREFIX

RESULT_PREFIX = "containerbench-result "  # printed by bench.py and netbench.py
RECORD_FORMAT = "containerbench.record/1"
# Ranks that averaged their gradients hold the same weights to rounding; ranks
# that did not drift apart by orders of magnitude more than this.
WEIGHT_SPREAD_TOLERANCE = 1e-6

# A sweep point: runs that differ only in repetition.
POINT = ["model", "image_size", "precision", "runtime", "fabric", "nodes", "ranks", "batch_size"]
# Runs whose scaling is compared: a point without its rank count.
SERIES = ["model", "image_size", "precision", "runtime", "fabric", "batch_size"]

RUN_COLUMNS = ["run_id", "status", "reason", "evidence", "system", *POINT, "repetition", "images_per_sec",
               "rank_images_per_sec_min", "rank_images_per_sec_max", "step_s_median", "peak_host_memory_gib",
               "startup_s", "wall_s", "provenance", "hosts", "log"]

log = logging.getLogger(__name__)


def _json_line(line: str, prefix: str) -> dict | None:
    try:
        return json.loads(line[len(prefix):])
    except json.JSONDecodeError:
        return None


def _evidence(lines: list[str]) -> str | None:
    """The line most likely to explain a failure: the last error-looking one."""
    candidates = [l.strip() for l in lines if l.strip() and not l.startswith("containerbench-")]
    for line in reversed(candidates):
        if any(word in line for word in ("Error", "error:", "ERROR", "Killed", "Abort", "abort")):
            return line[:500]
    return candidates[-1][:500] if candidates else None


def parse_log(log_path: str | Path) -> dict:
    log_path = Path(log_path)
    raw = log_path.read_bytes()
    lines = raw.decode("utf-8", errors="replace").splitlines()
    launch = exit_ = result = None
    result_line = None
    for number, line in enumerate(lines, start=1):
        if line.startswith(LAUNCH_PREFIX) and launch is None:
            launch = _json_line(line, LAUNCH_PREFIX)
        elif line.startswith(RESULT_PREFIX):
            result, result_line = _json_line(line, RESULT_PREFIX), number
        elif line.startswith(EXIT_PREFIX):
            exit_ = _json_line(line, EXIT_PREFIX)

    reasons: list[str] = []
    status = "ok"
    if launch is None:
        status, launch = "failed", {}
        reasons.append("log has no readable launch line: not written by containerbench launch, or corrupt")
    if exit_ is None:
        status = "failed"
        reasons.append("log ends without an exit line: the run was killed or is still running")
    elif exit_.get("timed_out"):
        status = "failed"
        reasons.append(f"timed out after {launch.get('timeout_s')} s")
    elif exit_.get("returncode") != 0:
        status = "failed"
        reasons.append(f"exit code {exit_.get('returncode')}")
    if result is None:
        status = "failed"
        reasons.append("no result line" if result_line is None else "result line is not valid JSON")

    spec = launch.get("spec", {})
    if status == "ok" and result.get("ranks") != spec.get("ranks"):
        status = "invalid"
        reasons.append(f"ran on {result.get('ranks')} rank(s), the plan asked for {spec.get('ranks')}")
    if status == "ok" and result.get("kind") == "train":
        spread = result.get("weights_max_relative_spread", 0.0)
        if not result.get("weights_identical") and spread > WEIGHT_SPREAD_TOLERANCE:
            status = "invalid"
            reasons.append(f"ranks ended with different weights (relative spread {spread:.2e}): "
                           "gradients were not averaged, this was not data-parallel training")

    started = launch.get("started_unix")
    per_rank = (result or {}).get("per_rank") or []
    startup = min(r["entry_unix_time"] for r in per_rank) - started if per_rank and started else None
    return {
        "record": RECORD_FORMAT,
        "run_id": launch.get("run_id", log_path.stem),
        "kind": spec.get("kind", (result or {}).get("kind")),
        "status": status,
        "reasons": reasons,
        "evidence": _evidence(lines) if status == "failed" else None,
        "spec": spec,
        "argv": launch.get("argv"),
        "env": launch.get("env"),
        "host": launch.get("host"),
        "returncode": (exit_ or {}).get("returncode"),
        "wall_s": (exit_ or {}).get("wall_s"),
        "startup_s": startup,
        "result": result,
        "log": {"path": str(log_path), "sha256": hashlib.sha256(raw).hexdigest(), "result_line": result_line},
    }


def load_records(paths) -> tuple[list[dict], list[tuple[str, str]]]:
    """Read run records; a corrupt one is reported with its path and skipped."""
    records, problems = [], []
    for path in sorted(map(str, paths)):
        try:
            with open(path) as handle:
                record = json.load(handle)
            if record.get("record") != RECORD_FORMAT:
                raise ValueError(f"not a {RECORD_FORMAT} record")
            records.append(record)
        except (OSError, ValueError) as error:
            log.warning("skipping %s: %s", path, error)
            problems.append((path, str(error)))
    return records, problems


def _train_row(record: dict) -> dict:
    spec, result = record["spec"], record.get("result") or {}
    per_rank = result.get("per_rank") or []
    rank_rates = [r["images_per_sec"] for r in per_rank]
    steps = [t for r in per_rank for t in r["step_s"]]
    return {
        "run_id": record["run_id"],
        "status": record["status"],
        "reason": "; ".join(record["reasons"]),
        "evidence": record.get("evidence"),
        "system": spec.get("system"),
        "model": result.get("model"),
        "image_size": result.get("image_size"),
        "precision": result.get("precision"),
        "runtime": spec.get("runtime"),
        "fabric": spec.get("fabric"),
        "nodes": spec.get("nodes"),
        "ranks": spec.get("ranks"),
        "batch_size": spec.get("batch_size"),
        "repetition": spec.get("repetition"),
        "images_per_sec": result.get("images_per_sec", np.nan) if record["status"] == "ok" else np.nan,
        "rank_images_per_sec_min": min(rank_rates, default=np.nan),
        "rank_images_per_sec_max": max(rank_rates, default=np.nan),
        "step_s_median": float(np.median(steps)) if steps else np.nan,
        "peak_host_memory_gib": max((r["peak_host_memory_bytes"] for r in per_rank), default=np.nan) / 2**30,
        "startup_s": record.get("startup_s"),
        "wall_s": record.get("wall_s"),
        "provenance": (result.get("provenance") or {}).get("hash"),
        "hosts": ",".join(sorted(set(result.get("hostnames") or []))),
        "log": record["log"]["path"],
    }


def runs_table(records: list[dict]) -> pd.DataFrame:
    rows = [_train_row(r) for r in records if r.get("kind") == "train"]
    if not rows:
        return pd.DataFrame(columns=RUN_COLUMNS)
    return pd.DataFrame(rows).sort_values(["runtime", "fabric", "ranks", "batch_size", "repetition"], ignore_index=True)


def _ci95(values: pd.Series) -> tuple[float, float]:
    n = values.count()
    if n < 2:
        return np.nan, np.nan
    half = stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n)
    return values.mean() - half, values.mean() + half


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep point: repetitions, spread, and scaling vs the fewest ranks."""
    if runs.empty:
        return pd.DataFrame()
    ok = runs[runs["status"] == "ok"]
    rows = []
    for point, group in runs.groupby(POINT, dropna=False, sort=True):
        rates = ok.loc[ok.index.intersection(group.index), "images_per_sec"]
        low, high = _ci95(rates)
        rows.append({
            **dict(zip(POINT, point)),
            "repetitions": int(rates.count()),
            "failed_or_invalid": int((group["status"] != "ok").sum()),
            "images_per_sec_median": rates.median(),
            "images_per_sec_mean": rates.mean(),
            "images_per_sec_std": rates.std(ddof=1),
            "cv_percent": 100 * rates.std(ddof=1) / rates.mean() if rates.count() > 1 else np.nan,
            "images_per_sec_min": rates.min(),
            "images_per_sec_max": rates.max(),
            "ci95_low": low,
            "ci95_high": high,
            "per_rank_median": rates.median() / point[POINT.index("ranks")],
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


def netbench_table(records: list[dict]) -> pd.DataFrame:
    """Long table of every ping-pong and allreduce measurement of ok netbench runs."""
    rows = []
    for record in records:
        if record.get("kind") != "netbench" or record["status"] != "ok":
            continue
        spec = record["spec"]
        for test in ("pingpong", "allreduce"):
            for point in record["result"].get(test, []):
                rows.append({"run_id": record["run_id"], "runtime": spec.get("runtime"), "fabric": spec.get("fabric"),
                             "nodes": spec.get("nodes"), "ranks": spec.get("ranks"),
                             "repetition": spec.get("repetition"), **point})
    return pd.DataFrame(rows)


def failures_table(records: list[dict]) -> pd.DataFrame:
    rows = [{"run_id": r["run_id"], "kind": r.get("kind"), "status": r["status"], "reason": "; ".join(r["reasons"]),
             "evidence": r.get("evidence"), "log": r["log"]["path"]} for r in records if r["status"] != "ok"]
    return pd.DataFrame(rows, columns=["run_id", "kind", "status", "reason", "evidence", "log"])


def write_tables(record_paths, out_dir: str | Path) -> dict[str, pd.DataFrame]:
    out_dir = Path(out_dir)
    records, problems = load_records(record_paths)
    tables = {
        "runs": runs_table(records),
        "summary": summary_table(runs_table(records)),
        "netbench": netbench_table(records),
        "failures": pd.concat([failures_table(records),
                               pd.DataFrame([{"run_id": Path(p).stem, "kind": None, "status": "unreadable",
                                              "reason": why, "evidence": None, "log": p} for p, why in problems])],
                              ignore_index=True),
    }
    for name, table in tables.items():
        table.to_csv(out_dir / f"{name}.csv", index=False, float_format="%.6g")
    return tables
