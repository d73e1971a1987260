"""The online service-time estimator: monotone fit in range, optimistic beyond, memory of sizes."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.control.service_estimator import (
    MAX_LEVEL,
    MAX_TAKEN,
    OPTIMISM,
    OUTLIER_ELASTICITY_MIN,
    OUTLIER_FACTOR,
    OUTLIER_WINDOW,
    P999_Z,
    ServiceTimeEstimator,
    _change_ratio,
    _robust_lognormal,
    isotonic_fit,
)
from adaptive_batcher.metrics.recorder import BatchSample

# resnet50 on an H200, adaptive_batcher/data/h200/batch_profile.csv (median ms)
RESNET = {1: 3.676, 4: 3.881, 8: 3.968, 16: 3.916, 32: 4.041, 64: 7.219, 128: 8.778, 256: 16.651}


def samples(table: dict[int, float], repeat: int = 4) -> list[BatchSample]:
    return [BatchSample(0.0, n, n, ms / 1e3) for n, ms in table.items() for _ in range(repeat)]


def test_nan_until_enough_samples() -> None:
    estimator = ServiceTimeEstimator(min_samples=8)
    estimator.update(samples({4: 4.0}, repeat=3), total_seen=3)
    assert math.isnan(estimator.median_ms(4))


def test_in_range_fit_is_monotone_and_close_to_measurements() -> None:
    estimator = ServiceTimeEstimator(refit_every=1)
    batch = samples(RESNET)
    estimator.update(batch, total_seen=len(batch))
    predictions = [estimator.median_ms(n) for n in range(1, 257)]
    assert all(b >= a for a, b in itertools.pairwise(predictions))
    assert estimator.median_ms(256) == pytest.approx(16.651)
    assert estimator.median_ms(128) == pytest.approx(8.778)
    assert estimator.median_ms(16) == pytest.approx(3.916, rel=0.05)  # pooled with its neighbours


def test_extrapolation_beyond_the_data_is_optimistic() -> None:
    estimator = ServiceTimeEstimator(refit_every=1)
    batch = samples({16: 3.916, 32: 4.041})
    estimator.update(batch, total_seen=len(batch))
    expected_128 = 4.041 + OPTIMISM * 4.041 / 32 * (128 - 32)
    assert estimator.median_ms(128) == pytest.approx(expected_128)
    assert estimator.median_ms(128) < 8.778  # below the truth: the controller will try it
    assert estimator.median_ms(1) == pytest.approx(3.916)  # flat below the smallest size seen


def test_sizes_seen_long_ago_stay_known() -> None:
    estimator = ServiceTimeEstimator(refit_every=1)
    small = samples({8: 4.0})
    estimator.update(small, total_seen=len(small))
    flood = [BatchSample(0.0, 256, 256, 0.0167)] * 600  # the recent window holds only 256s
    estimator.update(flood[-512:], total_seen=len(small) + len(flood))
    assert estimator.median_ms(8) == pytest.approx(4.0)
    assert estimator.median_ms(256) == pytest.approx(16.7)


@pytest.mark.parametrize("new", [MAX_TAKEN // 2, MAX_TAKEN, 3 * MAX_TAKEN + 5])
def test_one_update_takes_in_at_most_max_taken_batches_newest_included(new: int) -> None:
    """The tick's work is bounded whatever the batch rate: of the batches new since the last
    update, at most ``MAX_TAKEN``, spread over them; the newest one is among them (sizes
    1..new, one batch each, so the sizes known say which were taken)."""
    estimator = ServiceTimeEstimator(min_samples=1, refit_every=1)
    batches = [BatchSample(0.0, n, n, (1.0 + 0.01 * n) / 1e3) for n in range(1, new + 1)]
    estimator.update(batches, total_seen=new)
    assert estimator.samples == min(new, MAX_TAKEN)
    # the fit reaches the newest batch's size: 1 + 0.01 n there, not the optimistic slope
    assert estimator.median_ms(new) == pytest.approx(1.0 + 0.01 * new)


def test_refits_only_every_n_batches() -> None:
    estimator = ServiceTimeEstimator(min_samples=1, refit_every=10)
    estimator.update([BatchSample(0.0, 4, 4, 0.004)] * 10, total_seen=10)
    first = estimator.median_ms(4)
    # 20 % slower: within the noise a refit follows, not a change of level
    estimator.update([BatchSample(0.0, 4, 4, 0.0048)] * 5, total_seen=15)  # not yet due
    assert estimator.median_ms(4) == first


def test_seed_profile_predicts_before_any_batch() -> None:
    estimator = ServiceTimeEstimator(seed=[(1, 3.7), (256, 16.7)])
    assert estimator.median_ms(256) == pytest.approx(16.7)
    assert estimator.largest_within(10.0, [1, 32, 64, 256]) == 64


def test_validation() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ServiceTimeEstimator(min_samples=0)


def linear_ms(n: int) -> float:
    return 3.0 + 0.2 * n


def steady(estimator: ServiceTimeEstimator, sizes: list[int], seen: int) -> int:
    """Feed one batch per size in ``sizes`` at its usual time; returns the batches seen."""
    batch = [BatchSample(0.0, n, n, linear_ms(n) / 1e3) for n in sizes]
    estimator.update(batch, seen + len(batch))
    return seen + len(batch)


def fitted_estimator(rare: int) -> tuple[ServiceTimeEstimator, int]:
    """An estimator that has seen sizes 30-50 often, 64 a few times and ``rare`` never."""
    estimator = ServiceTimeEstimator(refit_every=1)
    seen = 0
    for _ in range(8):
        seen = steady(estimator, [*range(30, 51), 64], seen)
    assert rare not in estimator._reservoir
    estimator.spread  # the controller reads the error bars every tick  # noqa: B018
    return estimator, seen


@pytest.mark.parametrize("rare", [58, 70], ids=["inside", "largest"])
def test_one_stall_does_not_move_the_fit(rare: int) -> None:
    """A 150 ms stall (a full garbage collection) lands on a batch of a size seen never before:
    held out, the fit at that size and above stays where the other batches put it."""
    estimator, seen = fitted_estimator(rare)
    if rare > 64:  # a size beyond the range is never an outlier: make it known first
        seen = steady(estimator, [rare], seen)
    before = {n: estimator.median_ms(n) for n in (rare, 64, 70)}
    stall = BatchSample(0.0, rare, rare, (linear_ms(rare) + 150.0) / 1e3)
    estimator.update([stall], seen + 1)
    seen = steady(estimator, [*range(30, 51)], seen + 1)
    for n, ms in before.items():
        assert estimator.median_ms(n) == pytest.approx(ms)
    assert estimator.outliers_held_out == 1
    assert max(estimator._ratios) > OUTLIER_FACTOR  # the stall still counts in the error bars


def test_the_time_of_the_last_stall_is_kept_for_the_controller() -> None:
    estimator, seen = fitted_estimator(rare=58)
    assert estimator.last_stall_s == -math.inf
    stall = BatchSample(12.5, 58, 58, (linear_ms(58) + 150.0) / 1e3)
    estimator.update([stall], seen + 1)
    assert estimator.last_stall_s == 12.5
    # and by how much it outlasted its prediction: a stall of 0.5 ms cannot explain a tail
    # 2 ms over its target, one of 150 ms can (Observation.stall_set_latency)
    ((end_s, excess_ms),) = estimator.recent_stalls
    assert end_s == 12.5 and excess_ms == pytest.approx(150.0, rel=0.05)


def test_a_lasting_slowdown_is_learned() -> None:
    """Batches that keep coming in several times slower are a change, not outliers."""
    estimator, seen = fitted_estimator(rare=58)
    slow = [BatchSample(0.0, n, n, 5 * linear_ms(n) / 1e3) for n in range(30, 51)]
    for _ in range(10):  # most of each size's recent samples: its median moves
        seen += len(slow)
        estimator.update(slow, seen)
    assert estimator.median_ms(40) == pytest.approx(5 * linear_ms(40), rel=0.05)
    assert estimator.outliers_held_out == 0
    assert estimator.last_stall_s == -math.inf  # a change, not a stall: the PID may react


def test_sizes_beyond_the_fit_are_never_outliers() -> None:
    """Past the largest size known the prediction is optimistic on purpose: a batch there that
    takes several times longer is news, and is learned at once."""
    estimator, seen = fitted_estimator(rare=58)
    big = BatchSample(0.0, 256, 256, 4 * estimator.median_ms(256) / 1e3)
    estimator.update([big], seen + 1)
    assert estimator.outliers_held_out == 0
    assert estimator.median_ms(256) == pytest.approx(big.service_s * 1e3)


def test_a_lone_stall_at_a_new_size_is_held_out() -> None:
    """The first batch of 128 comes in a 10x spike. Taken as 128's time, it would keep the
    tail cap below 128 for good, since no batch of 128 would run again to correct it. It is
    held out at the next refit: ten times what 64's median allows at 128 in proportion. Where
    stalls are rare, the second batch as slow is 128's time, as for a model that slows down
    past a size."""
    estimator, seen = fitted_estimator(rare=58)
    optimistic_ms = estimator.median_ms(128)
    spike_ms = 10 * 2 * estimator.median_ms(64)
    spike = BatchSample(0.0, 128, 128, spike_ms / 1e3)
    estimator.update([spike], seen + 1)
    assert estimator.median_ms(128) == pytest.approx(optimistic_ms)
    assert estimator.outliers_held_out == 1
    estimator.update([spike], seen + 2)
    assert estimator.median_ms(128) == pytest.approx(spike_ms)
    assert estimator.outliers_held_out == 1


def test_lone_stalls_at_a_size_are_held_out_as_often_as_the_rate_of_stalls_allows() -> None:
    """Stalls on a third of the batches: five lone stalls at one size are held out (four in a
    row at that rate: 1.2 %; five: 0.4 %, below 1 %), and the sixth is the size's time."""
    estimator, seen = fitted_estimator(rare=58)
    for i in range(600):  # a stall on every third batch of the sizes known
        n = 30 + i % 21
        stall_ms = linear_ms(n) * (10.0 if i % 3 == 0 else 1.0)
        seen += 1
        estimator.update([BatchSample(0.0, n, n, stall_ms / 1e3)], seen)
    spike_ms = 10 * 2 * estimator.median_ms(64)
    held_before = estimator.outliers_held_out
    for held in range(1, 8):
        seen += 1
        estimator.update([BatchSample(0.0, 128, 128, spike_ms / 1e3)], seen)
        assert estimator.outliers_held_out - held_before == min(held, 5)
    assert estimator.median_ms(128) == pytest.approx(spike_ms)


