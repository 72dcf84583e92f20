"""Run records -> tables: the second step of the one-way flow (log -> record -> table -> report).

Every table reads records (records.py) or tables made from them, never a raw
log: the runs and their summary (runtables.py), the comparisons at the same
point (comparisons.py) and the losses (losses.py), and here the netbench,
telemetry and failure tables. `build_tables` makes them all; `write_tables`
writes each as results/<name>.csv (TABLE_FILES lists them all, for the workflow
to declare), plus table1.md and summary.md.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from containerbench import outputs
from containerbench.comparisons import (
    fabric_table,
    frameworks_table,
    input_overhead_table,
    memory_table,
    modes_table,
    overhead_table,
    study_table,
)
from containerbench.comparisons import (
    headline as headline_sentence,
)
from containerbench.losses import losses_table, trajectory_table
from containerbench.point import Point, runtime_label
from containerbench.records import load_records
from containerbench.runtables import runs_table, summary_table
from containerbench.status import Status


def netbench_table(records: list[dict]) -> pd.DataFrame:
    """Long table of every ping-pong and allreduce measurement of ok netbench runs."""
    rows = []
    for record in records:
        if record["kind"] != "netbench" or record["status"] != Status.OK:
            continue
        spec = record["spec"]
        for test in ("pingpong", "allreduce"):
            for point in record["result"].get(test, []):
                # What moved the bytes: MPI, or torch.distributed's backend (Gloo, NCCL) for a PyTorch sweep.
                rows.append({"run_id": record["run_id"],
                             "runtime": runtime_label(spec.get("runtime"), spec.get("mpi_model")),
                             "backend": record["result"].get("backend", "mpi"),
                             "fabric": spec.get("fabric"), "nodes": spec.get("nodes"), "ranks": spec.get("ranks"),
                             "repetition": spec.get("repetition"), **point})
    return pd.DataFrame(rows)



TELEMETRY_KEYS = list(Point.TELEMETRY_COLUMNS)


def telemetry_table(records: list[dict]) -> pd.DataFrame:
    """Long table of every run's sampled rates per node over time (t_s = 0: the measured window starts)."""
    rows = []
    for record in records:
        spec = record["spec"]
        keys = {"run_id": record["run_id"], "kind": record["kind"],
                **{key: spec.get(key) for key in TELEMETRY_KEYS[2:]}}
        series = record["telemetry"]["series"] if record["telemetry"] else {}  # null: the run had none
        for host, samples in series.items():
            rows += [{**keys, "host": host, **sample} for sample in samples]
    return pd.DataFrame(rows, columns=None if rows else [*TELEMETRY_KEYS, "host", "t_s"])


def failures_table(records: list[dict], problems=()) -> pd.DataFrame:
    rows = [{"run_id": r["run_id"], "kind": r["kind"], "status": r["status"], "reason": "; ".join(r["reasons"]),
             "evidence": r["evidence"], "log": r["log"]["path"]} for r in records if r["status"] != Status.OK]
    rows += [{"run_id": Path(path).stem, "kind": None, "status": "unreadable", "reason": why, "evidence": None,
              "log": path} for path, why in problems]
    return pd.DataFrame(rows, columns=["run_id", "kind", "status", "reason", "evidence", "log"])


def _markdown(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, floatfmt=".4g") if not frame.empty else "_none_"


def markdown_summary(tables: dict[str, pd.DataFrame]) -> str:
    """The headline tables as Markdown, for pasting into a ticket."""
    summary = tables["summary"]
    headline = summary[[c for c in ("framework", "runtime", "fabric", "mode", "data", "nodes", "ranks", "batch_size",
                                    "repetitions", "images_per_sec_median", "cv_percent", "scaling_efficiency_percent",
                                    "repetitions_stop")
                        if c in summary]] if not summary.empty else summary
    sections = [
        ("Throughput (images/s, median over repetitions)", headline),
        ("Container overhead vs bare metal (% of the means, Fieller 95% interval; paired by repetition beside it)",
         tables["overhead"]),
        ("Interconnects (ratio of mean throughputs, Fieller 95% interval)", tables["fabrics"]),
        ("Distribution modes (ratio of means to the framework's baseline, Fieller 95% interval)", tables["modes"]),
        ("Frameworks (PyTorch / TensorFlow, ratio of means, Fieller 95% interval)", tables["frameworks"]),
        ("Input overhead (% of the means, Fieller 95% interval)", tables["input"]),
        ("Table 1 (ranks, mode, data, images/s: the median over repetitions)", tables["table1"]),
        ("Failed, invalid, disturbed and unreadable runs", tables["failures"]),
    ]
    return (f"{headline_sentence(tables['overhead'])}\n\n"
            + "\n\n".join(f"### {title}\n\n{_markdown(frame)}" for title, frame in sections) + "\n")


def build_tables(records: list[dict], problems=(), stops: dict[str, str] | None = None) -> dict[str, pd.DataFrame]:
    runs = runs_table(records)
    summary = summary_table(runs, stops)
    provenance = {(r["result"].get("provenance") or {}).get("hash"): r["result"].get("provenance")
                  for r in records if r["kind"] == "train" and r["result"]}
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


def _exact_times(table: pd.DataFrame) -> pd.DataFrame:
    """Unix times to the millisecond, as text: six significant digits (the tables' figures) would round
    every run of a sweep to one start, ten thousand seconds wide, and the report's time line reads them."""
    times = [column for column in table.columns if column.endswith("_unix")]
    return table.assign(**{column: table[column].map(lambda value: "" if pd.isna(value) else f"{value:.3f}")
                           for column in times})


def write_tables(record_paths, out_dir: str | Path, stops: dict[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """Every table as OUT_DIR/<name>.csv, plus table1.md and summary.md (TABLE_FILES), and the runs'
    TensorBoard files under OUT_DIR/tensorboard."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records, problems = load_records(record_paths)
    tables = build_tables(records, problems, stops)
    for name in TABLES:
        with outputs.replacing(out_dir / TABLE_FILES[name]) as partial:
            _exact_times(tables[name]).to_csv(partial, index=False, float_format="%.6g")
    outputs.write_text(out_dir / TABLE_FILES["table1_md"], _markdown(tables["table1"]) + "\n")
    outputs.write_text(out_dir / TABLE_FILES["summary_md"], markdown_summary(tables))
    write_tensorboard(tables["losses"], out_dir / TENSORBOARD_DIR)
    return tables
