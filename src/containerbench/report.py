"""The HTML report: one self-contained file (plots inlined), built from the tables.

It reads the CSV tables and run records that results.py wrote and nothing
upstream of them, so every figure in it traces to a record and its raw log.
"""

from __future__ import annotations

import base64
import io
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on login or compute nodes
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from jinja2 import Environment, PackageLoader, select_autoescape  # noqa: E402

from containerbench.results import load_records  # noqa: E402

SUMMARY_COLUMNS = {
    "runtime": "runtime", "fabric": "fabric", "nodes": "nodes", "ranks": "ranks", "batch_size": "batch/rank",
    "repetitions": "reps", "failed_or_invalid": "failed", "images_per_sec_median": "img/s median",
    "images_per_sec_std": "std", "cv_percent": "CV %", "ci95_low": "95% CI low", "ci95_high": "95% CI high",
    "images_per_sec_min": "min", "images_per_sec_max": "max", "per_rank_median": "img/s per rank",
    "speedup": "speedup", "scaling_efficiency_percent": "scaling eff. %",
}


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _series(summary: pd.DataFrame):
    for (runtime, fabric, batch), group in summary.groupby(["runtime", "fabric", "batch_size"]):
        group = group.dropna(subset=["images_per_sec_median"]).sort_values("ranks")
        if not group.empty:
            yield f"{runtime} / {fabric} / batch {batch}", group


def throughput_plot(summary: pd.DataFrame) -> str | None:
    if summary.empty or summary["images_per_sec_median"].isna().all():
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, group in _series(summary):
        errors = [group["images_per_sec_median"] - group["images_per_sec_min"],
                  group["images_per_sec_max"] - group["images_per_sec_median"]]
        left.errorbar(group["ranks"], group["images_per_sec_median"], yerr=errors, marker="o", capsize=4, label=label)
        right.plot(group["ranks"], group["scaling_efficiency_percent"], marker="o", label=label)
    ranks = sorted(summary["ranks"].unique())
    left.set(xlabel="ranks", ylabel="images/s (median; bars: min-max)", title="Training throughput", xticks=ranks)
    right.axhline(100, color="grey", linestyle="--", label="ideal")
    right.set(xlabel="ranks", ylabel="scaling efficiency (%)", title="Scaling efficiency vs fewest ranks",
              xticks=ranks, ylim=(0, max(110, summary["scaling_efficiency_percent"].max() * 1.1)))
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return _png(figure)


def network_plot(netbench: pd.DataFrame) -> str | None:
    if netbench.empty:
        return None
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    pingpong = netbench[netbench["test"] == "pingpong"]
    allreduce = netbench[netbench["test"] == "allreduce"]
    for (runtime, fabric), group in pingpong.groupby(["runtime", "fabric"]):
        curve = group.groupby("bytes")[["latency_us", "bandwidth_MBps"]].median()
        axes[0].loglog(curve.index, curve["latency_us"], marker=".", label=f"{runtime} / {fabric}")
        axes[1].semilogx(curve.index, curve["bandwidth_MBps"], marker=".", label=f"{runtime} / {fabric}")
    for (runtime, fabric), group in allreduce.groupby(["runtime", "fabric"]):
        curve = group.groupby("bytes")["busbw_GBps"].median()
        axes[2].semilogx(curve.index, curve, marker=".", label=f"{runtime} / {fabric}")
    axes[0].set(xlabel="message size (bytes)", ylabel="one-way latency (us)", title="Ping-pong latency")
    axes[1].set(xlabel="message size (bytes)", ylabel="bandwidth (MB/s)", title="Ping-pong bandwidth")
    axes[2].set(xlabel="buffer size (bytes)", ylabel="bus bandwidth (GB/s)", title="Allreduce bus bandwidth")
    for axis in axes:
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8)
    return _png(figure)


def _table(frame: pd.DataFrame, columns: dict | None = None) -> str:
    if frame.empty:
        return "<p class='empty'>none</p>"
    if columns:
        frame = frame[[c for c in columns if c in frame]].rename(columns=columns)
    return frame.to_html(index=False, na_rep="–", float_format=lambda v: f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}",
                         classes="data", border=0)


def environment_rows(records: list[dict]) -> list[tuple[str, str]]:
    """What ran where: versions, provenance hashes, hosts, launchers."""
    results = [r["result"] for r in records if r["status"] == "ok" and r.get("kind") == "train"]
    def distinct(values):
        return ", ".join(sorted({str(v) for v in values if v is not None})) or "–"
    rows = [
        ("system", distinct(r["spec"].get("system") for r in records)),
        ("benchmark provenance hash", distinct((x.get("provenance") or {}).get("hash") for x in results)),
        ("Python", distinct(x["versions"]["python"] for x in results)),
        ("TensorFlow", distinct(x["versions"]["tensorflow"] for x in results)),
        ("Horovod", distinct(x["versions"]["horovod"] for x in results)),
        ("Horovod controller / CPU ops", distinct(f"{x['horovod']['controller']} / {x['horovod']['cpu_operations']}" for x in results)),
        ("MPI", distinct(x["versions"]["mpi"] for x in results)),
        ("launcher", distinct(x["launcher"] for x in results)),
        ("hosts", distinct(h for x in results for h in x["hostnames"])),
        ("model / image size / precision", distinct(f"{x['model']} / {x['image_size']} px / {x['precision']}" for x in results)),
        ("steps (warmup + measured)", distinct(f"{x['warmup_steps']} + {x['steps']}" for x in results)),
    ]
    return rows


def render(tables_dir: str | Path, record_paths, out_path: str | Path) -> None:
    tables_dir = Path(tables_dir)
    summary = pd.read_csv(tables_dir / "summary.csv") if (tables_dir / "summary.csv").stat().st_size > 1 else pd.DataFrame()
    netbench = pd.read_csv(tables_dir / "netbench.csv") if (tables_dir / "netbench.csv").stat().st_size > 1 else pd.DataFrame()
    failures = pd.read_csv(tables_dir / "failures.csv")
    records, _ = load_records(record_paths)
    environment = Environment(loader=PackageLoader("containerbench"), autoescape=select_autoescape())
    page = environment.get_template("report.html.j2").render(
        generated=time.strftime("%Y-%m-%d %H:%M %Z"),
        counts={status: sum(r["status"] == status for r in records) for status in ("ok", "failed", "invalid")},
        environment=environment_rows(records),
        summary_table=_table(summary, SUMMARY_COLUMNS),
        throughput_plot=throughput_plot(summary) if not summary.empty else None,
        network_plot=network_plot(netbench),
        failures_table=_table(failures),
    )
    Path(out_path).write_text(page)
