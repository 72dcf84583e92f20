"""The 95% interval of a ratio of two means: the one piece of statistics the comparison tables share;
and, beside it for the overhead table, the interval of paired runs' ratios (paired_ratio_interval).

Every comparison in the tables (container overhead, fabric, mode, input) is a
ratio of the mean throughputs of two independent sets of repetitions. Dividing
a Welch interval of the difference by the denominator's mean treats that mean
as exact; Fieller's interval does not. It is the set of ratios R for which the
Welch test of mean(numerator) = R * mean(denominator) does not reject:

    (a - R b)^2 <= t^2 (v_a + R^2 v_b),    v = s^2 / n of each side,

with Satterthwaite's degrees of freedom for the variance v_a + R^2 v_b, the
ratio estimate a / b plugged in (Tamhane and Logan 2004; the default of R's
mratios::ttestratio with var.equal = FALSE). When the denominator's mean is not
significantly away from zero (t^2 v_b >= b^2) that set is unbounded, and there
is no interval to give: it is either every ratio, or two rays that leave out a
gap (gap_low, gap_high). A ratio in that gap is still rejected, so a comparison
whose null (1) lies there is significant, though it has no interval.

A numerator with no spread at a ratio of 0 (every repetition 0) makes
Satterthwaite's degrees of freedom 0/0; its limit there is the denominator's,
n_b - 1, and the set is the single ratio 0 when the denominator's mean is away
from zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


def t_quantile(probability: float, dof: float) -> float:
    """Student's t quantile. scipy.stats is imported here, when a table needs it: the workflow
    imports results.py to declare TABLE_FILES, and scipy.stats alone takes 0.4 s to import."""
    from scipy import stats

    return float(stats.t.ppf(probability, dof))


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # mean(numerator) / mean(denominator)
    low: float  # NaN when there is no interval
    high: float
    dof: float  # Satterthwaite's, at the ratio estimate
    no_interval: str | None = None  # why there is none: "n/a: ..."
    gap_low: float = float("nan")  # an unbounded set of two rays leaves out (gap_low, gap_high); else NaN
    gap_high: float = float("nan")

    def significance(self, null: float = 1.0) -> str:
        """"significant" when the set leaves out `null` (1: no difference), else why not."""
        if self.no_interval:
            return _unbounded_verdict(self.no_interval) if self.gap_low < null < self.gap_high else self.no_interval
        return "not significant" if self.low <= null <= self.high else "significant"


def _unbounded_verdict(no_interval: str) -> str:
    return f"significant, with no interval: {no_interval.removeprefix('n/a: ')}"


@dataclass(frozen=True)
class RatioIntervals:
    """Fieller's intervals for many ratios at once, element by element (numpy arrays)."""

    ratio: np.ndarray
    low: np.ndarray  # NaN where there is no interval
    high: np.ndarray
    dof: np.ndarray
    no_interval: np.ndarray  # of str or None: why there is none, "n/a: ..."
    gap_low: np.ndarray  # where the set is two rays, the gap they leave out; NaN elsewhere
    gap_high: np.ndarray

    def significance(self, null: float = 1.0) -> np.ndarray:
        """Per element, as RatioInterval.significance."""
        inside = (self.low <= null) & (null <= self.high)
        verdict = np.where(inside, "not significant", "significant").astype(object)
        in_gap = (self.gap_low < null) & (null < self.gap_high)
        unbounded = np.array([_unbounded_verdict(why) if gap else why
                              for why, gap in zip(self.no_interval, in_gap)], dtype=object)
        return np.where(pd.isna(self.no_interval), verdict, unbounded)


