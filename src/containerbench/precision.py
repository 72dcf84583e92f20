"""How precise a point's mean is, and what would buy more precision per machine-minute: the variance of
the step time between processes and within one, and the cost of each (Kalibera and Jones, "Rigorous
Benchmarking in Reasonable Time", ISMM 2013: set the repetitions at each level from the variance measured
at that level).

With n1 processes of n2 measured steps each, the mean step time has the variance

    T1^2 / n1 + T2^2 / (n1 n2)

where T2^2 is the variance of a step within a process (pooled over the processes, S2^2) and T1^2 what the
processes add between them, estimated as S1^2 - S2^2 / n2 (S1^2: the variance of the processes' means;
clipped at 0). A process costs c1 seconds that measure nothing (start-up, tracing, warmup, teardown: its
wall time less its measured steps) and c2 a step. For a given precision the cheapest n2 is

    n2 = sqrt(c1 T2^2 / (c2 T1^2))

(minimise n1 (c1 + n2 c2) at a fixed variance), and n1 then follows from the target. Steps are taken as
independent; a process whose steps drift shows it as a larger T2, which asks for more steps, not fewer.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from containerbench.intervals import t_quantile
from containerbench.point import Point
from containerbench.status import Status

LEVEL_COLUMNS = ["point", "runs", "steps", "step_s_mean", "between_cv_percent", "within_cv_percent",
                 "unmeasured_s", "step_cost_s"]


def step_times(record: dict) -> np.ndarray:
    """A run's measured step times: per step, its slowest rank's (a synchronous step ends with it)."""
    per_rank = [rank["step_s"] for rank in record["result"]["per_rank"] if rank.get("step_s")]
    steps = min(map(len, per_rank), default=0)
    return np.max([times[:steps] for times in per_rank], axis=0) if steps else np.array([])


def levels(records: list[dict]) -> pd.DataFrame:
    """One row per training point with 2 or more ok runs: its runs and steps, the mean step time, the
    between-process (T1) and within-process (T2) spread as percent of that mean, and the seconds a run
    spends unmeasured (c1, the median over its runs) and per step (c2)."""
    by_point: dict[str, list[dict]] = {}
    for record in records:
        if record["spec"].get("kind") == "train" and record["status"] == Status.OK and record.get("result"):
            by_point.setdefault(Point.id_of(record["run_id"]), []).append(record)
    rows = []
    for point, runs in sorted(by_point.items()):
        times = [step_times(run) for run in runs]
        steps = min(map(len, times))
        if len(runs) < 2 or steps < 2:
            continue
        times = np.array([each[:steps] for each in times])
        means = times.mean(axis=1)
        within = times.var(axis=1, ddof=1).mean()  # S2^2, pooled
        between = max(means.var(ddof=1) - within / steps, 0.0)  # T1^2 = S1^2 - S2^2 / n2
        mean = float(means.mean())
        unmeasured = np.median([run["wall_s"] - each.sum() for run, each in zip(runs, times)])
        rows.append({"point": point, "runs": len(runs), "steps": steps, "step_s_mean": mean,
                     "between_cv_percent": 100 * math.sqrt(between) / mean,
                     "within_cv_percent": 100 * math.sqrt(within) / mean,
                     "unmeasured_s": float(unmeasured), "step_cost_s": mean})
    return pd.DataFrame(rows, columns=LEVEL_COLUMNS)


def cheapest_steps(level: dict) -> float:
    """n2 = sqrt(c1 T2^2 / (c2 T1^2)); inf where the processes add no spread (then steps are the cheaper)."""
    between, within = level["between_cv_percent"], level["within_cv_percent"]
    if between == 0:
        return math.inf
    return math.sqrt(level["unmeasured_s"] * within**2 / (level["step_cost_s"] * between**2))


def overhead_half_width_percent(level: dict, runs: int, steps: int) -> float:
    """The 95% half-width, in percent, of a runtime's overhead against bare metal at this point (unpaired:
    two independent sides of `runs` runs of `steps` steps, each with this point's spread; the ratio's
    relative variance is the sum of the sides', with Welch's 2 (runs - 1) degrees of freedom)."""
    if runs < 2:
        return math.inf
    relative_variance = (level["between_cv_percent"] ** 2 + level["within_cv_percent"] ** 2 / steps) / runs
    return t_quantile(0.975, 2 * (runs - 1)) * math.sqrt(2 * relative_variance)


def runs_for(level: dict, target_percent: float, steps: int, most: int = 1000) -> int | None:
    """The fewest runs per side whose overhead half-width is within `target_percent`; None past `most`."""
    return next((runs for runs in range(2, most + 1)
                 if overhead_half_width_percent(level, runs, steps) <= target_percent), None)


def machine_seconds(level: dict, runs: int, steps: int) -> float:
    """What `runs` runs of `steps` steps cost at this point: n1 (c1 + n2 c2)."""
    return runs * (level["unmeasured_s"] + steps * level["step_cost_s"])


def runs_for_mean(cv_percent: float, target_percent: float, most: int) -> int | None:
    """The fewest runs whose 95% t interval of the mean is within +-`target_percent`, runs whose means
    spread by `cv_percent` (S1: T1^2 + T2^2 / n2 at their steps); None past `most`."""
    return next((runs for runs in range(2, most + 1)
                 if t_quantile(0.975, runs - 1) * cv_percent / math.sqrt(runs) <= target_percent), None)