def test_a_convex_models_new_sizes_far_above_the_measured_ones_are_learned_at_once() -> None:
    """``1 + 0.02 n**2`` ms measured at 8 and 16, then batches of 96 and 128 at their times:
    16's median grown in proportion is no ceiling eight times farther (a fresh user's trial
    held out 13 such batches and fitted 128 at 16.8 ms against 329), so sizes more than
    ``KNOWN_SPAN`` times a measured one are not judged from it."""
    estimator = ServiceTimeEstimator(refit_every=1)
    seen = _run_sizes(estimator, [8, 16] * 8, 0)
    seen = _run_sizes(estimator, [96, 128] * 2, seen)
    assert estimator.median_ms(128) == pytest.approx(_steep_ms(128))
    assert estimator.median_ms(96) == pytest.approx(_steep_ms(96))
    assert estimator.outliers_held_out == 0


def test_slow_samples_of_a_size_that_arrive_together_are_held_out_up_to_the_limit() -> None:
    """Two slow batches of 128 in one update, where no batch has stalled: the limit is one
    held out, so the second is 128's time (before, both went at once, past the limit that
    the docs state)."""
    estimator, seen = fitted_estimator(rare=58)
    slow_ms = 10 * 2 * estimator.median_ms(64)
    estimator.update([BatchSample(0.0, 128, 128, slow_ms / 1e3)] * 2, seen + 2)
    assert estimator.outliers_held_out == 1
    assert estimator.median_ms(128) == pytest.approx(slow_ms)


def test_a_stall_among_a_sizes_two_samples_is_held_out() -> None:
    """Two batches of 128, the first in a 10x spike: their median would be 5.5x the usual time.
    Fewer than three samples make no median that ignores a stall, so the spike is judged
    against the sizes measured more often and held out."""
    estimator, seen = fitted_estimator(rare=58)
    usual_ms = 2 * estimator.median_ms(64)
    pair = [BatchSample(0.0, 128, 128, ms / 1e3) for ms in (10 * usual_ms, usual_ms)]
    estimator.update(pair, seen + 2)
    assert estimator.median_ms(128) == pytest.approx(usual_ms)
    assert estimator.outliers_held_out == 1


def _jump_ms(n: int) -> float:
    return (1.0 + 0.1 * n) * (10.0 if n > 48 else 1.0)  # ten times slower past 48


def test_a_jump_in_time_is_learnt_from_the_sizes_beyond_it_together() -> None:
    """32-48 measured, then one batch at each third size from 49 to 96, all ten times slower
    than 48 in proportion. Judged one size at a time, each size's only sample was held out as
    a stall (a fresh user's trial held out 46-76 of 200 such batches), and the fit put each
    size at a tenth of its time. The sizes between the same two measured ones share the
    evidence: two of them beyond in a row, where stalls are this rare, are a jump."""
    estimator = ServiceTimeEstimator(refit_every=1)
    seen = _run_sizes(estimator, [32, 40, 48] * 20, 0, _jump_ms)
    _run_sizes(estimator, list(range(49, 97, 3)), seen, _jump_ms)
    assert estimator.outliers_held_out == 2
    for n in range(55, 97, 3):
        assert estimator.median_ms(n) == pytest.approx(_jump_ms(n))


def test_stalls_at_new_sizes_are_held_out_where_the_sizes_around_them_are_not() -> None:
    """Stalls on every third batch, also at new sizes 52-99 run once each: the sizes beyond
    50 measured at their times outweigh the stalls among them, so every stall is held out
    and no size's fit moves."""
    estimator, seen = fitted_estimator(rare=58)
    for i in range(600):
        n = 30 + i % 21
        seen += 1
        stall_ms = linear_ms(n) * (10.0 if i % 3 == 0 else 1.0)
        estimator.update([BatchSample(0.0, n, n, stall_ms / 1e3)], seen)
    held_before = estimator.outliers_held_out
    for i, n in enumerate(range(52, 100)):
        seen += 1
        stall_ms = linear_ms(n) * (10.0 if i % 3 == 0 else 1.0)
        estimator.update([BatchSample(0.0, n, n, stall_ms / 1e3)], seen)
    assert estimator.outliers_held_out - held_before == 16
    for n in range(52, 100):
        assert estimator.median_ms(n) == pytest.approx(linear_ms(n))


