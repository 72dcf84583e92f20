"""The 95% interval of a ratio of two means: the one piece of statistics the comparison tables share.

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
is no interval to give.
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

    def significance(self, null: float = 1.0) -> str:
        """"significant" when the interval leaves out `null` (1: no difference), else why not."""
        if self.no_interval:
            return self.no_interval
        return "not significant" if self.low <= null <= self.high else "significant"


def ratio_interval(numerator, denominator, denominator_name: str = "denominator",
                   confidence: float = 0.95) -> RatioInterval:
    """Fieller's interval for mean(numerator) / mean(denominator), independent samples, unequal variances.

    NaNs are dropped. No interval (low = high = NaN, `no_interval` says why) with fewer than
    2 values on a side, with no spread on either side (a zero-width interval would call
    any difference significant), or when the denominator's mean is not distinguishable
    from 0 (the Fieller set is then unbounded).
    """
    x = pd.Series(numerator, dtype=float).dropna()
    y = pd.Series(denominator, dtype=float).dropna()
    a, b = x.mean(), y.mean()
    ratio = a / b if b else np.nan
    if x.count() < 2 or y.count() < 2:
        return RatioInterval(ratio, np.nan, np.nan, np.nan, "n/a: needs 2+ repetitions each")
    var_a, var_b = x.var(ddof=1) / x.count(), y.var(ddof=1) / y.count()
    if var_a + var_b == 0:
        return RatioInterval(ratio, np.nan, np.nan, np.nan, "n/a: no spread in either side's repetitions")
    if not b:
        return RatioInterval(ratio, np.nan, np.nan, np.nan, f"n/a: {denominator_name} mean not distinguishable from 0")
    var_contrast = var_a + ratio**2 * var_b  # of a - R b at the estimate
    dof = var_contrast**2 / (var_a**2 / (x.count() - 1) + ratio**4 * var_b**2 / (y.count() - 1))
    t = t_quantile(0.5 + confidence / 2, dof)
    # The quadratic in R: (b^2 - t^2 v_b) R^2 - 2ab R + (a^2 - t^2 v_a) <= 0.
    leading = b**2 - t**2 * var_b
    if leading <= 0:
        return RatioInterval(ratio, np.nan, np.nan, dof, f"n/a: {denominator_name} mean not distinguishable from 0")
    half = t * np.sqrt(a**2 * var_b + var_a * leading)
    return RatioInterval(ratio, (a * b - half) / leading, (a * b + half) / leading, dof)
