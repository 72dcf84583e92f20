"""The HTML report: one self-contained file (plots inlined), built from the tables.

It reads the CSV tables (results.py) and the run records (records.py) it is given, and nothing
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

from containerbench import outputs  # noqa: E402
from containerbench.comparisons import headline  # noqa: E402
from containerbench.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS  # noqa: E402
from containerbench.records import load_records  # noqa: E402
from containerbench.results import TABLES  # noqa: E402
from containerbench.runtables import POINT  # noqa: E402
from containerbench.status import Status  # noqa: E402

SUMMARY_COLUMNS = {
    "framework": "framework", "runtime": "runtime", "fabric": "fabric", "mode": "mode", "data": "data",
    "nodes": "nodes", "ranks": "ranks", "batch_size": "batch/rank", "repetitions": "reps",
    "failed_or_invalid": "failed", "disturbed": "disturbed", "unjudged": "unjudged", "images_per_sec_median":
    "img/s median", "median_ci95_low": "median CI95 low", "median_ci95_high": "median CI95 high",
    "images_per_sec_mean": "img/s mean", "ci95_low": "mean CI95 low", "ci95_high": "mean CI95 high",
    "images_per_sec_std": "std", "cv_percent": "CV %", "images_per_sec_min": "min", "images_per_sec_max": "max",
    "per_rank_median": "img/s per rank", "speedup": "speedup", "scaling_efficiency_percent": "scaling eff. %",
    "repetitions_stop": "reps stopped",  # repetitions: auto only (why the point stopped)
}


def figure_png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _series(summary: pd.DataFrame):
    # Framework, mode and data name a line only when the sweep varies them.
    varied = [c for c in ("framework", "mode", "data") if c in summary and summary[c].nunique() > 1]
    for key, group in summary.groupby(["runtime", "fabric", "batch_size", *varied]):
        group = group.dropna(subset=["images_per_sec_median"]).sort_values("ranks")
        if not group.empty:
            runtime, fabric, batch, *variant = key
            yield " / ".join([runtime, fabric, f"batch {batch}", *map(str, variant)]), group


def throughput_plot(summary: pd.DataFrame) -> str | None:
    if summary.empty or summary["images_per_sec_median"].isna().all():
        return None
    series = list(_series(summary))
    many = len(series) > 3  # then the legend goes below the plots, where it hides no point
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4 + 0.25 * len(series) * many))
    for label, group in series:
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
    if many:
        handles, labels = left.get_legend_handles_labels()
        figure.legend(handles, labels, fontsize=8, loc="lower center", ncol=2, frameon=False)
        figure.subplots_adjust(bottom=0.12 + 0.06 * ((len(series) + 1) // 2))
        right.legend(handles=right.get_legend_handles_labels()[0][-1:], fontsize=8)  # the ideal line
    else:
        left.legend(fontsize=8)
        right.legend(fontsize=8)
    return figure_png(figure)


USAGE_PLOT_RUNS = 6  # utilisation and traffic over time: at most this many runs, one row of plots each


def usage_runs(telemetry: pd.DataFrame) -> list[str]:
    """One run per (kind, mode, runtime, fabric): the largest layout, its last repetition; the UIUC study's
    comparison of parameter server and all-reduce, per runtime."""
    if telemetry.empty or "run_id" not in telemetry:
        return []
    runs = telemetry.drop_duplicates("run_id").sort_values(["nodes", "ranks", "repetition"])
    chosen = runs.groupby(["kind", "mode", "runtime", "fabric"], dropna=False).tail(1)
    chosen = chosen.sort_values(["kind", "mode", "runtime", "fabric"], ascending=[False, True, True, True])
    return list(chosen["run_id"])[:USAGE_PLOT_RUNS]


def usage_plot(telemetry: pd.DataFrame) -> str | None:
    """Per chosen run and node: CPU busy (the run's processes and everything else) and packets per second."""
    runs = usage_runs(telemetry)
    if not runs:
        return None
    figure, axes = plt.subplots(len(runs), 2, figsize=(12, 2.6 * len(runs)), squeeze=False)
    for (cpu, net), run_id in zip(axes, runs):
        run = telemetry[telemetry["run_id"] == run_id]
        first = run.iloc[0]
        what = f"train, {first['mode']}" if first["kind"] == "train" else first["kind"]
        title = f"{what} / {first['runtime']} / {first['fabric']} / {first['nodes']}x{first['ranks'] // first['nodes']}"
        for host, samples in run.groupby("host"):
            line = cpu.plot(samples["t_s"], samples["run_cpu_percent"], marker=".", label=f"{host}: the run")[0]
            cpu.plot(samples["t_s"], samples["other_cpu_percent"], marker=".", linestyle=":", color=line.get_color(),
                     label=f"{host}: everything else")
            line = net.plot(samples["t_s"], samples["tx_packets_per_s"], marker=".", label=f"{host}: sent")[0]
            net.plot(samples["t_s"], samples["rx_packets_per_s"], marker=".", linestyle=":", color=line.get_color(),
                     label=f"{host}: received")
        cpu.set(ylabel="CPU busy (% of node)", ylim=(0, 105), title=title)
        net.set(ylabel="packets/s", title="packets on the fabric's interface")
        for axis in (cpu, net):
            axis.axvline(0, color="grey", linewidth=0.8)  # the measured window starts
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
    for axis in axes[-1]:
        axis.set_xlabel("seconds from the first measured step")
    figure.tight_layout()
    return figure_png(figure)


def network_plot(netbench: pd.DataFrame) -> str | None:
    if netbench.empty:
        return None
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    pingpong = netbench[netbench["test"] == "pingpong"]
    allreduce = netbench[netbench["test"] == "allreduce"]
    # One curve per runtime, what moved the bytes, fabric and layout (netbench runs at every node count).
    curves = ["runtime", "backend", "fabric", "nodes", "ranks"]
    netbench = netbench.assign(backend=netbench["backend"].fillna("mpi")) if "backend" in netbench else \
        netbench.assign(backend="mpi")
    pingpong = netbench[netbench["test"] == "pingpong"]
    allreduce = netbench[netbench["test"] == "allreduce"]

    def label(runtime, backend, fabric, nodes, ranks):
        over = "" if backend == "mpi" else f" ({backend})"
        return f"{runtime}{over} / {fabric} / {nodes}x{ranks // nodes}"

    for key, group in pingpong.groupby(curves):
        curve = group.groupby("bytes")[["latency_us", "bandwidth_MBps"]].median()
        axes[0].loglog(curve.index, curve["latency_us"], marker=".", label=label(*key))
        axes[1].semilogx(curve.index, curve["bandwidth_MBps"], marker=".", label=label(*key))
    for key, group in allreduce.groupby(curves):
        curve = group.groupby("bytes")["busbw_GBps"].median()
        axes[2].semilogx(curve.index, curve, marker=".", label=label(*key))
    axes[0].set(xlabel="message size (bytes)", ylabel="one-way latency (us)", title="Ping-pong latency")
    axes[1].set(xlabel="message size (bytes)", ylabel="bandwidth (MB/s)", title="Ping-pong bandwidth")
    axes[2].set(xlabel="buffer size (bytes)", ylabel="bus bandwidth (GB/s)", title="Allreduce bus bandwidth")
    for axis in axes:
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8)
    return figure_png(figure)