def _with_stalls_on_every_fifth_batch(estimator: ServiceTimeEstimator, seen: int) -> int:
    for i in range(600):  # a 10x stall on every fifth batch of the sizes known
        n = 30 + i % 21
        seen += 1
        stall_ms = linear_ms(n) * (10.0 if i % 5 == 0 else 1.0)
        estimator.update([BatchSample(0.0, n, n, stall_ms / 1e3)], seen)
    return seen


def test_a_size_whose_few_samples_are_mostly_stalls_is_judged_by_its_fastest() -> None:
    """Stalls on a fifth of the batches, and two of the first three batches of 80 among them
    (one time in ten at that rate). Their median stood as 80's time, ten times too slow: in a
    fresh user's cold start such a size kept the cap at 8-11 for good, and 30 % of the
    requests expired. A batch is never fast by accident, so the two are held out."""
    estimator, seen = fitted_estimator(rare=58)
    seen = _with_stalls_on_every_fifth_batch(estimator, seen)
    held_before = estimator.outliers_held_out
    three = [BatchSample(0.0, 80, 80, linear_ms(80) * f / 1e3) for f in (10.0, 1.0, 10.0)]
    estimator.update(three, seen + 3)
    assert estimator.median_ms(80) == pytest.approx(linear_ms(80))
    assert estimator.outliers_held_out - held_before == 2


def test_a_lone_stall_below_a_fast_larger_size_is_held_out() -> None:
    """One batch of 140 in a stall, then one of 150 at its time: 64 is too far below 140 for
    its median to bound it, but 150's batch does (a larger batch never takes less time)."""
    estimator, seen = fitted_estimator(rare=58)
    estimator.update([BatchSample(0.0, 140, 140, 10 * linear_ms(140) / 1e3)], seen + 1)
    assert estimator.outliers_held_out == 0  # beyond the fit: judged against nothing yet
    estimator.update([BatchSample(0.0, 150, 150, linear_ms(150) / 1e3)], seen + 2)
    assert estimator.outliers_held_out == 1
    assert estimator.median_ms(140) < linear_ms(150)


@pytest.mark.parametrize("seed", range(3))
def test_new_sizes_in_heavy_noise_are_not_held_out_for_a_fast_batch(seed: int) -> None:
    """Lognormal noise of sigma 0.8 (cv 0.95) and no stalls; new sizes 52-127 run twice
    each. The fastest of many noisy batches is far below the median: judged against it as
    if it could not be fast by accident, 2-5 of these batches were held out. It is allowed
    the noise's lower tail for as many batches as it is the fastest of."""
    rng = random.Random(seed)
    estimator = ServiceTimeEstimator(refit_every=1)

    def run(sizes: list[int], before: int) -> int:
        for seen, n in enumerate(sizes, start=before + 1):
            ms = linear_ms(n) * rng.lognormvariate(0.0, 0.8)
            estimator.update([BatchSample(0.0, n, n, ms / 1e3)], seen)
        return before + len(sizes)

    seen = run([30 + i % 21 for i in range(600)], 0)
    held_before = estimator.outliers_held_out
    run(list(range(52, 128, 3)) * 2, seen)
    assert estimator.outliers_held_out == held_before


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.tuples(
            st.integers(1, 64),
            st.sampled_from([0.0, 0.0, 1.0, 3.0, 30.0, 1e6, -1.0, math.inf, math.nan]),
        ),
        min_size=1,
        max_size=120,
    )
)
def test_any_mix_of_zero_slow_and_broken_times_is_fitted_without_error(
    batches: list[tuple[int, float]],
) -> None:
    """Batches measured at 0 ms (a clock too coarse, a model that returns at once) put the
    noise's body at 0; judging a size's first samples by its fastest one then divided by 0.
    A broken clock's negative or infinite reading made a NaN ratio, which broke the sorted
    ratios; it is left out."""
    estimator = ServiceTimeEstimator(refit_every=1, min_samples=1)
    for seen, (n, ms) in enumerate(batches, start=1):
        estimator.update([BatchSample(0.0, n, n, ms * (1 + 0.1 * n) / 1e3)], seen)
        assert not estimator.spread < 1.0  # read every batch, as the controller does
    assert not any(estimator.median_ms(n) < 0.0 for n in (1, 32, 64))  # NaN: no fit yet


def test_a_fit_of_zero_and_spiked_times_never_predicts_a_negative_time() -> None:
    """A fresh user's fuzzing (seed 14): updates of 1-6 batches at sizes 1-64, 30 % at 0 ms
    and 15 % in 10x spikes. The fit's line through the smallest sizes went below 0 (-1.0 ms
    at 1, p99 -20 ms); a batch never takes less than 0 ms."""
    rng = random.Random(14)
    min_samples, refit_every = rng.choice([1, 2, 8]), rng.choice([1, 3, 8])  # 1 and 8
    estimator = ServiceTimeEstimator(min_samples=min_samples, refit_every=refit_every)
    history: list[BatchSample] = []
    end_s = 0.0
    for _ in range(30):
        for _ in range(rng.randint(1, 6)):
            n = rng.choice([1, 1, 2, 4, 8, 16, 32, 64])
            draw = rng.random()
            ms = 0.0 if draw < 0.3 else (2 + 0.2 * n) * (10 if draw < 0.45 else 1)
            end_s += ms / 1e3 if ms else 0.001
            history.append(BatchSample(end_s, n, n, ms / 1e3))
        estimator.update(history[-256:], len(history))
        budget_ms = rng.choice([0.0, 1.0, 50.0, math.inf])
        estimator.largest_within(budget_ms, [1, 2, 4, 8, 16, 32, 64])
        for size in (1, 2, 4, 64):
            assert not estimator.median_ms(size) < 0.0
            assert not estimator.p99_ms(size) < 0.0


def _steep_ms(n: int) -> float:
    return 1.0 + 0.02 * n * n  # convex: the chord between two sizes lies far above it


def _run_sizes(
    estimator: ServiceTimeEstimator,
    sizes: list[int],
    seen: int,
    model_ms: Callable[[int], float] = _steep_ms,
) -> int:
    for n in sizes:
        seen += 1
        estimator.update([BatchSample(0.0, n, n, model_ms(n) / 1e3)], seen)
    return seen


def test_sizes_between_distant_fitted_sizes_are_learned_not_a_change_of_level() -> None:
    """Fitted at 1 and 32 only, a convex model's chord puts 16 at 10.9 ms where it takes 6.1.
    Before, batches of 16 read as a fast change of level: every size was scaled by 0.56, and
    32 was predicted at 12 ms where it takes 21.5 (a cap raised on that promise misses)."""
    estimator = ServiceTimeEstimator()
    seen = _run_sizes(estimator, [1] * 64 + [32] * 16, 0)
    assert estimator.median_ms(16) > 1.5 * _steep_ms(16)  # the chord
    seen = _run_sizes(estimator, [16] * 16 + [8] * 16, seen)
    assert estimator.level_changes == 0 and estimator.level == 1.0
    for n in (1, 8, 16, 32):
        assert estimator.median_ms(n) == pytest.approx(_steep_ms(n))
    assert estimator.body() == (1.0, 0.0)  # a chord's error is no noise


