"""The intervals the suites' tables state: Student's t quantiles, a mean's and a paired difference's interval,
Wilson's interval of a failure rate, and the letters of rows the intervals do not separate."""

from __future__ import annotations

import math
import statistics

import pytest

from resnorm_lm.analysis.evidence import Proportion, groups, mean_interval, paired_difference, t_cdf, t_quantile

# two-sided 95% critical values of Student's t (any statistics table: df 1, 2, 4, 9, 30)
T_975 = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622, 30: 2.0423}


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_quantiles_match_the_tables(df):
    assert t_quantile(0.975, df) == pytest.approx(T_975[df], abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-T_975[df], abs=1e-4)
    assert t_cdf(T_975[df], df) == pytest.approx(0.975, abs=1e-5)


def test_a_large_sample_tends_to_the_normal():
    assert t_quantile(0.975, 1e6) == pytest.approx(statistics.NormalDist().inv_cdf(0.975), abs=1e-4)


def test_a_mean_interval_is_t_times_the_standard_error():
    values = [5.01, 5.03, 4.99, 5.02, 5.00]
    ci = mean_interval(values)
    se = statistics.stdev(values) / math.sqrt(5)
    assert ci.mean == pytest.approx(5.01) and ci.half_width == pytest.approx(T_975[4] * se, rel=1e-4)
    assert ci.n == 5 and ci.text() == f"5.010 ± {T_975[4] * se:.3f}"
    one = mean_interval([5.0, math.nan, None])
    assert one.n == 1 and one.half_width is None and not one.excludes_zero() and mean_interval([]) is None


def test_pairing_by_seed_cancels_what_the_seeds_share():
    """Two recipes whose losses move together over seeds (a shared data order): their difference is known far
    better paired than from either's own spread."""
    shared = {1: 0.00, 2: 0.10, 3: -0.08, 4: 0.05, 5: -0.03}
    a = {k: 5.00 + v for k, v in shared.items()}
    b = {k: 5.02 + v + (0.002 if k % 2 else -0.002) for k, v in shared.items()}
    diff = paired_difference(a, b)
    assert diff.mean == pytest.approx(-0.02 - 0.0004, abs=1e-9) and diff.n == 5
    assert diff.excludes_zero()  # separated paired ...
    unpaired = math.sqrt(statistics.variance(a.values()) + statistics.variance(b.values()))
    assert diff.half_width < T_975[4] * unpaired / math.sqrt(5) / 10  # ... by a margin the unpaired spread hides
    assert paired_difference(a, {7: 1.0}) is None  # no seed in common: nothing to pair
    assert paired_difference({1: 5.0, 2: 5.1, 3: 5.3}, {2: 5.0, 3: 5.1, 4: 9.9}).n == 2  # only shared seeds count


def test_wilson_intervals():
    assert Proportion(0, 5).interval()[0] == pytest.approx(0.0, abs=1e-12) and Proportion(0, 5).interval()[
        1
    ] == pytest.approx(0.4345, abs=1e-4)
    low, high = Proportion(1, 5).interval()
    assert low == pytest.approx(0.0362, abs=1e-4) and high == pytest.approx(0.6245, abs=1e-4)
    assert Proportion(5, 5).interval()[1] == 1.0 and Proportion(1, 5).text() == "1/5 (4-62%)"
    assert Proportion(0, 0).interval() == (0.0, 1.0)


def test_groups_letter_the_rows_the_intervals_do_not_separate():
    apart = {frozenset(p) for p in (("a", "c"), ("a", "d"), ("b", "d"))}
    letters = groups(["a", "b", "c", "d"], lambda x, y: frozenset((x, y)) in apart)
    assert letters == {"a": "a", "b": "ab", "c": "bc", "d": "c"}
    assert groups(["a", "b"], lambda x, y: False) == {"a": "a", "b": "a"}  # a tie
    assert groups(["a", "b", "c"], lambda x, y: True) == {"a": "a", "b": "b", "c": "c"}


def test_groups_give_a_tie_between_rows_that_are_not_neighbours_a_letter():
    # the DyT suite's case: the middle row is separated from the leader, the last (an interval of +-2.5 nats)
    # from neither, so it ties with both and carries both letters
    apart = {frozenset(("lead", "mid"))}
    letters = groups(["lead", "mid", "wide"], lambda x, y: frozenset((x, y)) in apart)
    assert letters == {"lead": "a", "mid": "b", "wide": "ab"}
    # every pair shares a letter exactly when it is not separated, whatever the order
    names = ["p", "q", "r", "s", "t"]
    apart = {frozenset(p) for p in (("p", "r"), ("q", "s"), ("p", "t"), ("r", "t"))}
    letters = groups(names, lambda x, y: frozenset((x, y)) in apart)
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            assert bool(set(letters[x]) & set(letters[y])) == (frozenset((x, y)) not in apart), (x, y, letters)
