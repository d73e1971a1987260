"""The controller's estimators: the step-time fit, the TTFT fit, the smoothed means."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive_batcher.llm.estimators import DecayedMean, Ewma, StepTimeEstimator, TTFTFit


def test_the_step_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(1)
    estimator = StepTimeEstimator(window=512, min_samples=50)
    for _ in range(600):
        sequences = int(rng.integers(1, 200))
        context = sequences * float(rng.uniform(500, 1500))
        prefill = float(rng.uniform(0, 4000))
        gap = 0.006 + 0.0001 * sequences + 0.00004 * context / 1e3 + 0.025 * prefill / 1e3
        estimator.add(gap, sequences, context, prefill)
    fit = estimator.fit()
    assert fit is not None and fit.samples == 512
    assert fit.base_s == pytest.approx(0.006, rel=1e-6)
    assert fit.per_seq_s == pytest.approx(0.0001, rel=1e-6)
    assert fit.per_ktoken_s == pytest.approx(0.00004, rel=1e-5)
    assert fit.per_prefill_ktoken_s == pytest.approx(0.025, rel=1e-6)
    assert fit.step_s(10, 10_000, 1000) == pytest.approx(0.006 + 0.001 + 0.0004 + 0.025)
    assert estimator.fit() is fit  # cached until the next sample


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted() -> None:
    rng = np.random.default_rng(2)
    estimator = StepTimeEstimator(window=256, min_samples=8)
    for _ in range(200):
        sequences = int(rng.integers(1, 100))
        context = float(rng.uniform(0, 100_000))
        # the step shrinks with the context: no physical reading, so the context term goes
        gap = 0.05 + 0.001 * sequences - 0.0000001 * context
        estimator.add(gap, sequences, context, 0.0)
    fit = estimator.fit()
    assert fit is not None and fit.per_ktoken_s == 0.0 and fit.per_prefill_ktoken_s == 0.0
    assert fit.per_seq_s == pytest.approx(0.001, rel=0.05)


def test_collinear_features_still_fit() -> None:
    estimator = StepTimeEstimator(window=64, min_samples=8)
    for sequences in range(1, 41):  # context in proportion, no prefill
        estimator.add(0.01 + 0.0009 * sequences, sequences, sequences * 1000, 0)
    fit = estimator.fit()
    assert fit is not None
    assert fit.step_s(20, 20_000, 0) == pytest.approx(0.01 + 0.0009 * 20)


def test_no_fit_without_samples_or_without_spread_in_the_sequences() -> None:
    estimator = StepTimeEstimator(window=64, min_samples=8)
    for _ in range(7):
        estimator.add(0.01, 5, 5000, 0)
    assert estimator.fit() is None  # too few
    estimator.add(0.01, 5, 5000, 0)
    assert estimator.samples == 8 and estimator.fit() is None  # never varied


def test_the_ttft_fit_counts_steps_of_the_gap_after_the_prefill() -> None:
    fit = TTFTFit(window=64, min_samples=10)
    assert fit.fit(1e-5) is None
    for i in range(40):
        gap = 0.01 + 0.001 * i
        fit.add(2.0 * gap + 1e-5 * 3000, gap, 3000)
    result = fit.fit(1e-5)
    assert result is not None
    steps, per_token, residual = result
    assert steps == pytest.approx(2.0) and per_token == 1e-5 and abs(residual) < 1e-12


def test_means() -> None:
    ewma = Ewma(1.0)
    assert math.isnan(ewma.value)
    assert ewma.update(10.0, 0.0) == 10.0
    assert ewma.update(0.0, 1.0) == pytest.approx(10.0 * math.exp(-1.0))
    mean = DecayedMean(1.0)
    assert math.isnan(mean.value)
    mean.add(1.0, 3.0, 0.0)
    mean.add(3.0, 1.0, 0.0)
    assert mean.value == pytest.approx(1.5)  # weighted by the streams
    mean.add(3.0, 3.0, 100.0)  # the old samples have faded
    assert mean.value == pytest.approx(3.0)
    with pytest.raises(ValueError, match=r"^tau_s must be a finite number > 0, got 0$"):
        Ewma(0)