def test_a_stall_between_distant_fitted_sizes_is_still_an_outlier() -> None:
    estimator = ServiceTimeEstimator()
    seen = _run_sizes(estimator, [1] * 64 + [32] * 16, 0)
    stall = BatchSample(0.0, 16, 16, 20 * _steep_ms(16) / 1e3)
    estimator.update([stall], seen + 1)
    assert estimator.outliers_held_out == 1


def test_sizes_below_the_only_fitted_size_are_learned_not_a_change_of_level() -> None:
    """Fitted at 512 only, the fit is flat below: a batch of one reads at 32 ms where it takes
    3.7, which is what the fit does not know yet, not a faster device."""
    estimator = ServiceTimeEstimator()
    table = {512: 32.23, 1: 3.68}
    for seen, n in enumerate([512] * 16 + [1] * 16, start=1):
        estimator.update([BatchSample(0.0, n, n, table[n] / 1e3)], seen)
    assert estimator.level_changes == 0
    assert estimator.median_ms(1) == pytest.approx(3.68)
    assert estimator.median_ms(512) == pytest.approx(32.23)


def test_error_bars_follow_the_last_batches_once_the_window_is_full() -> None:
    """The spread is the quantile over the last ``spread_window`` ratios, also after the
    window has filled up (it had stopped moving at the moment it filled)."""
    estimator = ServiceTimeEstimator(min_samples=1, refit_every=1000, spread_window=16)
    estimator.update([BatchSample(0.0, 4, 4, 0.004)], total_seen=1)  # the fit: 4 ms
    estimator.update([BatchSample(0.0, 4, 4, 0.004)] * 16, total_seen=17)
    assert estimator.spread == 1.0
    estimator.update([BatchSample(0.0, 4, 4, 0.0056)] * 16, total_seen=33)  # 1.4x the fit
    assert estimator.spread == pytest.approx(1.4)


@settings(max_examples=100, deadline=None)
@given(
    # ratios to the 4 ms fit within CHANGE_RATIO either way: no change of level
    times_ms=st.lists(st.floats(2.7, 5.9), min_size=1, max_size=80),
    window=st.integers(1, 24),
    reads=st.sets(st.integers(0, 79)),
)
def test_error_bars_are_the_quantile_of_the_window_sorted_afresh(
    times_ms: list[float], window: int, reads: set[int]
) -> None:
    """The sorted window kept from batch to batch gives the quantile a fresh sort of the last
    ``spread_window`` ratios gives, read at any point (the fit stays at 4 ms: no refit)."""
    estimator = ServiceTimeEstimator(min_samples=1, refit_every=10_000, spread_window=window)
    estimator.update([BatchSample(0.0, 4, 4, 0.004)], total_seen=1)
    for seen, ms in enumerate(times_ms, start=2):
        estimator.update([BatchSample(0.0, 4, 4, ms / 1e3)], total_seen=seen)
        if seen - 2 in reads or seen - 1 == len(times_ms):
            last = sorted(t / 1e3 * 1e3 / 4.0 for t in times_ms[: seen - 1][-window:])
            index = min(len(last) - 1, int(estimator.spread_quantile * len(last)))
            assert estimator.spread == max(1.0, last[index])


@settings(max_examples=100, deadline=None)
@given(
    points=st.dictionaries(st.integers(1, 600), st.floats(0.5, 50.0), min_size=2, max_size=40),
    refits=st.integers(1, 3),
)
def test_predictions_made_at_a_refit_equal_one_call_per_size(
    points: dict[int, float], refits: int
) -> None:
    """A refit predicts every size inside the fitted range at once (one np.interp on an array);
    each value must be the one a call for that size alone gives, or decisions would change."""
    estimator = ServiceTimeEstimator(refit_every=1, min_samples=1)
    batch = samples(points, repeat=2)
    for k in range(refits):
        estimator.update(batch, total_seen=(k + 1) * len(batch))
    sizes, medians, level = estimator._sizes, estimator._medians, estimator.level
    for n in range(1, 650):
        if sizes[0] < n < sizes[-1]:
            assert estimator.median_ms(n) == level * float(np.interp(n, sizes, medians))


def test_reservoir_medians_follow_new_samples() -> None:
    """Medians are kept between refits, and dropped when their size gets a new sample."""
    estimator = ServiceTimeEstimator(refit_every=1, min_samples=1)
    estimator.update([BatchSample(0.0, 8, 8, 0.004)] * 3, total_seen=3)
    assert estimator.median_ms(8) == pytest.approx(4.0)
    estimator.update([BatchSample(0.0, 8, 8, 0.005)] * 5, total_seen=8)
    assert estimator.median_ms(8) == pytest.approx(5.0)  # median of 3 x 4 ms and 5 x 5 ms