def overhead_plot(overhead: pd.DataFrame) -> str | None:
    measured = overhead.dropna(subset=["overhead_percent_of_means"]) if not overhead.empty else overhead
    if measured.empty:
        return None
    labels = [f"{r.runtime} / {r.fabric}\n{r.ranks} rank(s), b{r.batch_size}" for r in measured.itertuples()]
    low = (measured["overhead_percent_of_means"] - measured["overhead_ci95_low"]).fillna(0)
    high = (measured["overhead_ci95_high"] - measured["overhead_percent_of_means"]).fillna(0)
    figure, axis = plt.subplots(figsize=(max(6, 1.6 * len(measured)), 4.5))
    axis.bar(range(len(measured)), measured["overhead_percent_of_means"], yerr=[low, high], capsize=5, color="#7986cb")
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xticks(range(len(measured)), labels, fontsize=8, rotation=20, ha="right")
    axis.set(ylabel="overhead vs bare metal (% of the means)\n(bars: Fieller 95% CI; > 0 = slower)",
             title="Container overhead")
    axis.grid(alpha=0.3, axis="y")
    return figure_png(figure)


def timeline_plot(runs: pd.DataFrame) -> str | None:
    """Each ok training run where it started, its throughput against its point's median: the order the runs
    ran in (rotated from one repetition to the next, plans.run_order) and any drift, by runtime."""
    ok = runs[(runs["status"] == Status.OK) & runs["started_unix"].notna()] if "started_unix" in runs else runs[:0]
    if ok.empty:
        return None
    start = ok["started_unix"].min()
    relative = 100 * (ok["images_per_sec"] / ok.groupby(POINT, dropna=False)["images_per_sec"].transform("median") - 1)
    figure, axis = plt.subplots(figsize=(10, 3.8))
    for runtime, group in ok.groupby("runtime"):
        axis.scatter((group["started_unix"] - start) / 60, relative[group.index], label=runtime, s=22)
    for repetition, group in ok.groupby("repetition"):
        first = (group["started_unix"].min() - start) / 60
        axis.axvline(first, color="grey", linewidth=0.6, linestyle="--")
        axis.annotate(f"rep {repetition}", (first, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top")
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set(xlabel="minutes since the first run started", ylabel="img/s vs its point's median (%)",
             title="Every run in the order it ran")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return figure_png(figure)


def side_by_side_plot(summary: pd.DataFrame, column: str, title: str) -> str | None:
    """One bar per value of `column` at each (runtime, ranks, batch) point, min-max whiskers."""
    if summary.empty or column not in summary or summary[column].nunique() < 2:
        return None
    values = sorted(summary[column].unique())
    points = summary.groupby(["runtime", "ranks", "batch_size"], sort=True)
    figure, axis = plt.subplots(figsize=(max(9, 1.2 * len(points) * len(values)), 4))
    width = 0.8 / len(values)
    for i, value in enumerate(values):
        rows = [group[group[column] == value] for _, group in points]
        medians = [row["images_per_sec_median"].median() for row in rows]
        low = [m - row["images_per_sec_min"].min() for m, row in zip(medians, rows)]
        high = [row["images_per_sec_max"].max() - m for m, row in zip(medians, rows)]
        axis.bar([j + i * width for j in range(len(points))], medians, width, yerr=[low, high], capsize=3, label=value)
    axis.set_xticks([j + width * (len(values) - 1) / 2 for j in range(len(points))],
                    [f"{runtime}\n{ranks} ranks, b{batch}" for (runtime, ranks, batch), _ in points], fontsize=8)
    axis.set(ylabel="images/s (median; bars: min-max)", title=title)
    axis.legend()
    axis.grid(alpha=0.3, axis="y")
    return figure_png(figure)


def loss_plot(losses: pd.DataFrame) -> str | None:
    """Loss against step, one line per runtime (first repetition, first fabric and batch size), one panel
    per framework and rank count: lines that lie on each other trained the same benchmark."""
    if losses.empty:
        return None
    losses = losses[(losses["repetition"] == losses["repetition"].min()) & (losses["fabric"] == losses["fabric"].min())
                    & (losses["batch_size"] == losses["batch_size"].min())]
    panels = list(losses.groupby(["framework", "mode", "data", "ranks"], sort=True))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False, sharey=True)
    for axis, ((framework, mode, data, ranks), panel) in zip(axes[0], panels):
        for (runtime,), run in panel.groupby(["runtime"], sort=True):
            run = run.sort_values("step")
            axis.plot(run["step"], run["loss"], marker=".", label=runtime, alpha=0.8)
        warmup = panel.loc[~panel["measured"], "step"]
        if not warmup.empty:
            axis.axvspan(0.5, warmup.max() + 0.5, color="grey", alpha=0.12, label="warmup")
        axis.set(title=f"{framework} {mode}, {data}, {ranks} rank(s)", xlabel="step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0][0].set_ylabel("training loss (rank 0)")
    return figure_png(figure)


def html_table(frame: pd.DataFrame, columns: dict | None = None) -> str:
    if frame.empty:
        return "<p class='empty'>none</p>"
    if columns:
        frame = frame[[c for c in columns if c in frame]].rename(columns=columns)
    return frame.to_html(index=False, na_rep="–", float_format=lambda v: f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}",
                         classes="data", border=0)


def environment_rows(records: list[dict]) -> list[tuple[str, str]]:
    """What ran where: versions, provenance hashes, hosts, launchers."""
    results = [r["result"] for r in records if r["status"] == Status.OK and r["kind"] == "train"]
    def distinct(values):
        return ", ".join(sorted({str(v) for v in values if v is not None})) or "–"

    def framework(result):
        return result.get("framework") or DEFAULT_FRAMEWORK

    rows = [
        ("system", distinct(r["spec"].get("system") for r in records)),
        # One hash per framework: each has its own venv (and image).
        ("benchmark provenance hash", distinct(f"{(x.get('provenance') or {}).get('hash')} ({framework(x)})"
                                               for x in results)),
        ("Python", distinct(x["versions"]["python"] for x in results)),
        *[(name, distinct(x["versions"].get(key) for x in results))
          for each in FRAMEWORKS.values() for name, key in each.reported_versions
          if any(x["versions"].get(key) for x in results)],
        ("distribution mode / backend", distinct(f"{x['mode']} / {x['distribution']['backend']}" for x in results)),
        ("data", distinct(x["data"] + (f" ({x['data_dir']})" if x.get("data_dir") else "") for x in results)),
        ("MPI", distinct(x["versions"]["mpi"] for x in results)),
        ("launcher", distinct(x["launcher"] for x in results)),
        ("hosts", distinct(h for x in results for h in x["hostnames"])),
        ("model / image size / precision",
         distinct(f"{x['model']} / {x['image_size']} px / {x['precision']}" for x in results)),
        ("steps (warmup + measured)", distinct(f"{x['warmup_steps']} + {x['steps']}" for x in results)),
    ]
    # How each fabric was chosen, and one complete command line: enough to rerun a point by hand.
    fabric_env = {}
    for record in records:
        env = {k: v for k, v in (record["env"] or {}).items()
               if not k.startswith(("PYTHON", "TF_", "CONTAINERBENCH"))}
        fabric_env.setdefault(record["spec"].get("fabric"), env)
    rows += [(f"fabric {name}", " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(no variables)")
             for name, env in sorted(fabric_env.items(), key=lambda item: str(item[0]))]
    example = next((r for r in records if r["kind"] == "train" and r["argv"]), None)
    if example:
        rows.append((f"command of {example['run_id']}", " ".join(example["argv"])))
    return rows


RUN_COLUMNS = {
    "run_id": "run", "runtime": "runtime", "fabric": "fabric", "nodes": "nodes", "ranks": "ranks", "status": "status",
    "images_per_sec": "img/s", "startup_s": "start-up s", "fabric_check": "transport check",
    "transport": "what the logs show", "cpu_utilisation_percent": "CPU busy %", "foreign_cpu_percent": "others' CPU %",
    "service_cpu_percent": "runtime's and launcher's CPU %", "disturbance_check": "disturbance check",
    "traffic_check": "traffic check", "hosts": "hosts",
}
# Each comparison is computed from the means of the repetitions; the column names say so, and the
# medians stand beside them for reading.
OVERHEAD_COLUMNS = {
    "runtime": "runtime", "fabric": "fabric", "ranks": "ranks", "batch_size": "batch/rank",
    "bare_metal_runs": "bare metal runs", "runtime_runs": "runtime runs",
    "bare_metal_median": "bare metal img/s median", "runtime_median": "runtime img/s median",
    "bare_metal_mean": "bare metal img/s mean", "runtime_mean": "runtime img/s mean",
    "overhead_percent_of_means": "overhead % (of means)", "overhead_ci95_low": "95% CI low",
    "overhead_ci95_high": "95% CI high", "significance": "significance", "pairs": "pairs",
    "paired_overhead_percent": "paired overhead % (by repetition)", "paired_ci95_low": "its 95% CI low",
    "paired_ci95_high": "its 95% CI high", "paired_significance": "paired significance",
    "startup_overhead_s": "start-up +s",
    "loss_trajectory": "loss trajectory", "note": "note",
}
TRAJECTORY_COLUMNS = {"framework": "framework", "runtime": "runtime", "mode": "mode", "data": "data", "ranks": "ranks",
                      "batch_size": "batch/rank", "precision": "precision", "runs_compared": "runs",
                      "steps_compared": "steps", "max_relative_difference": "largest relative difference",
                      "loss_trajectory": "loss trajectory"}
FABRIC_COLUMNS = {"runtime": "runtime", "ranks": "ranks", "batch_size": "batch/rank", "faster_fabric": "faster",
                  "slower_fabric": "slower", "faster_runs": "faster runs", "slower_runs": "slower runs",
                  "faster_median": "faster img/s median", "slower_median": "slower img/s median",
                  "faster_mean": "faster img/s mean", "slower_mean": "slower img/s mean",
                  "ratio_of_means": "ratio (of means)", "ratio_ci95_low": "95% CI low",
                  "ratio_ci95_high": "95% CI high", "significance": "significance", "note": "note"}
MODE_COLUMNS = {"framework": "framework", "runtime": "runtime", "fabric": "fabric", "data": "data", "ranks": "ranks",
                "batch_size": "batch/rank", "mode": "mode", "baseline_mode": "baseline",
                "baseline_runs": "baseline runs", "mode_runs": "mode runs",
                "baseline_median": "baseline img/s median", "mode_median": "mode img/s median",
                "baseline_mean": "baseline img/s mean", "mode_mean": "mode img/s mean",
                "baseline_cv_percent": "baseline CV %", "mode_cv_percent": "mode CV %",
                "ratio_to_baseline_of_means": "ratio to baseline (of means)", "ratio_ci95_low": "95% CI low",
                "ratio_ci95_high": "95% CI high", "significance": "significance",
                "communication_overhead_percent_of_means": "communication overhead % (of means)",
                "communication_overhead_ci95_low": "its 95% CI low",
                "communication_overhead_ci95_high": "its 95% CI high",
                # Asynchronous parameter servers against their synchronous rounds (frameworks.SYNCHRONOUS_OF)
                "sync_mode": "synchronous mode", "sync_runs": "synchronous runs",
                "ratio_to_sync_of_means": "ratio to synchronous (of means)",
                "ratio_to_sync_ci95_low": "to synchronous: 95% CI low",
                "ratio_to_sync_ci95_high": "to synchronous: 95% CI high",
                "sync_significance": "to synchronous: significance",
                "mode_loss_at_equal_images": "loss at equal images",
                "sync_loss_at_equal_images": "synchronous loss at equal images",
                "mode_staleness_mean": "staleness (updates)", "sync_staleness_mean": "synchronous staleness",
                "note": "note"}
SYNC_COLUMNS = [name for name in MODE_COLUMNS if "sync" in name or "equal_images" in name or "staleness" in name]


def mode_columns(modes: pd.DataFrame) -> dict[str, str]:
    """The modes table's headings; the asynchronous ones only where a run had its synchronous rounds beside it (a
    modes.csv written before them has none)."""
    paired = "sync_mode" in modes and modes["sync_mode"].notna().any()
    return {name: heading for name, heading in MODE_COLUMNS.items() if paired or name not in SYNC_COLUMNS}


def framework_columns() -> dict[str, str]:
    """The frameworks table's columns and headings: each framework's side by side (the default first), then
    the ratio of each other one to the default one."""
    sides = [FRAMEWORKS[DEFAULT_FRAMEWORK], *(each for each in FRAMEWORKS.values() if each.name != DEFAULT_FRAMEWORK)]
    headings = {"mode": "{label}", "runs": "{short} runs", "median": "{short} img/s median",
                "cv_percent": "{short} CV %"}
    others = "/".join(each.short_label for each in sides[1:])
    return {"runtime": "runtime", "fabric": "fabric", "data": "data", "ranks": "ranks", "batch_size": "batch/rank",
            **{f"{each.name}_{column}": heading.format(label=each.label, short=each.short_label)
               for column, heading in headings.items() for each in sides},
            f"ratio_to_{sides[0].name}_of_means": f"{others} / {sides[0].short_label} (of means)",
            "ratio_ci95_low": "95% CI low", "ratio_ci95_high": "95% CI high", "significance": "significance",
            "note": "note"}
INPUT_COLUMNS = {"runtime": "runtime", "fabric": "fabric", "mode": "mode", "ranks": "ranks", "batch_size": "batch/rank",
                 "synthetic_runs": "synthetic runs", "real_runs": "real runs",
                 "synthetic_median": "synthetic img/s median", "real_median": "real img/s median",
                 "synthetic_mean": "synthetic img/s mean", "real_mean": "real img/s mean",
                 "input_overhead_percent_of_means": "input overhead % (of means)",
                 "input_overhead_ci95_low": "95% CI low", "input_overhead_ci95_high": "95% CI high",
                 "significance": "significance"}
MEMORY_COLUMNS = {"runtime": "runtime", "model": "model", "image_size": "image px", "precision": "precision",
                  "batch_size": "batch/rank", "peak_host_memory_gib": "peak host GiB/rank", "peak_gpu_memory_gib":
                  "peak GPU GiB/rank", "runs": "runs"}


def read_tables(table_files) -> dict[str, pd.DataFrame]:
    """Each CSV table by its name (the file's stem); ValueError names a table that is missing."""
    paths = {Path(path).stem: Path(path) for path in table_files if str(path).endswith(".csv")}
    missing = [name for name in TABLES if name not in paths]
    if missing:
        raise ValueError(f"report: tables missing: {', '.join(missing)} (containerbench tables writes them)")
    tables = {}
    for name in TABLES:
        try:
            tables[name] = pd.read_csv(paths[name])
        except pd.errors.EmptyDataError:  # a table with no columns at all
            tables[name] = pd.DataFrame()
    return tables


SINCE_LAST_COLUMNS = {"variable": "variable", "unit": "unit", "n_a": "runs then", "n_b": "runs now",
                      "mean_a": "mean then", "mean_b": "mean now", "change_percent": "change %",
                      "ci_low_percent": "95% CI low %", "ci_high_percent": "95% CI high %",
                      "significant": "significance"}


def since_last_time(history) -> dict | None:
    """The sessions compared and the table, from `containerbench store --summary --since-last`'s files."""
    if not history:
        return None
    summary_path, table_path = history
    summary = json.loads(Path(summary_path).read_text())
    try:
        changes = pd.read_csv(table_path)
    except pd.errors.EmptyDataError:
        changes = pd.DataFrame()
    return {**summary, "table": html_table(changes, SINCE_LAST_COLUMNS),
            "significant": int((changes.get("significant", pd.Series(dtype=str)) == "significant").sum())}


def render(table_files, record_paths, out_path: str | Path, skipped: dict | None = None, history=None) -> None:
    tables = read_tables(table_files)
    records, _ = load_records(record_paths)
    environment = Environment(loader=PackageLoader("containerbench"), autoescape=select_autoescape())
    page = environment.get_template("report.html.j2").render(
        generated=time.strftime("%Y-%m-%d %H:%M %Z"),
        counts={status.value: sum(r["status"] == status for r in records) for status in Status},
        environment=environment_rows(records),
        headline=headline(tables["overhead"]), summary_table=html_table(tables["summary"], SUMMARY_COLUMNS),
        throughput_plot=throughput_plot(tables["summary"]) if not tables["summary"].empty else None,
        overhead_table=html_table(tables["overhead"], OVERHEAD_COLUMNS),
        loss_plot=loss_plot(tables["losses"]),
        trajectory_table=html_table(tables["trajectories"], TRAJECTORY_COLUMNS),
        overhead_plot=overhead_plot(tables["overhead"]), timeline_plot=timeline_plot(tables["runs"]),
        fabric_table=html_table(tables["fabrics"], FABRIC_COLUMNS),
        fabric_plot=side_by_side_plot(tables["summary"], "fabric", "Throughput by interconnect"),
        mode_table=html_table(tables["modes"], mode_columns(tables["modes"])),
        framework_table=(html_table(tables["frameworks"], framework_columns())
                         if not tables["frameworks"].empty else None),
        mode_plot=side_by_side_plot(tables["summary"], "mode", "Throughput by distribution mode"),
        input_table=html_table(tables["input"], INPUT_COLUMNS),
        data_plot=side_by_side_plot(tables["summary"], "data", "Throughput by input: synthetic vs real data"),
        memory_table=html_table(tables["memory"], MEMORY_COLUMNS),
        study_table=html_table(tables["table1"]),
        network_plot=network_plot(tables["netbench"]),
        usage_plot=usage_plot(tables["telemetry"]),
        failures_table=html_table(tables["failures"]),
        runs_table=html_table(tables["runs"], RUN_COLUMNS),
        skipped=sorted((skipped or {}).items()),
        since_last=since_last_time(history),
    )
    outputs.write_text(out_path, page)
