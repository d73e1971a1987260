"""Step-time models: the roofline's figures on the H200 preset, and the closed-form fits."""

from __future__ import annotations

import pytest

from adaptive_batcher.sim.llm.step_time import (
    A100_80GB,
    FITS,
    H200,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B_FP8,
    OPT_13B,
    ClosedFormFit,
    Deployment,
    Roofline,
    StepTimeModel,
    h200_llama_8b,
    kv_capacity_tokens,
)


def test_the_h200_roofline_matches_the_bandwidth_floors() -> None:
    ideal = Roofline(LLAMA_3_1_8B, H200, bandwidth_efficiency=1.0, step_overhead_s=0.0)
    # one decode: the weights (16.1 GB) over 4.8 TB/s = 3.35 ms
    assert ideal.step_s(1, 0, 0, 0) == pytest.approx(16.06e9 / 4.8e12, rel=0.01)
    # 64 sequences of 1.37 k context add their KV read: about 5.7 ms a step
    assert ideal.step_s(64, 64 * 1370, 0, 0) == pytest.approx(5.7e-3, rel=0.03)
    big = Roofline(LLAMA_3_1_70B_FP8, H200, bandwidth_efficiency=1.0, step_overhead_s=0.0)
    assert big.step_s(1, 0, 0, 0) == pytest.approx(14.7e-3, rel=0.01)


def test_prefill_is_compute_bound_at_the_efficiency() -> None:
    model = Roofline(LLAMA_3_1_8B, H200)  # 60 % of 989 TFLOP/s, 1.5 ms overhead
    tokens = 8192
    flops = 2 * 8.03e9 * tokens + 4 * 32 * 4096 * tokens * tokens / 2
    assert model.step_s(0, 0, tokens, tokens * tokens / 2) == pytest.approx(
        0.0015 + flops / (0.6 * 989e12)
    )
    assert model.step_s(0, 0, 0, 0) == 0.0
    two = Roofline(LLAMA_3_1_8B, H200, gpus=2)
    assert two.step_s(0, 0, tokens, tokens * tokens / 2) < model.step_s(0, 0, tokens, tokens**2 / 2)


def test_kv_capacity_is_the_memory_left_by_the_weights() -> None:
    assert kv_capacity_tokens(LLAMA_3_1_8B, H200) == int((141e9 * 0.9 - 2e9 - 16.06e9) // 131072)
    assert h200_llama_8b().kv_capacity_tokens == kv_capacity_tokens(LLAMA_3_1_8B, H200)
    with pytest.raises(ValueError, match=r"leaves no memory for the KV cache"):
        kv_capacity_tokens(LLAMA_3_1_70B_FP8, A100_80GB)
    assert kv_capacity_tokens(OPT_13B, A100_80GB) > 40_000


def test_distserve_form_prefill_and_decode() -> None:
    fit = ClosedFormFit("t", prefill_ms=(20.0, 0.1, 1e-5), decode_ms=(10.0, 0.001, 0.05))
    # a whole prompt of 1000 tokens: a + b * 1000 + c * 1000**2
    assert fit.step_s(0, 0, 1000, 1000 * 1000 / 2) == pytest.approx((20 + 100 + 10) / 1e3)
    assert fit.step_s(8, 8000, 0, 0) == pytest.approx((10 + 8 + 0.4) / 1e3)
    mixed = fit.step_s(8, 8000, 1000, 1000 * 1000 / 2)  # one intercept, the larger
    assert mixed == pytest.approx((20 + 100 + 10 + 8 + 0.4) / 1e3)


def test_the_published_sets_carry_their_source() -> None:
    vllm = FITS["distserve_opt13b_a100_vllm"]
    assert vllm.prefill_ms[0] == pytest.approx(23.63, abs=0.01) and "Apache-2.0" in vllm.source
    assert vllm.large_batch_from == 95
    small = vllm.step_s(94, 94 * 500, 0, 0)
    large = vllm.step_s(95, 95 * 500, 0, 0)
    assert large > small  # the large-batch set from 95 sequences on
    assert "MIT" in FITS["splitwise_llama2_70b_h100_tp4"].source
    for fit in FITS.values():
        assert isinstance(fit, StepTimeModel) and fit.step_s(1, 100, 0, 0) > 0


def test_the_decode_limit_is_the_largest_batch_that_fits() -> None:
    deployment = Deployment("d", ClosedFormFit("t", (1.0, 0.0, 0.0), (10.0, 0.0, 0.0)), 10_000)
    # 1000-token sequences: 10 fit; each step 10 ms -> 1000 tokens/s
    assert deployment.decode_limit_tokens_s(1000, 256) == pytest.approx(1000.0)
    assert deployment.decode_limit_tokens_s(1000, 4) == pytest.approx(400.0)
    with pytest.raises(TypeError, match=r"^Deployment.step must have step_s, got int$"):
        Deployment("d", 3, 10)  # type: ignore[arg-type]


def test_bad_settings_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"^Roofline.bandwidth_efficiency must be a number in \(0, 1\], got 0$"
    ):
        Roofline(LLAMA_3_1_8B, H200, bandwidth_efficiency=0)
    with pytest.raises(
        ValueError, match=r"^ClosedFormFit.decode_ms must hold 3 numbers, got \(1.0, 2.0\)$"
    ):
        ClosedFormFit("t", (1.0, 0.0, 0.0), (1.0, 2.0))  # type: ignore[arg-type]