def _pooled_blocks_reference(values: list[float], weights: list[float]) -> list[float]:
    """Pool adjacent violators as the first implementation did (a list per block)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([float(value), float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, total, count = blocks.pop()
            previous = blocks[-1]
            combined = previous[1] + total
            previous[0] = (previous[0] * previous[1] + mean * total) / combined
            previous[1] = combined
            previous[2] += count
    fitted: list[float] = []
    for mean, _, count in blocks:
        fitted.extend([mean] * int(count))
    return fitted


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0.0, 100.0), st.floats(0.5, 32.0)), max_size=80),
)
def test_isotonic_fit_is_non_decreasing_and_pools_as_the_reference(
    pairs: list[tuple[float, float]],
) -> None:
    values, weights = [v for v, _ in pairs], [w for _, w in pairs]
    fitted = isotonic_fit(values, weights)
    assert fitted == _pooled_blocks_reference(values, weights)  # the same floats, exactly
    assert all(b >= a for a, b in itertools.pairwise(fitted))
    assert isotonic_fit(values) == _pooled_blocks_reference(values, [1.0] * len(values))


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0.1, 100.0), st.floats(0.5, 32.0)), max_size=60),
    relative_sd=st.floats(0.0, 1.0),
)
def test_isotonic_fit_with_noise_stays_non_decreasing_and_keeps_the_weighted_mean(
    pairs: list[tuple[float, float]], relative_sd: float
) -> None:
    values, weights = [v for v, _ in pairs], [w for _, w in pairs]
    fitted = isotonic_fit(values, weights, relative_sd)
    assert len(fitted) == len(values)
    assert all(b >= a for a, b in itertools.pairwise(fitted))
    total = sum(weights)
    if total:  # pooling moves values within blocks, never the weighted mean
        mean = sum(v * w for v, w in zip(values, weights, strict=True)) / total
        pooled = sum(f * w for f, w in zip(fitted, weights, strict=True)) / total
        assert pooled == pytest.approx(mean, rel=1e-9)


def test_isotonic_fit_pools_a_top_spike_the_noise_explains_and_keeps_a_real_step() -> None:
    """A flat 50 ms batch with 30 % noise: 40 samples at the sizes the window forms, then the
    rare large sizes with one sample each, one of them 1.5x (llama decode in a fresh-user
    case spiked the fit to 73 ms where the device took 51). A step of 40 % backed by 20
    samples a size is kept."""
    flat = [50.0] * 8 + [62.0, 48.0, 75.0, 47.0]
    weights = [5.0] * 8 + [1.0] * 4
    assert isotonic_fit(flat, weights)[-1] == pytest.approx((75.0 + 47.0) / 2)  # the spike
    assert isotonic_fit(flat, weights, 0.3)[-1] == pytest.approx(
        sum(v * w for v, w in zip(flat, weights, strict=True)) / sum(weights), rel=0.02
    )
    step = [50.0] * 8 + [70.0] * 4
    assert isotonic_fit(step, [20.0] * 12, 0.3)[-1] == 70.0
    sizes = list(range(1, 13))
    assert isotonic_fit(flat, weights, 0.3, sizes)[-1] == isotonic_fit(flat, weights, 0.3)[-1]


def test_isotonic_fit_keeps_a_slope_at_the_top_that_stands_out_of_the_noise() -> None:
    """resnet50's times from 256 to 512 (a prior at 512, few samples above 256), 30 % noise
    read in the body: each step is within the noise, so the top blocks pool, but flat they
    would read 512 at 23 ms where it takes 32 (a diurnal replay then planned an overload away);
    their line's slope stands out of the noise and is kept."""
    sizes = [256, 288, 320, 352, 384, 416, 448, 480, 512]
    times = [4.0 + 0.0553 * n for n in sizes]
    weights = [3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert isotonic_fit(times, weights, 0.3)[-1] < 0.75 * times[-1]
    fitted = isotonic_fit(times, weights, 0.3, sizes)
    assert fitted == pytest.approx(times)


def _with_ratios(ratios: list[float]) -> ServiceTimeEstimator:
    """An estimator whose fit is 4 ms for batches of 4 and whose error-bar window holds
    ``ratios`` (measured / predicted), no refit after the first batch."""
    estimator = ServiceTimeEstimator(min_samples=1, refit_every=100_000, spread_window=4096)
    estimator.update([BatchSample(0.0, 4, 4, 0.004)], total_seen=1)
    batches = [BatchSample(0.0, 4, 4, 0.004 * ratio) for ratio in ratios]
    for start in range(0, len(batches), MAX_TAKEN):  # as ticks take them in
        chunk = batches[start : start + MAX_TAKEN]
        estimator.update(chunk, total_seen=1 + start + len(chunk))
    return estimator


def test_the_noise_body_is_a_robust_lognormal_fit() -> None:
    """30 % lognormal noise (sigma 0.294) from 2000 ratios: the body's 95th percentile is the
    ratios' own (1.62), and its 99.9th extrapolates (exp(3.09 * 0.294) = 2.48)."""
    sigma = math.sqrt(math.log1p(0.09))
    ratios = np.random.default_rng(0).lognormal(0.0, sigma, 2000).tolist()
    estimator = _with_ratios(ratios)
    median, fitted_sigma = estimator.body()
    assert median == pytest.approx(1.0, abs=0.02)
    assert fitted_sigma == pytest.approx(sigma, rel=0.06)
    assert estimator.spread == pytest.approx(1.62, abs=0.05)
    assert estimator.body_spread_ms(4) / 4.0 == pytest.approx(estimator.spread, rel=0.04)
    assert estimator.body_p999_ms(4) / 4.0 == pytest.approx(math.exp(P999_Z * sigma), rel=0.06)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(0.0), st.floats(0.01, 100.0), st.sampled_from([0.5, 1.0, 2.0])),
        min_size=4,
        max_size=80,
    )
)
def test_the_noise_body_sigma_is_the_median_absolute_deviation_of_the_logs(
    ratios: list[float],
) -> None:
    """The bisection over the two sorted runs of deviations gives the sorted deviations'
    median exactly (a zero ratio deviates without bound)."""
    ordered = sorted(ratios)
    middle = int(0.5 * (len(ordered) - 1))
    median, sigma = _robust_lognormal(ordered)
    assert median == ordered[middle]
    if median > 0:
        centre = math.log(median)
        deviations = sorted(abs(math.log(r) - centre) if r > 0 else math.inf for r in ordered)
        assert sigma == deviations[middle] / 0.6745


def test_the_noise_body_leaves_stalls_out() -> None:
    """Stalls on 5 % of batches (10x) set the raw 95th percentile (what shedding deadlines
    use), not the body's quantiles (what windows use): no window escapes a stall."""
    ratios = [10.0 if i % 20 == 19 else 1.0 + 0.01 * (i % 5) for i in range(2000)]
    estimator = _with_ratios(ratios)
    assert estimator.spread == 10.0
    assert estimator.body_spread_ms(4) < 4.0 * 1.1
    assert estimator.body_p999_ms(4) < 4.0 * 1.2


def test_the_noise_body_before_ratios_and_below_the_fit() -> None:
    assert ServiceTimeEstimator().body() == (1.0, 0.0)
    faster = _with_ratios([0.8] * 10)  # faster than the fit: the error bars never go below it
    assert faster.body() == (0.8, 0.0)
    assert faster.body_spread_ms(4) == faster.body_p999_ms(4) == 4.0


def test_the_tail_carries_stalls_and_spikes_the_body_leaves_out() -> None:
    """The batch a p99 request rides: the raw 99th percentile of the ratios, so spikes of 10x
    on 5 % of batches set it (where the body's quantiles stay near 1)."""
    ratios = [10.0 if i % 20 == 19 else 1.0 + 0.01 * (i % 5) for i in range(2000)]
    estimator = _with_ratios(ratios)
    assert estimator.p99_ms(4) == 4.0 * 10.0
    assert estimator.body_spread_ms(4) < 4.0 * 1.1
    calm = _with_ratios([1.0 + 0.01 * (i % 5) for i in range(2000)])
    # no outliers: the measured excess's p99, or the fitted noise body's, 1.04-1.06
    assert calm.p99_ms(4) == pytest.approx(4.0 * 1.04, rel=0.02)
    assert ServiceTimeEstimator().p99_ms(4) != ServiceTimeEstimator().p99_ms(4)  # NaN: no fit


def test_spikes_on_a_few_per_cent_of_batches_are_outliers() -> None:
    """Outliers are judged against the body's error bars, not the raw 95th percentile that
    10x spikes on 5 % of batches set themselves (3 x 10: no spike would ever count): each
    spike is held out of the fit and dates the last stall, which the PID reads."""
    estimator = _with_ratios([10.0 if i % 20 == 19 else 1.0 + 0.01 * (i % 5) for i in range(2000)])
    assert estimator.spread == pytest.approx(10.0)
    held = estimator.outliers_held_out
    spike = BatchSample(7.5, 4, 4, 0.004 * 10.0)
    estimator.update([spike], total_seen=estimator._seen_total + 1)
    assert estimator.outliers_held_out == held + 1
    assert estimator.last_stall_s == 7.5


def _spiky(estimator: ServiceTimeEstimator, batches: int, seed: int, factor: float = 1.0) -> None:
    """Sizes 4, 8 and 16 at random, a third of their batches 10x slower (``factor`` times
    linear_ms, 5 % lognormal noise)."""
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        n = int(rng.choice([4, 8, 16]))
        spike = 10.0 if rng.random() < 0.3 else 1.0
        ms = factor * linear_ms(n) * spike * rng.lognormal(0.0, 0.05)
        estimator.update([BatchSample(0.0, n, n, ms / 1e3)], estimator._seen_total + 1)


