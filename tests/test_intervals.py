"""Fieller's set, checked against its definition by brute force: every ratio R on a fine grid is in the set
exactly when (a - R b)^2 <= t^2 (v_a + R^2 v_b), with t at the degrees of freedom the interval reports.
Bounded intervals, unbounded sets of two rays (a ratio in their gap is still rejected) and the edge cases
(a numerator of zeros, a denominator mean not distinguishable from 0) all come out of that one rule."""

from __future__ import annotations

import numpy as np
import pytest

from containerbench.intervals import (
    median_interval,
    paired_ratio_interval,
    ratio_interval,
    ratio_intervals,
    t_quantile,
)

GRID = np.linspace(-60, 60, 240_001)  # steps of 0.0005


def in_fieller_set(numerator, denominator, dof: float) -> np.ndarray:
    """Membership of every grid ratio, from the definition (Welch's test of a - R b at `dof`)."""
    x, y = np.asarray(numerator, float), np.asarray(denominator, float)
    a, b = x.mean(), y.mean()
    var_a, var_b = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    t = t_quantile(0.975, dof)
    return (a - GRID * b) ** 2 <= t**2 * (var_a + GRID**2 * var_b)


def claimed_set(interval) -> np.ndarray:
    if not interval.no_interval:
        return (interval.low <= GRID) & (GRID <= interval.high)
    if not np.isnan(interval.gap_low):
        return (GRID <= interval.gap_low) | (interval.gap_high <= GRID)
    return np.ones_like(GRID, dtype=bool)


def disagreement(numerator, denominator) -> float:
    """The share of grid ratios the interval places on the wrong side of the set's edge."""
    interval = ratio_interval(numerator, denominator)
    truth = in_fieller_set(numerator, denominator, interval.dof)
    return float(np.mean(truth != claimed_set(interval)))


