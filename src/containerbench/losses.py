"""Run records -> each training run's loss per step, and each container run's loss trajectory against
bare metal's: runs that trained the same benchmark follow the same trajectory.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from containerbench.point import Point
from containerbench.runtables import BASELINE_RUNTIME, train_row
from containerbench.status import Status

# Runs with the same seed, framework, precision and ranks follow one loss trajectory in every runtime
# (measured here: bit-identical on CPUs); GPU kernels that sum in another order may part by rounding.
# A trajectory further than this from bare metal's, relative to it, ran another benchmark.
LOSS_TOLERANCE = 0.02
LOSS_KEYS = Point.run_columns()


def losses_table(records: list[dict]) -> pd.DataFrame:
    """Rank 0's loss at every step (warmup included, `measured` tells) of each ok training run."""
    rows = []
    for record in records:
        if record.get("kind") != "train" or record["status"] != Status.OK:
            continue
        row = {key: value for key, value in train_row(record).items() if key in LOSS_KEYS}
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