@pytest.mark.parametrize("seed", range(4))
def test_spikes_on_a_third_of_batches_leave_the_fit_and_set_the_mean(seed: int) -> None:
    """Before: the quartiles of the ratios fell among the spikes, the body's sigma grew past
    1.5, every size was pooled into one flat fit, and 5 spikes among 8 batches (every 17
    batches or so) read as a tenfold slowdown. The spikes are outliers now: the fit keeps the
    shape, and the mean says what they cost (0.7 + 0.3 x 10 = 3.7 times the median)."""
    estimator = ServiceTimeEstimator()
    _spiky(estimator, 3000, seed)
    for n in (4, 8, 16):
        assert estimator.median_ms(n) == pytest.approx(linear_ms(n), rel=0.06)
    assert estimator.body()[1] < 0.25  # 1.7 from the quartiles
    assert estimator.mean_ratio == pytest.approx(3.7, rel=0.12)
    assert estimator.p99_ms(8) / estimator.median_ms(8) > 9.0
    assert estimator.level_changes <= 8  # about 90 before


def test_a_lasting_slowdown_under_frequent_spikes_is_still_learned() -> None:
    estimator = ServiceTimeEstimator()
    _spiky(estimator, 1000, seed=0)
    _spiky(estimator, 200, seed=1, factor=3.0)
    assert estimator.median_ms(8) == pytest.approx(3.0 * linear_ms(8), rel=0.1)


def test_a_batch_faster_than_its_prediction_is_kept() -> None:
    """A fast batch is no accident of the device: before, one far below its prediction was
    dropped, and a size whose median a spike had set could never come back down."""
    estimator, seen = fitted_estimator(rare=58)
    fast = BatchSample(0.0, 40, 40, 0.1 * linear_ms(40) / 1e3)
    estimator.update([fast], seen + 1)
    steady(estimator, [30] * OUTLIER_WINDOW, seen + 1)  # it leaves the window unconfirmed
    assert 0.1 * linear_ms(40) / estimator.level in estimator._reservoir[40]


def test_the_mean_ratio_leaves_a_lone_huge_stall_and_sizes_beyond_the_fit_out() -> None:
    estimator, seen = fitted_estimator(rare=58)
    assert estimator.mean_ratio == pytest.approx(1.0)
    stall = BatchSample(0.0, 40, 40, 1000.0 * linear_ms(40) / 1e3)  # 12 s
    beyond = BatchSample(0.0, 256, 256, 5.0 * estimator.median_ms(256) / 1e3)
    estimator.update([stall, beyond], seen + 2)
    assert estimator.mean_ratio == pytest.approx(1.0, abs=0.02)
    assert estimator.mean_ms(40) == pytest.approx(estimator.median_ms(40) * estimator.mean_ratio)


def _outliers_over_sizes(excess_ms: Callable[[int], float]) -> ServiceTimeEstimator:
    """Sizes 30-50 and 64 fitted (linear_ms: 9-15.8 ms), then every fifth batch an outlier whose
    excess over its size's time is ``excess_ms(size)``, spread over the sizes."""
    estimator, seen = fitted_estimator(58)
    for round_ in range(4):
        for n in range(30, 65, 4):
            seen = steady(estimator, [30, 40, 50, 35], seen)
            spike = BatchSample(float(round_), n, n, (linear_ms(n) + excess_ms(n)) / 1e3)
            estimator.update([spike], seen + 1)
            seen += 1
    return estimator


def test_outlier_elasticity_tells_spikes_from_stalls() -> None:
    """Spikes that scale with the batch (10x its time) have an elasticity near 1; stalls
    added whatever the batch (60 ms) near 0; a narrower window shortens only the first."""
    spikes = _outliers_over_sizes(lambda n: 9.0 * linear_ms(n))
    stalls = _outliers_over_sizes(lambda n: 60.0)
    assert spikes.outliers_seen >= OUTLIER_ELASTICITY_MIN
    assert spikes.outlier_elasticity == pytest.approx(1.0, abs=0.05)
    assert stalls.outlier_elasticity == pytest.approx(0.0, abs=0.05)


def test_the_batch_a_p99_request_rides_adds_a_pause_or_scales_a_spike() -> None:
    """A 60 ms pause added whatever the batch (elasticity near 0) is the p99 batch's excess
    at every size: before, the ratios' 99th percentile (about 7.7, the pause over the
    smallest batch's 9 ms) priced a batch of 64 at 121 ms where it takes 76 ms. Spikes of 10x
    (elasticity near 1) still scale with the batch."""
    stalls = _outliers_over_sizes(lambda n: 60.0)
    for n in (30, 64):
        assert stalls.p99_ms(n) == pytest.approx(stalls.median_bound_ms(n) + 60.0, rel=0.03)
    spikes = _outliers_over_sizes(lambda n: 9.0 * linear_ms(n))
    for n in (30, 64):
        assert spikes.p99_ms(n) == pytest.approx(10.0 * spikes.median_bound_ms(n), rel=0.05)


def _outliers_at_close_sizes(excess_ms: Callable[[int], float]) -> ServiceTimeEstimator:
    """Outliers at sizes 30 and 35 only (9 and 10 ms: too close for an elasticity), whose
    excess over their size's time is ``excess_ms(size)``."""
    estimator, seen = fitted_estimator(58)
    for round_ in range(2 * OUTLIER_ELASTICITY_MIN):
        seen = steady(estimator, [30, 40, 50, 35], seen)
        n = (30, 35)[round_ % 2]
        stall = BatchSample(float(round_), n, n, (linear_ms(n) + excess_ms(n)) / 1e3)
        estimator.update([stall], seen + 1)
        seen += 1
    assert math.isnan(estimator.outlier_elasticity)
    return estimator


def test_outliers_of_unknown_elasticity_are_added_where_alike_in_ms() -> None:
    """Where the elasticity cannot be measured, outliers that are more alike in their excess
    (a 60 ms pause) than in their ratio are taken as added, as the PID's stall hold takes
    them, so a larger batch is not charged its ratio to a small one; 10x spikes are alike in
    their ratio and still scale."""
    paused = _outliers_at_close_sizes(lambda n: 60.0)
    assert paused.p99_ms(64) == pytest.approx(paused.median_bound_ms(64) + 60.0, rel=0.03)
    spiked = _outliers_at_close_sizes(lambda n: 9.0 * linear_ms(n))
    assert spiked.p99_ms(64) == pytest.approx(10.0 * spiked.median_bound_ms(64), rel=0.05)


def test_the_mean_of_added_pauses_is_their_mean_excess() -> None:
    """A 60 ms pause on about one batch in nine adds the same 6.5 ms to a batch's mean at
    every size; the mean ratio (1.55, the pauses over 9-16 ms batches) charged a batch of 64
    24.4 ms where it takes 22.3 on average."""
    stalls = _outliers_over_sizes(lambda n: 60.0)
    added = [stalls.mean_ms(n) - stalls.median_ms(n) for n in (30, 64)]
    assert added[0] == pytest.approx(added[1]) == pytest.approx(60.0 * 36 / 334, rel=0.01)
    assert stalls.mean_ms(64) < stalls.median_ms(64) * stalls.mean_ratio


def test_added_pauses_are_the_batches_excesses_and_spikes_give_none() -> None:
    """The plan prices pauses from each recent batch's excess over its prediction: 60 ms
    pauses on about one batch in nine show as 36 excesses near 60 ms among 334 batches, the
    rest near 0 (never below); spikes that scale with the batch give none, as they are not
    pauses."""
    pauses = _outliers_over_sizes(lambda n: 60.0).added_pauses_ms()
    assert len(pauses) == 334 and min(pauses) >= 0.0
    assert list(pauses) == sorted(pauses)
    assert sum(1 for pause in pauses if pause > 50.0) == 36
    assert all(pause == pytest.approx(60.0, rel=0.05) for pause in pauses[-36:])
    assert sorted(pauses)[-37] < 1.0
    assert _outliers_over_sizes(lambda n: 9.0 * linear_ms(n)).added_pauses_ms() == ()


