"""Arrival processes: determinism, ordering, rates, burstiness, sizes, closed loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.sim import workloads
from adaptive_batcher.sim.workloads import (
    Arrivals,
    ClosedLoop,
    Diurnal,
    FixedSize,
    Gamma,
    LognormalSizes,
    MMPPBursts,
    Poisson,
    Steps,
    Workload,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


WORKLOADS: dict[str, Workload] = {
    "poisson": Poisson(500.0),
    "gamma": Gamma(500.0, 2.0),
    "mmpp": MMPPBursts(100.0, 2000.0, 0.2, 1.0),
    "diurnal": Diurnal(500.0, 0.8, 3.0),
    "steps": Steps((100.0, 0.0, 1500.0), 2.0),
    "sized": Poisson(300.0, sizes=LognormalSizes(40.0, 1.0, 512)),
}


def _check_well_formed(arrivals: Arrivals, duration_s: float) -> None:
    times, sizes = arrivals.times_s, arrivals.sizes
    assert times.dtype == np.float64 and sizes.dtype == np.int64
    assert times.shape == sizes.shape == (len(arrivals),)
    assert np.all(np.diff(times) >= 0)
    assert np.all((times >= 0) & (times < duration_s))
    assert np.all(sizes >= 1)
    assert arrivals.duration_s == duration_s


# --- Arrivals ----------------------------------------------------------------------------------


def test_arrivals_rate_len_and_units() -> None:
    arrivals = Arrivals(np.array([0.0, 0.5, 1.5]), np.array([1, 2, 3]), "x", duration_s=2.0)
    assert len(arrivals) == 3
    assert arrivals.rate_rps == 1.5
    assert arrivals.total_units == 6
    assert arrivals.name == "x"


def test_arrivals_duration_defaults_to_last_time() -> None:
    arrivals = Arrivals(np.array([0.0, 4.0]), np.array([1, 1]))
    assert arrivals.duration_s == 4.0
    assert arrivals.rate_rps == 0.5
    empty = Arrivals(np.zeros(0), np.zeros(0, dtype=np.int64))
    assert (len(empty), empty.duration_s, empty.rate_rps) == (0, 0.0, 0.0)
    assert Arrivals(np.array([0.0]), np.array([1])).rate_rps == math.inf


def test_arrivals_are_read_only() -> None:
    times = np.array([0.0, 1.0])
    arrivals = Arrivals(times, np.array([1, 1]))
    with pytest.raises(ValueError, match="read-only"):
        arrivals.times_s[0] = 3.0
    times[0] = 0.5  # the caller's array stays writable
    assert times[0] == 0.5


@pytest.mark.parametrize(
    ("times", "sizes", "duration", "message"),
    [
        ([0.0, 1.0], [1], math.nan, "must be 1-D of the same length"),
        ([1.0, 0.5], [1, 1], math.nan, r"times_s must be sorted \(non-decreasing\)"),
        ([-1.0, 0.5], [1, 1], math.nan, "times_s must be finite and >= 0"),
        ([0.0, math.inf], [1, 1], math.nan, "times_s must be finite and >= 0"),
        ([0.0, 1.0], [1, 0], math.nan, "sizes must be integers >= 1, got a minimum of 0"),
        ([0.0, 1.0], [1, 1.5], math.nan, "sizes must be integers >= 1"),
        ([0.0, 1.0], [1, 1], 0.5, r"duration_s must be finite and >= the last arrival \(1.0 s\)"),
    ],
)
def test_arrivals_validation(
    times: list[float], sizes: list[float], duration: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Arrivals(np.array(times), np.array(sizes), duration_s=duration)


# --- properties shared by every workload -------------------------------------------------------


@pytest.mark.parametrize("key", WORKLOADS)
def test_same_seed_same_arrays(key: str) -> None:
    workload = WORKLOADS[key]
    a = workload.generate(20.0, _rng(42))
    b = workload.generate(20.0, _rng(42))
    np.testing.assert_array_equal(a.times_s, b.times_s)
    np.testing.assert_array_equal(a.sizes, b.sizes)
    c = workload.generate(20.0, _rng(43))
    assert len(c) != len(a) or not np.array_equal(c.times_s, a.times_s)


@pytest.mark.parametrize("key", WORKLOADS)
def test_well_formed_and_named(key: str) -> None:
    workload = WORKLOADS[key]
    assert isinstance(workload, Workload)
    arrivals = workload.generate(20.0, _rng(1))
    assert len(arrivals) > 100
    _check_well_formed(arrivals, 20.0)
    assert arrivals.name == workload.name


@pytest.mark.parametrize("key", WORKLOADS)
def test_zero_duration_is_empty(key: str) -> None:
    arrivals = WORKLOADS[key].generate(0.0, _rng())
    assert len(arrivals) == 0 and arrivals.duration_s == 0.0


@pytest.mark.parametrize("key", WORKLOADS)
@pytest.mark.parametrize("duration", [-1.0, math.inf, math.nan])
def test_bad_duration(key: str, duration: float) -> None:
    with pytest.raises(ValueError, match="duration_s must be a finite number >= 0"):
        WORKLOADS[key].generate(duration, _rng())


_any_workload = st.one_of(
    st.builds(Poisson, st.floats(0.0, 5000.0)),
    st.builds(Gamma, st.floats(0.0, 5000.0), st.floats(0.05, 20.0)),
    st.builds(
        MMPPBursts,
        st.floats(0.0, 500.0),
        st.floats(0.0, 5000.0),
        st.floats(0.001, 5.0),
        st.floats(0.001, 5.0),
    ),
    st.builds(Diurnal, st.floats(0.0, 5000.0), st.floats(0.0, 1.0), st.floats(0.01, 100.0)),
    st.builds(
        Steps,
        st.lists(st.floats(0.0, 5000.0), min_size=1, max_size=6).map(tuple),
        st.floats(0.001, 5.0),
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    workload=_any_workload,
    duration=st.floats(0.0, 3.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_parameters_give_sorted_in_range_times(
    workload: Workload, duration: float, seed: int
) -> None:
    arrivals = workload.generate(duration, _rng(seed))
    _check_well_formed(arrivals, duration)


# --- rates and shapes ---------------------------------------------------------------------------


def test_poisson_rate_and_exponential_gaps() -> None:
    arrivals = Poisson(2000.0).generate(100.0, _rng(5))
    assert arrivals.rate_rps == pytest.approx(2000.0, rel=0.02)
    gaps = np.diff(arrivals.times_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)
    assert np.all(arrivals.sizes == 1)


def test_poisson_zero_rate_is_empty() -> None:
    assert len(Poisson(0.0).generate(10.0, _rng())) == 0


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_rate_and_cv(cv: float) -> None:
    arrivals = Gamma(1000.0, cv).generate(200.0, _rng(11))
    assert arrivals.rate_rps == pytest.approx(1000.0, rel=0.03)
    gaps = np.diff(arrivals.times_s)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_mmpp_time_average_rate_and_burstiness() -> None:
    workload = MMPPBursts(20.0, 200.0, mean_on_s=0.5, mean_off_s=2.0)
    assert workload.on_fraction == pytest.approx(0.2)
    assert workload.mean_rate_rps == pytest.approx(20.0 * 0.8 + 200.0 * 0.2)  # 56 req/s
    arrivals = workload.generate(20_000.0, _rng(3))
    assert arrivals.rate_rps == pytest.approx(workload.mean_rate_rps, rel=0.03)
    counts = np.bincount((arrivals.times_s / 0.5).astype(np.int64))
    assert counts.var() / counts.mean() > 5  # index of dispersion: 1 for Poisson


def test_mmpp_sojourns_match_generate_and_the_on_fraction() -> None:
    workload = MMPPBursts(0.0, 1000.0, mean_on_s=1.0, mean_off_s=3.0)
    starts, on = workload.sojourns(4000.0, _rng(9))
    assert starts[0] == 0.0 and np.all(np.diff(starts) > 0) and starts[-1] < 4000.0
    assert np.all(on[1:] != on[:-1])  # states alternate
    lengths = np.diff(np.append(starts, 4000.0))
    assert lengths[on > 0].sum() / 4000.0 == pytest.approx(0.25, rel=0.1)
    arrivals = workload.generate(4000.0, _rng(9))
    state_at = on[np.searchsorted(starts, arrivals.times_s, side="right") - 1]
    assert np.all(state_at == 1.0)  # base rate 0: every arrival falls in a burst


def test_many_short_segments_map_like_few(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = MMPPBursts(200.0, 2000.0, mean_on_s=0.05, mean_off_s=0.2)
    looped = workload.generate(100.0, _rng(5))
    assert len(workload.sojourns(100.0, _rng(5))[0]) > 500
    monkeypatch.setattr(workloads, "_LOOP_SEGMENTS", 0)  # force the np.repeat path
    repeated = workload.generate(100.0, _rng(5))
    np.testing.assert_array_equal(looped.times_s, repeated.times_s)
    _check_well_formed(repeated, 100.0)


def test_diurnal_peak_and_trough() -> None:
    workload = Diurnal(2000.0, 0.5, period_s=100.0)
    arrivals = workload.generate(1000.0, _rng(2))
    assert arrivals.rate_rps == pytest.approx(2000.0, rel=0.02)
    phase = arrivals.times_s % 100.0

    def expected(lo: float, hi: float) -> float:  # mean rate over the phase window [lo, hi)
        w = 2 * math.pi / 100.0
        mean_sin = (math.cos(w * lo) - math.cos(w * hi)) / (w * (hi - lo))
        return 2000.0 * (1 + 0.5 * mean_sin)

    peak = np.sum((phase >= 20) & (phase < 30)) / (10 * 10.0)
    trough = np.sum((phase >= 70) & (phase < 80)) / (10 * 10.0)
    assert peak == pytest.approx(expected(20, 30), rel=0.03)  # ~2984 req/s
    assert trough == pytest.approx(expected(70, 80), rel=0.05)  # ~1016 req/s
    assert workload.peak_rps == 3000.0
    assert workload.rate_at([25.0, 75.0]) == pytest.approx([3000.0, 1000.0])


def test_diurnal_phase_shift() -> None:
    workload = Diurnal(100.0, 1.0, period_s=40.0, phase_s=10.0)
    assert float(workload.rate_at(0.0)) == pytest.approx(200.0)  # starts at the peak


def test_steps_rate_per_segment() -> None:
    workload = Steps((1000.0, 3000.0, 0.0, 500.0), step_s=50.0)
    arrivals = workload.generate(250.0, _rng(8))
    edges = [0.0, 50.0, 100.0, 150.0, 250.0]  # the last rate holds to the end
    counts = np.histogram(arrivals.times_s, bins=edges)[0]
    rates = counts / np.diff(edges)
    assert rates[0] == pytest.approx(1000.0, rel=0.03)
    assert rates[1] == pytest.approx(3000.0, rel=0.03)
    assert rates[2] == 0.0
    assert rates[3] == pytest.approx(500.0, rel=0.05)
    assert [workload.rate_at(t) for t in (0.0, 49.9, 50.0, 120.0, 1e6)] == [
        1000.0,
        1000.0,
        3000.0,
        0.0,
        500.0,
    ]


def test_names() -> None:
    assert Poisson(1000).name == "poisson(1000 rps)"
    assert Gamma(10, 2.5).name == "gamma(10 rps, cv=2.5)"
    assert MMPPBursts(1, 2, 3, 4).name == "mmpp(1/2 rps, on 3 s/off 4 s)"
    assert Diurnal(5, 0.5, 60).name == "diurnal(5 rps +-0.5, period 60 s)"
    assert Steps((1000, 3000), 60).name == "steps(1000/3000 rps every 60 s)"


def test_names_show_any_number_type_as_the_float_it_was_checked_as() -> None:
    """Before: a Fraction (accepted: it is a real number) made ``name`` raise TypeError on
    Python 3.11 (``format(Fraction(1, 2), "g")``), and the field kept the Fraction."""
    half = Fraction(1, 2)
    built = [
        (Poisson(half), "poisson(0.5 rps)"),
        (Gamma(half, half), "gamma(0.5 rps, cv=0.5)"),
        (MMPPBursts(half, half, half, half), "mmpp(0.5/0.5 rps, on 0.5 s/off 0.5 s)"),
        (Diurnal(half, half, half, phase_s=half), "diurnal(0.5 rps +-0.5, period 0.5 s)"),
        (Steps((half,), half), "steps(0.5 rps every 0.5 s)"),
        (ClosedLoop(1, half, duration_s=half), "closed(1 clients, think 0.5 s)"),
        (Poisson(np.float32(0.1)), "poisson(0.1 rps)"),
    ]
    for workload, name in built:
        assert workload.name == name
        assert "Fraction" not in repr(workload) and "float32" not in repr(workload)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Poisson(-1.0), "rate_rps must be a finite number >= 0"),
        (lambda: Poisson(math.nan), "rate_rps must be a finite number >= 0"),
        (lambda: Gamma(10.0, 0.0), "cv must be a finite number > 0"),
        (lambda: Gamma(10.0, 1e3), r"cv must be in \[0.001, 100\], got 1000.0"),
        (lambda: Gamma(10.0, 1e-300), r"cv must be in \[0.001, 100\], got 1e-300"),
        (lambda: MMPPBursts(1.0, 2.0, 0.0, 1.0), "mean_on_s must be a finite number > 0"),
        (lambda: MMPPBursts(1.0, -2.0, 1.0, 1.0), "burst_rps must be a finite number >= 0"),
        (lambda: Diurnal(10.0, 1.5, 60.0), r"amplitude must be in \[0, 1\]"),
        (lambda: Diurnal(10.0, 0.5, 0.0), "period_s must be a finite number > 0"),
        (lambda: Steps((), 1.0), "rates_rps must hold at least one rate"),
        (lambda: Steps((1.0, -1.0), 1.0), r"rates_rps\[1\] must be a finite number >= 0"),
        (lambda: Steps((1.0,), 0.0), "step_s must be a finite number > 0"),
    ],
)
def test_parameter_validation(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_an_hour_at_thousands_per_second_is_fast() -> None:
    # 10 minutes at 5000 req/s (3 M arrivals) takes ~0.1 s; the bound leaves room for slow CI.
    start = time.perf_counter()
    arrivals = Poisson(5000.0).generate(600.0, _rng())
    elapsed = time.perf_counter() - start
    assert len(arrivals) == pytest.approx(3_000_000, rel=0.01)
    assert elapsed < 1.5


# --- sizes ------------------------------------------------------------------------------------


def test_fixed_size() -> None:
    arrivals = Poisson(100.0, sizes=FixedSize(4)).generate(10.0, _rng())
    assert np.all(arrivals.sizes == 4) and arrivals.total_units == 4 * len(arrivals)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        FixedSize(0)


def test_lognormal_sizes_median_and_clipping() -> None:
    sampler = LognormalSizes(200.0, 1.0, max_units=1000)
    sizes = np.asarray(sampler(50_000, _rng(4)))
    assert sizes.dtype == np.int64
    assert np.median(sizes) == pytest.approx(200.0, rel=0.03)
    assert sizes.min() >= 1 and sizes.max() == 1000
    tiny = np.asarray(LognormalSizes(0.2, 0.1, 10)(100, _rng()))
    assert np.all(tiny == 1)
    assert sampler == LognormalSizes(200.0, 1.0, 1000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.0, 1.0, 10), "median must be finite and > 0"),
        ((1.0, -1.0, 10), "sigma must be finite and >= 0"),
        ((1.0, 1.0, 0), "max_units must be an integer >= 1"),
        ((1.0, 1.0, 2.5), "max_units must be an integer >= 1"),
    ],
)
def test_lognormal_validation(args: tuple[float, float, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LognormalSizes(*args)  # type: ignore[arg-type]


def test_sizes_drawn_after_times() -> None:
    plain = Poisson(100.0).generate(5.0, _rng(6))
    sized = Poisson(100.0, sizes=LognormalSizes(8.0, 0.5, 64)).generate(5.0, _rng(6))
    np.testing.assert_array_equal(plain.times_s, sized.times_s)


def test_bad_sampler_output() -> None:
    def wrong_shape(n: int, rng: np.random.Generator) -> np.ndarray:
        return np.ones(n + 1, dtype=np.int64)

    def zeros(n: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(n, dtype=np.int64)

    with pytest.raises(ValueError, match=r"must have shape"):
        Poisson(100.0, sizes=wrong_shape).generate(1.0, _rng())
    with pytest.raises(ValueError, match=r"must be integers >= 1, got a minimum of 0"):
        Poisson(100.0, sizes=zeros).generate(1.0, _rng())


# --- closed loop --------------------------------------------------------------------------------


def test_closed_loop_first_arrivals() -> None:
    loop = ClosedLoop(clients=2000, think_s=0.05, duration_s=1.0)
    first = loop.first_arrivals(_rng(1))
    assert first.shape == (2000,) and first.dtype == np.float64
    assert np.all(np.diff(first) >= 0) and first[0] >= 0
    assert first.mean() == pytest.approx(0.05, rel=0.1)
    np.testing.assert_array_equal(first, loop.first_arrivals(_rng(1)))


def test_closed_loop_next_arrival() -> None:
    loop = ClosedLoop(clients=4, think_s=0.02, duration_s=1.0)
    rng = _rng(2)
    waits = np.array([loop.next_arrival(10.0, rng) - 10.0 for _ in range(20_000)])
    assert np.all(waits >= 0)
    assert waits.mean() == pytest.approx(0.02, rel=0.03)
    assert loop.next_arrival(3.5, _rng(9)) == loop.next_arrival(3.5, _rng(9))


def test_closed_loop_without_think_time() -> None:
    loop = ClosedLoop(clients=1, think_s=0.0, duration_s=1.0)
    rng = _rng(3)
    np.testing.assert_array_equal(loop.first_arrivals(rng), [0.0])
    assert loop.next_arrival(1.25, rng) == 1.25
    assert rng.random() == _rng(3).random()  # nothing drawn
    assert loop.name == "closed(1 clients, think 0 s)"


def test_closed_loop_sizes_and_validation() -> None:
    loop = ClosedLoop(3, 0.01, sizes=FixedSize(7), duration_s=1.0)
    np.testing.assert_array_equal(loop.sample_sizes(3, _rng()), [7, 7, 7])
    np.testing.assert_array_equal(
        ClosedLoop(3, 0.01, duration_s=1.0).sample_sizes(2, _rng()), [1, 1]
    )
    with pytest.raises(ValueError, match="clients must be an integer >= 1"):
        ClosedLoop(0, 0.01, duration_s=1.0)
    with pytest.raises(ValueError, match="think_s must be finite and >= 0"):
        ClosedLoop(1, -0.01, duration_s=1.0)
    with pytest.raises(ValueError, match=r"duration_s must be a finite number >= 0, got -1"):
        ClosedLoop(1, 0.01, duration_s=-1)
    with pytest.raises(ValueError, match="duration_s must be a finite number >= 0, got inf"):
        ClosedLoop(1, 0.01, duration_s=math.inf)
    with pytest.raises(TypeError, match="duration_s"):
        ClosedLoop(1, 0.01, duration_s="10")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="duration_s"):
        ClosedLoop(1, 0.01)  # type: ignore[call-arg]  # a closed loop needs an end
    assert ClosedLoop(2, 0.0, duration_s=3).duration_s == 3.0


@pytest.mark.parametrize("rng", [0, None, 1.5])
def test_a_seed_given_for_the_generator_is_refused_with_its_name(rng: object) -> None:
    """Before: AttributeError ('int' object has no attribute 'standard_exponential')."""
    with pytest.raises(TypeError, match="rng must be a numpy Generator"):
        Poisson(100.0).generate(1.0, rng)  # type: ignore[arg-type]


def test_arrivals_need_a_string_name() -> None:
    """As SimConfig.name (None was accepted and printed as the name of a replay)."""
    with pytest.raises(TypeError, match=r"Arrivals\.name"):
        Arrivals(np.zeros(1), np.ones(1, dtype=np.int64), None)  # type: ignore[arg-type]