CASES = {
    "container against bare metal": ([95.0, 97.0, 99.0], [100.0, 101.0, 103.0]),
    "skewed repetitions": ([90.0, 95.0, 100.0], [100.0, 100.0, 130.0]),
    "noisy denominator, ratio near 1": ([4.0, 5.0, 6.0], [0.1, 5.0, 9.0]),
    "noisy denominator, ratio far from 1": ([40.0, 50.0, 60.0], [0.1, 5.0, 9.0]),
    "denominator straddling 0": ([1.0, 2.0, 3.0], [-4.0, 0.5, 5.0]),
    "numerator of zeros": ([0.0, 0.0, 0.0], [100.0, 102.0, 98.0]),
    "negative ratio": ([-10.0, -12.0, -11.0], [5.0, 6.0, 5.5]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_set_is_the_definitions_set(case):
    numerator, denominator = CASES[case]
    # Only grid points within a step of an edge may fall either way.
    assert disagreement(numerator, denominator) <= 4 / len(GRID)


def test_random_samples_give_the_definitions_set_and_verdict():
    rng = np.random.default_rng(31)
    for _ in range(300):
        n_a, n_b = rng.integers(2, 6, size=2)
        numerator = rng.normal(rng.uniform(-5, 20), rng.uniform(0.1, 6), n_a)
        denominator = rng.normal(rng.uniform(-5, 20), rng.uniform(0.1, 6), n_b)
        interval = ratio_interval(numerator, denominator)
        assert disagreement(numerator, denominator) <= 4 / len(GRID), (numerator, denominator)
        one_in_set = bool(in_fieller_set(numerator, denominator, interval.dof)[np.searchsorted(GRID, 1.0)])
        assert interval.significance().startswith("significant") == (not one_in_set), (numerator, denominator)


def test_a_numerator_of_zeros_is_a_ratio_of_zero_not_an_indistinct_denominator():
    # Satterthwaite's dof is 0/0 there; its limit is the denominator's n - 1, and the set is {0}.
    interval = ratio_interval([0.0, 0.0, 0.0], [100.0, 102.0, 98.0])
    assert (interval.ratio, interval.low, interval.high, interval.dof) == (0.0, 0.0, 0.0, 2.0)
    assert interval.no_interval is None and interval.significance() == "significant"


def test_an_unbounded_set_that_leaves_out_1_is_significant_without_an_interval():
    far = ratio_interval([40.0, 50.0, 60.0], [0.1, 5.0, 9.0], "bare-metal")
    assert np.isnan(far.low) and np.isnan(far.high)
    assert far.no_interval == "n/a: bare-metal mean not distinguishable from 0"
    assert far.gap_low < 1 < far.gap_high
    assert far.significance() == "significant, with no interval: bare-metal mean not distinguishable from 0"
    near = ratio_interval([4.0, 5.0, 6.0], [0.1, 5.0, 9.0], "bare-metal")
    assert not near.gap_low < 1 < near.gap_high
    assert near.significance() == "n/a: bare-metal mean not distinguishable from 0"


def test_the_vectorised_form_gives_the_same_sets_and_verdicts():
    names = sorted(CASES)
    singles = [ratio_interval(*CASES[name]) for name in names]
    summaries = [(np.mean(x), np.mean(y), np.var(x, ddof=1), np.var(y, ddof=1), len(x), len(y))
                 for x, y in (CASES[name] for name in names)]
    many = ratio_intervals(*map(list, zip(*summaries)))
    for index, single in enumerate(singles):
        for field in ("ratio", "low", "high", "dof", "gap_low", "gap_high"):
            assert getattr(many, field)[index] == pytest.approx(getattr(single, field), nan_ok=True)
    assert list(many.significance()) == [single.significance() for single in singles]


def sign_pattern_coverage(n: int, k: int) -> float:
    """Brute force: over every one of the 2^n equally likely patterns of values below and above the true
    median of a continuous distribution, the share in which (x_(k), x_(n+1-k)) holds it: at least k below
    and at least k above."""
    import itertools

    hits = sum(k <= sum(pattern) <= n - k for pattern in itertools.product((0, 1), repeat=n))
    return hits / 2 ** n


@pytest.mark.parametrize("n", range(1, 15))
def test_the_median_interval_is_the_widest_order_statistics_that_cover_95_percent(n):
    values = np.arange(1.0, n + 1)[::-1]  # given unsorted
    low, high = median_interval(values)
    if n <= 5:  # even (min, max) covers 1 - 2/2^n < 95%
        assert np.isnan(low) and np.isnan(high) and sign_pattern_coverage(n, 1) < 0.95
        return
    k = int(low)  # the values are 1..n, so x_(k) = k
    assert high == n + 1 - k
    assert sign_pattern_coverage(n, k) >= 0.95 and (k + 1 > n // 2 or sign_pattern_coverage(n, k + 1) < 0.95)


def test_the_median_interval_covers_a_skewed_distributions_median_as_often_as_it_says():
    rng = np.random.default_rng(7)
    samples = rng.lognormal(0.0, 1.0, size=(4000, 10))  # median exp(0) = 1
    covered = np.mean([low <= 1.0 <= high for low, high in map(median_interval, samples)])
    assert covered == pytest.approx(sign_pattern_coverage(10, 2), abs=0.01)  # 0.979 at n = 10


def test_the_paired_interval_is_the_set_the_one_sample_t_test_of_the_log_ratios_keeps():
    """By its definition: R is in the set exactly when Student's one-sample t-test of log(x/y) = log R, on
    the pairs' log ratios, does not reject at 5% (scipy's test, not our formula)."""
    from scipy import stats

    runtime, bare = [90.0, 99.5, 107.5, 95.0], [100.0, 110.0, 120.0, 104.0]
    interval = paired_ratio_interval(runtime, bare)
    logs = np.log(np.array(runtime) / np.array(bare))
    assert interval.ratio == pytest.approx(np.exp(logs.mean())) and interval.dof == 3
    grid = np.linspace(0.85, 0.95, 2001)
    kept = np.array([stats.ttest_1samp(logs, np.log(r)).pvalue >= 0.05 for r in grid])
    claimed = (interval.low <= grid) & (grid <= interval.high)
    assert (kept == claimed).mean() > 0.999 and kept.any()  # they may differ at the one grid step of an edge


def test_drift_between_repetitions_cancels_in_the_paired_interval_and_it_covers_as_often_as_it_says():
    """Repetitions that move together (the machine drifts 5% from one to the next) and a runtime 3% slower
    within each: the paired interval covers the true ratio about 95% of the time, and is far narrower than
    Fieller's unpaired one, which counts the drift as noise on both sides."""
    rng = np.random.default_rng(37)
    true_ratio, covered, paired_widths, unpaired_widths = 0.97, 0, [], []
    trials = 2000
    for _ in range(trials):
        drift = 100 * np.exp(rng.normal(0, 0.05, 3))
        bare = drift * np.exp(rng.normal(0, 0.01, 3))
        runtime = true_ratio * drift * np.exp(rng.normal(0, 0.01, 3))
        paired = paired_ratio_interval(runtime, bare)
        covered += paired.low <= true_ratio <= paired.high
        paired_widths.append(paired.high - paired.low)
        unpaired = ratio_interval(runtime, bare)
        unpaired_widths.append(unpaired.high - unpaired.low if not unpaired.no_interval else np.inf)
    assert 0.93 <= covered / trials <= 0.97
    assert np.median(paired_widths) < 0.4 * np.median(unpaired_widths)


@pytest.mark.parametrize(("runtime", "bare", "why"), [
    ([90.0], [100.0], "n/a: needs 2+ pairs"),
    ([90.0, 99.0], [100.0, 110.0], "n/a: no spread in the pairs' ratios"),
    ([90.0, np.nan, 0.0], [100.0, 110.0, 120.0], "n/a: needs 2+ pairs"),  # a NaN and a 0 are no pairs
    ([], [], "n/a: no pairs"),
])
def test_the_paired_interval_says_why_there_is_none(runtime, bare, why):
    interval = paired_ratio_interval(runtime, bare)
    assert interval.no_interval == why and np.isnan(interval.low) and np.isnan(interval.high)
    assert interval.significance() == why