def test_outlier_elasticity_needs_outliers_over_batches_of_different_times() -> None:
    estimator, seen = fitted_estimator(58)
    assert math.isnan(estimator.outlier_elasticity)  # no outlier yet
    for round_ in range(2 * OUTLIER_ELASTICITY_MIN):  # outliers all at one size: no leverage
        seen = steady(estimator, [30, 40, 50, 35], seen)
        stall = BatchSample(float(round_), 40, 40, (linear_ms(40) + 60.0) / 1e3)
        estimator.update([stall], seen + 1)
        seen += 1
    assert estimator.outliers_seen >= OUTLIER_ELASTICITY_MIN
    assert math.isnan(estimator.outlier_elasticity)


def _scaled(estimator: ServiceTimeEstimator, sizes: list[int], factor: float, seen: int) -> int:
    """Feed one batch per size in ``sizes`` at ``factor`` times its usual time."""
    batch = [BatchSample(0.0, n, n, factor * linear_ms(n) / 1e3) for n in sizes]
    estimator.update(batch, seen + len(batch))
    return seen + len(batch)


def test_a_lasting_slowdown_rescales_every_size_and_its_end_brings_them_back() -> None:
    """A 10x slowdown seen on sizes 30-40 only is a change of level: the sizes it never ran
    (64) are rescaled with it, and when it passes every size comes back at once. Before, the
    sizes a slowdown's queue formed kept their slow medians for as long as they went unseen,
    and the tail cap stayed cut."""
    estimator, seen = fitted_estimator(rare=58)
    usual = estimator.median_ms(64)
    seen = _scaled(estimator, list(range(30, 40)), 10.0, seen)
    assert estimator.level == pytest.approx(10.0, rel=0.05)
    assert estimator.median_ms(64) == pytest.approx(10.0 * usual, rel=0.05)
    assert estimator.outliers_held_out == 0 and estimator.last_stall_s == -math.inf
    seen = _scaled(estimator, list(range(30, 40)), 1.0, seen)
    assert estimator.level == pytest.approx(1.0, rel=0.05)
    assert estimator.median_ms(64) == pytest.approx(usual, rel=0.05)
    assert estimator.level_changes == 2


def test_batches_that_ran_across_a_loop_stall_are_left_out() -> None:
    estimator, seen = fitted_estimator(rare=58)
    before = estimator.median_ms(40)
    across = [BatchSample(5.0 + 0.1 * i, 40, 40, 2.0) for i in range(8)]  # 2 s each
    estimator.update(across, seen + len(across), stall=(4.0, 6.0))
    assert estimator.median_ms(40) == before
    assert estimator.level == 1.0 and estimator.outliers_seen == 0


def test_batches_measured_at_zero_ms_lower_the_level_as_far_as_it_goes() -> None:
    """A clock too coarse for the model (or a model that answers at once) measures 0 ms: the
    level falls to its floor, and no division by zero fails the controller's tick."""
    estimator = ServiceTimeEstimator(refit_every=1, min_samples=1)
    estimator.update([BatchSample(0.0, 4, 4, 0.004)] * 8, total_seen=8)
    estimator.update([BatchSample(0.0, 4, 4, 0.0)] * 8, total_seen=16)
    assert estimator.level == pytest.approx(1.0 / MAX_LEVEL)
    assert 0.0 <= estimator.median_ms(4) <= 4.0 / MAX_LEVEL


def test_padded_batches_are_measured_at_the_size_that_ran() -> None:
    """33 units padded to 64 took 64's time: the fit learns it at 64, not at 33."""
    estimator = ServiceTimeEstimator(refit_every=1, min_samples=4)
    ran = [BatchSample(0.0, 33, 33, 0.0072)] * 4 + [BatchSample(0.0, 3, 3, 0.0040)] * 4
    estimator.update(ran, total_seen=8, run_size=lambda n: 64 if n > 32 else 4)
    assert estimator.median_ms(64) == pytest.approx(7.2, rel=0.05)
    assert estimator.median_ms(4) == pytest.approx(4.0, rel=0.05)


def test_sizes_unseen_since_a_change_of_level_follow_the_sizes_seen() -> None:
    """A change of level is judged on its first batches: here the slowdown's first are 9x
    while it is 10x, and the first after its end (begun before it) 1.5x. The sizes that keep
    running (30-39) learn the truth from their new samples; a size that does not (64) must
    follow them once the slowdown has passed, or it stays too slow for as long as it goes
    unseen (in real time the tail cap stayed cut at half for good): the samples from before
    the slowdown, not the slowdown's own, tell how far. While the slowdown lasts it may stay
    too fast: a cap raised on that learns the truth by running it."""
    estimator, seen = fitted_estimator(rare=58)
    usual = estimator.median_ms(64)
    seen = _scaled(estimator, list(range(30, 35)), 9.0, seen)
    for _ in range(12):
        seen = _scaled(estimator, list(range(30, 40)), 10.0, seen)
    assert estimator.level_changes == 1
    assert estimator.median_ms(35) == pytest.approx(10.0 * linear_ms(35), rel=0.02)
    assert 9.0 * usual <= estimator.median_ms(64) <= 10.0 * usual * 1.02
    seen = _scaled(estimator, list(range(30, 35)), 1.5, seen)
    for _ in range(12):
        seen = _scaled(estimator, list(range(30, 40)), 1.0, seen)
    assert estimator.level_changes == 2
    assert estimator.median_ms(35) == pytest.approx(linear_ms(35), rel=0.02)
    assert estimator.median_ms(64) == pytest.approx(usual, rel=0.02)


def test_batches_run_while_the_loop_catches_up_after_a_stall_are_left_out() -> None:
    """After a 1 s stall the loop works through what the stall held back: the batches that
    drain that backlog (the largest of the run, here 64) share it with all the callbacks due,
    and measured 20 % slow. Kept, they alone would set the time of the largest sizes, and the
    tail cap would stay cut for as long as no batch that large formed again. Once the loop has
    caught up (a stall's length after its end), batches count again."""
    estimator, seen = fitted_estimator(rare=58)
    before = estimator.median_ms(64)
    draining = [BatchSample(5.2 + 0.02 * i, 64, 64, 1.2 * before / 1e3) for i in range(40)]
    seen += len(draining)
    estimator.update(draining, seen, stall=(4.0, 5.0))
    assert estimator.median_ms(64) == before
    later = [BatchSample(6.2 + 0.02 * i, 64, 64, 1.2 * before / 1e3) for i in range(40)]
    seen += len(later)
    estimator.update(later, seen, stall=(4.0, 5.0))
    assert estimator.median_ms(64) == pytest.approx(1.2 * before)


