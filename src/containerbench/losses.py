"""Run records -> each training run's loss per step, and each container run's loss trajectory against
bare metal's: runs that trained the same benchmark follow the same trajectory.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from containerbench.point import Point
from containerbench.runtables import BASELINE_RUNTIME, train_row
from containerbench.status import Status

# Runs with the same seed, framework, precision and ranks follow one loss trajectory in every runtime. How
# far apart "the same training" may be depends on the arithmetic, not on how small the loss has become (a
# relative tolerance calls two runs of a loss near 0.001 diverging for a rounding):
# - GPU kernels that sum in no fixed order part bare metal's own repetitions of the same seed; a run within
#   SPREAD_FACTOR times their spread at a step trained the same thing;
# - where they agree to the bit (CPUs: every runtime's trajectory is bit-identical here), a reordered sum
#   (one TF thread against two, measured on the smoke network) moves the loss by 1e-7 of it: within
#   ROUNDING of the first step's loss.
# Another seed parts by 1e-3 of the loss at the first step already (measured: seed 99 against 1234).
SPREAD_FACTOR = 3.0
ROUNDING = 1e-5
LOSS_KEYS = Point.run_columns()


def losses_table(records: list[dict]) -> pd.DataFrame:
    """Rank 0's loss at every step (warmup included, `measured` tells) of each ok training run."""
    rows = []
    for record in records:
        if record["kind"] != "train" or record["status"] != Status.OK:
            continue
        row = {key: value for key, value in train_row(record).items() if key in LOSS_KEYS}
        rank0 = next((r for r in record["result"].get("per_rank") or [] if r.get("rank") == 0), {})
        warmup = len(rank0.get("warmup_step_s") or [])
        rows += [{**row, "step": step, "measured": step > warmup, "loss": loss}
                 for step, loss in enumerate(rank0.get("loss") or [], 1)]
    return pd.DataFrame(rows, columns=[*LOSS_KEYS, "step", "measured", "loss"])


def tolerance(repetitions: list[np.ndarray]) -> np.ndarray:
    """Per step, how far a run of the same training may be from bare metal's: SPREAD_FACTOR times the
    spread (max - min) of bare metal's repetitions there, at least ROUNDING of the first step's loss."""
    steps = min(len(curve) for curve in repetitions)
    stacked = np.vstack([curve[:steps] for curve in repetitions])
    spread = stacked.max(axis=0) - stacked.min(axis=0)
    return np.maximum(SPREAD_FACTOR * spread, ROUNDING * abs(stacked[0, 0]) if steps else 0.0)


def _parting(loss: pd.Series, reference: pd.Series, allowed: np.ndarray) -> tuple[int | None, float]:
    """The first step where `loss` is further than `allowed` from `reference`, and the largest relative
    difference over the steps all three have."""
    steps = min(len(loss), len(reference), len(allowed))
    ours, theirs = loss.to_numpy()[:steps], reference.to_numpy()[:steps]
    apart = np.flatnonzero(np.abs(ours - theirs) > allowed[:steps])
    relative = np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-12)
    return (int(apart[0]) + 1 if apart.size else None), float(relative.max()) if steps else np.nan


def trajectory_table(losses: pd.DataFrame) -> pd.DataFrame:
    """Each container run's loss trajectory against bare metal's at the same point and repetition
    (seed, framework, precision and ranks equal), within tolerance(): the first step where they part,
    if any. A repetition bare metal did not run is said, not set against another repetition's curve."""
    others = Point.columns("runtime")
    columns = [*others, "runtime", "runs_compared", "steps_compared", "max_relative_difference",
               "first_parting_step", "parting_run", "loss_trajectory"]
    rows = []
    for point, group in losses.groupby(others, dropna=False, sort=True):
        bare = {rep: run.sort_values("step")["loss"] for rep, run in
                group[group["runtime"] == BASELINE_RUNTIME].groupby("repetition")}
        allowed = tolerance([curve.to_numpy() for curve in bare.values()]) if bare else None
        basis = (f"tolerance {SPREAD_FACTOR:g}x the spread of bare metal's {len(bare)} repetition(s), at least "
                 f"{ROUNDING:g} of the first loss")
        for runtime, contained in group[group["runtime"] != BASELINE_RUNTIME].groupby("runtime"):
            row = {**dict(zip(others, point)), "runtime": runtime}
            if dict(zip(others, point))["data"] == "real":
                rows.append({**row, "loss_trajectory": "not checked: real data is read in no fixed order"})
                continue
            compared, steps, worst, parted, unmatched = 0, 0, 0.0, None, []
            for (run_id, rep), run in contained.groupby(["run_id", "repetition"]):
                reference = bare.get(rep)
                if reference is None:
                    unmatched.append(int(rep))
                    continue
                first, largest = _parting(run.sort_values("step")["loss"], reference, allowed)
                compared, steps, worst = compared + 1, max(steps, min(len(run), len(reference))), max(worst, largest)
                if first is not None and (parted is None or first < parted[0]):
                    parted = (first, run_id)
            missing = (f"no bare-metal run of repetition {', '.join(map(str, sorted(set(unmatched))))}"
                       if unmatched else "")
            if not compared:
                rows.append({**row, "loss_trajectory": f"not checked: {missing or 'no bare-metal run at this point'}"})
                continue
            row |= {"runs_compared": compared, "steps_compared": steps, "max_relative_difference": worst}
            if parted:
                row |= {"first_parting_step": parted[0], "parting_run": parted[1],
                        "loss_trajectory": f"parts from bare metal at step {parted[0]} ({parted[1]}; {basis})"}
            else:
                row["loss_trajectory"] = f"same as bare metal ({steps} steps; {basis})"
            if missing:
                row["loss_trajectory"] += f"; not checked: {missing}"
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)