def ratio_intervals(mean_numerator, mean_denominator, var_numerator, var_denominator, n_numerator, n_denominator,
                    denominator_name: str = "denominator", confidence: float = 0.95) -> RatioIntervals:
    """Fieller's interval for each mean_numerator / mean_denominator, from per-side summaries:
    means, sample variances (ddof 1) and counts. The one implementation: ratio_interval, the
    tables and the results store's comparison all come here; arrays keep a comparison of
    thousands of variables one pass of numpy instead of one Python call each."""
    a = np.asarray(mean_numerator, dtype=float)
    b = np.asarray(mean_denominator, dtype=float)
    n_a = np.asarray(n_numerator, dtype=float)
    n_b = np.asarray(n_denominator, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(b != 0, a / b, np.nan)
        var_a = np.asarray(var_numerator, dtype=float) / n_a  # of each mean
        var_b = np.asarray(var_denominator, dtype=float) / n_b
        var_contrast = var_a + ratio**2 * var_b  # of a - R b at the estimate
        dof = var_contrast**2 / (var_a**2 / (n_a - 1) + ratio**4 * var_b**2 / (n_b - 1))
        dof = np.where((var_a == 0) & (ratio == 0), n_b - 1, dof)  # 0/0: its limit (module docstring)
        too_few = ~((n_a >= 2) & (n_b >= 2))
        no_spread = ~too_few & (var_a + var_b == 0)
        zero_denominator = ~too_few & ~no_spread & (b == 0)
        computable = ~(too_few | no_spread | zero_denominator)
        t = np.full(ratio.shape, np.nan)
        if computable.any():
            from scipy import stats  # see t_quantile: imported when a table needs it

            t[computable] = stats.t.ppf(0.5 + confidence / 2, dof[computable])
        # The quadratic in R: (b^2 - t^2 v_b) R^2 - 2ab R + (a^2 - t^2 v_a) <= 0.
        leading = b**2 - t**2 * var_b
        unbounded = computable & ~(leading > 0)
        bounded = computable & ~unbounded
        half = t * np.sqrt(a**2 * var_b + var_a * leading)
        low = np.where(bounded, (a * b - half) / leading, np.nan)
        high = np.where(bounded, (a * b + half) / leading, np.nan)
        # Opening downward (leading < 0) with two roots, the set is the rays outside them. leading == 0
        # (a single ray) is left as every ratio: no verdict claimed.
        two_rays = unbounded & (leading < 0) & (half > 0)
        gap_low = np.where(two_rays, (a * b + half) / leading, np.nan)
        gap_high = np.where(two_rays, (a * b - half) / leading, np.nan)
    indistinct = f"n/a: {denominator_name} mean not distinguishable from 0"
    no_interval = np.select([too_few, no_spread, zero_denominator | unbounded],
                            ["n/a: needs 2+ repetitions each", "n/a: no spread in either side's repetitions",
                             indistinct], None).astype(object)
    # Satterthwaite's dof is reported wherever the t quantile was taken (an unbounded set included).
    return RatioIntervals(ratio, low, high, np.where(computable, dof, np.nan), no_interval, gap_low, gap_high)


def ratio_interval(numerator, denominator, denominator_name: str = "denominator",
                   confidence: float = 0.95) -> RatioInterval:
    """Fieller's interval for mean(numerator) / mean(denominator), independent samples, unequal variances.

    NaNs are dropped. No interval (low = high = NaN, `no_interval` says why) with fewer than
    2 values on a side, with no spread on either side (a zero-width interval would call
    any difference significant), or when the denominator's mean is not distinguishable
    from 0 (the Fieller set is then unbounded). Computed by ratio_intervals.
    """
    x = pd.Series(numerator, dtype=float).dropna()
    y = pd.Series(denominator, dtype=float).dropna()
    intervals = ratio_intervals([x.mean()], [y.mean()], [x.var(ddof=1)], [y.var(ddof=1)], [x.count()], [y.count()],
                                denominator_name, confidence)
    return RatioInterval(float(intervals.ratio[0]), float(intervals.low[0]), float(intervals.high[0]),
                         float(intervals.dof[0]), intervals.no_interval[0], float(intervals.gap_low[0]),
                         float(intervals.gap_high[0]))


def paired_ratio_interval(numerator, denominator, confidence: float = 0.95) -> RatioInterval:
    """The ratio of paired runs (each repetition's runtime run over the bare-metal run of the same repetition,
    which ran beside it): the geometric mean of the pairs' ratios, with Student's t interval of their
    logarithms (n - 1 degrees of freedom), taken back by exp. What moves a whole repetition, the machine's
    drift between repetitions, cancels within its pair, where Fieller's unpaired interval counts it as noise
    on both sides. `numerator`, `denominator`: aligned sequences, one pair per position; a pair with a NaN
    or a value not above 0 is left out. No interval with fewer than 2 pairs, or no spread in their ratios."""
    x = np.asarray(numerator, dtype=float)
    y = np.asarray(denominator, dtype=float)
    kept = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    logs = np.log(x[kept] / y[kept])
    n = len(logs)
    if n == 0:
        return RatioInterval(float("nan"), float("nan"), float("nan"), float("nan"), "n/a: no pairs")
    ratio = float(np.exp(logs.mean()))
    if n < 2:
        return RatioInterval(ratio, float("nan"), float("nan"), float("nan"), "n/a: needs 2+ pairs")
    spread = float(logs.std(ddof=1))
    if spread == 0:
        return RatioInterval(ratio, float("nan"), float("nan"), n - 1.0, "n/a: no spread in the pairs' ratios")
    half = t_quantile(0.5 + confidence / 2, n - 1) * spread / np.sqrt(n)
    return RatioInterval(ratio, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)), n - 1.0)


def median_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics (x_(k), x_(n+1-k)) with the
    largest k whose coverage, P(k <= B <= n-k) for B ~ Binomial(n, 1/2), is at least `confidence`
    (the sign-test interval; Hollander, Wolfe and Chicken, Nonparametric Statistical Methods, 3.6).
    NaN, NaN when even the widest, (min, max), covers less: 5 values or fewer at 95%."""
    from scipy import stats

    ordered = np.sort(np.asarray(pd.Series(values).dropna(), dtype=float))
    n = len(ordered)
    best = None
    for k in range(1, n // 2 + 1):
        coverage = stats.binom.cdf(n - k, n, 0.5) - stats.binom.cdf(k - 1, n, 0.5)
        if coverage < confidence:
            break
        best = k
    return (float(ordered[best - 1]), float(ordered[n - best])) if best else (np.nan, np.nan)