def test_seeded_sizes_follow_the_sizes_seen_after_a_change_of_level() -> None:
    """The real-time case: warm-up seeded sizes 1-128, the load ran batches of 20-40, a 10x
    slowdown ran batches of 1-8 (judged at 9x), and after it batches of 20-40 again (the
    first judged at 1.5x, the next 21 at 1.06x while the backlog drains). 128 was never run,
    only seeded: its time must come back too, with the later batches, not the drain's."""
    seed = [(n, linear_ms(n)) for n in (1, 2, 4, 8, 16, 32, 64, 128)]
    estimator, seen = ServiceTimeEstimator(refit_every=1, seed=seed), 0
    for _ in range(4):
        seen = steady(estimator, list(range(20, 41)), seen)
    seen = _scaled(estimator, [4, 5, 6, 7, 8], 9.0, seen)
    for _ in range(6):
        seen = _scaled(estimator, list(range(1, 9)), 10.0, seen)
    assert estimator.level_changes == 1
    seen = _scaled(estimator, list(range(20, 25)), 1.5, seen)
    seen = _scaled(estimator, list(range(20, 41)), 1.06, seen)
    for _ in range(6):
        seen = _scaled(estimator, list(range(20, 41)), 1.0, seen)
    assert estimator.level_changes == 2
    assert estimator.median_ms(30) == pytest.approx(linear_ms(30), rel=0.02)
    assert estimator.median_ms(128) == pytest.approx(linear_ms(128), rel=0.02)


def test_the_noise_pools_the_observed_sizes_not_a_profiles_prior_beyond_them() -> None:
    """resnet50 under 30 % noise, batches seen up to 288, the profile's 512 at 32.2 ms beyond
    them: pooled with the top of the observed sizes, the prior read 27.9 ms, and a diurnal
    replay planned an overload away (1.35x device time on its seed 0). It stays a plain point
    of the fit; the observed top still pools."""
    noisy = _with_ratios([math.exp(0.3 * z) for z in (-1.0, -0.5, -0.2, 0.0, 0.2, 0.5, 1.0)] * 20)
    sizes = [128, 160, 192, 224, 256, 288, 512]
    medians = [11.1, 12.9, 14.6, 16.4, 16.6, 25.0, 32.2]  # 288: one slow sample
    weights = [8.0, 6.0, 4.0, 2.0, 2.0, 1.0, 1.0]
    noisy._fit_points(sizes, medians, weights, observed_max=288)
    assert noisy.median_ms(512) == pytest.approx(32.2)
    assert noisy.median_ms(288) < 25.0  # the spike pooled


def test_runs_of_spikes_at_their_usual_rate_are_no_change_of_level() -> None:
    """Runs of 6 batches 10x slower every 14 batches (43 % of them): 6 suspects of 8 are usual
    here, so no change of level. Judged by the fit in force when they ran, the batches that
    confirmed a change read as ordinary ones afterwards, every run looked unlikely, and the
    level changed 299 times in 2100 batches."""
    estimator, seen = ServiceTimeEstimator(), 0
    sizes = [4, 8, 16]
    for block in range(150):
        for j in range(14):
            n = sizes[(block + j) % 3]
            ms = linear_ms(n) * (10.0 if j < 6 else 1.0)
            seen += 1
            estimator.update([BatchSample(0.0, n, n, ms / 1e3)], seen)
    assert estimator.level_changes == 0
    assert estimator.median_ms(8) == pytest.approx(linear_ms(8))


def test_a_seed_too_slow_is_corrected_at_the_sizes_never_run() -> None:
    """A profile twice too slow, then only batches of 1-8: every batch is a suspect, so by
    the rate of suspects before them no run is unlikely. While the fit rests on the seed
    alone, most batches against it are a change of its level: 32 and 64, never run, follow
    (they kept the seed's 2x before)."""
    rng = random.Random(0)
    estimator = ServiceTimeEstimator(seed=[(n, 2.0 * linear_ms(n)) for n in (1, 2, 4, 8, 32, 64)])
    for seen in range(1, 401):
        n = rng.choice([1, 2, 4, 8])
        estimator.update([BatchSample(0.0, n, n, linear_ms(n) / 1e3)], seen)
    assert estimator.level_changes == 1
    for n in (4, 32, 64):
        assert estimator.median_ms(n) == pytest.approx(linear_ms(n), rel=0.05), n


def _slowdown_under_spikes_is_tracked(seed: int) -> bool:
    """Whether a 3x slowdown at batch 200 under 10x spikes on 30 % of batches is one change of
    level by batch 230, to within 20 % at 32, and its end at batch 300 another by 330."""
    rng = random.Random(seed)
    estimator = ServiceTimeEstimator()
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    for i in range(330):
        slow = 3.0 if 200 <= i < 300 else 1.0
        n = rng.choice(sizes)
        ms = linear_ms(n) * slow * (10.0 if rng.random() < 0.3 else 1.0)
        estimator.update([BatchSample(0.0, n, n, ms / 1e3)], i + 1)
        if i in (229, 329):
            expected_ms = linear_ms(32) * (3.0 if i == 229 else 1.0)
            close = estimator.median_ms(32) == pytest.approx(expected_ms, rel=0.2)
            if estimator.level_changes != (1 if i == 229 else 2) or not close:
                return False
    return True


def test_a_slowdown_under_frequent_spikes_is_a_change_of_level() -> None:
    """8 suspects of 8 are not unlikely enough at 30 % of spikes, so such a slowdown was never
    confirmed; the CUSUM of the suspects confirms it, and its end. Over 30 seeds it is tracked
    in 16 (5 before lone stalls were held out and a change's ratio left the usual spikes out:
    a slowdown's level read 16.5x or 30x where it was 3x); the rest mostly go unconfirmed, as
    the slow batches widen the error bars until a 3x batch is no suspect."""
    assert sum(_slowdown_under_spikes_is_tracked(seed) for seed in range(30)) >= 12


def test_a_changes_ratio_leaves_out_the_suspects_the_usual_spikes_explain() -> None:
    """Two of four suspects slowed-down spikes (30x) at a usual rate of 30 %: one is left
    out, and the level is the 3x of the rest (their plain median read 16.5x)."""
    assert _change_ratio([3.0, 30.0, 3.0, 30.0], 1, 0.3) == pytest.approx(3.0)
    assert _change_ratio([0.3, 0.03, 0.3], -1, 0.4) == pytest.approx(0.3)
    assert _change_ratio([3.0, *[30.0] * 5], 1, 0.9) == pytest.approx(30.0)  # half at most


def test_spikes_in_a_cold_fit_are_held_out_once_its_error_bars_are_capped() -> None:
    """A warm-up's one batch per size and the first batches of each size, 30 % of them 10x:
    the fit lay between the two modes at the sizes seen once or twice, the ratios spread
    (the noise body's sigma read 0.8-1.3), the outlier bound drawn from it read 13-28x, and
    no spike was ever held out. Bounds drawn from at most ``JUDGE_SIGMA_MAX`` hold them out,
    and the fit finds the usual mode (within 1.6x at 4-32 after 600 batches, seeds 0-5;
    2.4x before)."""
    worst = 1.0
    for seed in range(6):
        rng = random.Random(seed)
        spiky = [(n, linear_ms(n) * (10.0 if rng.random() < 0.3 else 1.0)) for n in (1, 4, 16, 64)]
        estimator = ServiceTimeEstimator(seed=spiky)
        for i in range(600):
            n = rng.randint(1, 64) if i < 100 else rng.choice([2, 3, 4, 6, 8, 12, 16, 24, 32])
            ms = linear_ms(n) * (10.0 if rng.random() < 0.3 else 1.0)
            estimator.update([BatchSample(0.0, n, n, ms / 1e3)], i + 1)
        for n in (4, 8, 16, 32):
            ratio = estimator.median_ms(n) / linear_ms(n)
            worst = max(worst, ratio, 1.0 / ratio)
    assert worst <= 1.6
