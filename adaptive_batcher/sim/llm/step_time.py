"""How long one continuous-batching step takes: a roofline model and closed-form fits.

A step (one iteration of the engine) runs the decodes of the running sequences and chunks of
prefill together. A :class:`StepTimeModel` turns four sums describing the step into seconds:

* ``decodes``: sequences decoding one token;
* ``decode_context``: tokens those decodes attend to (their KV read);
* ``prefill_tokens``: prompt tokens computed in the step (chunked prefill);
* ``prefill_attention``: ``sum(q * (c + q / 2))`` over the prefill chunks, ``q`` tokens after
  ``c`` already computed: the attention work, which is ``len**2 / 2`` for a whole prompt.

Two models:

* :class:`Roofline`: weights and KV bytes over memory bandwidth, or FLOPs over peak compute,
  whichever is longer, each at an efficiency, plus a fixed overhead per step; with the
  :data:`H200` and :data:`LLAMA_3_1_8B` presets (Williams et al., "Roofline", CACM 2009).
* :class:`ClosedFormFit`: DistServe's simulator form (LLMServe/DistServe,
  ``simdistserve/estimators/time_estimator.py``, Apache-2.0): prefill ``a + b * tokens + c *
  sum(len**2)``, decode ``a + b * context + c * batch``, in ms, with the published A100
  coefficient sets and one set we fitted to splitwise-sim's H100 measurements (MIT); see
  :data:`FITS`.

:class:`Deployment` pairs a model with the KV-cache capacity of the device it runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Protocol, runtime_checkable

from adaptive_batcher._validate import check_in_range, check_int, check_number, check_str

__all__ = [
    "A100_80GB",
    "FITS",
    "H100",
    "H200",
    "LLAMA_2_70B",
    "LLAMA_3_1_8B",
    "LLAMA_3_1_70B_FP8",
    "OPT_13B",
    "ClosedFormFit",
    "Deployment",
    "Hardware",
    "ModelSpec",
    "Roofline",
    "StepTimeModel",
    "h200_llama_8b",
    "kv_capacity_tokens",
]


@runtime_checkable
class StepTimeModel(Protocol):
    """Seconds one engine step takes, from the step's four sums (see the module docstring)."""

    def step_s(
        self,
        decodes: int,
        decode_context: float,
        prefill_tokens: float,
        prefill_attention: float,
    ) -> float: ...


@dataclass(frozen=True)
class Hardware:
    """An accelerator's limits.

    Attributes:
        name: label.
        memory_bytes: device memory, bytes (> 0).
        bandwidth_bytes_s: memory bandwidth, bytes/s (> 0).
        peak_flops: dense peak of the model's data type, FLOP/s (> 0).
    """

    name: str
    memory_bytes: float
    bandwidth_bytes_s: float
    peak_flops: float

    def __post_init__(self) -> None:
        check_str("Hardware.name", self.name)
        for field in ("memory_bytes", "bandwidth_bytes_s", "peak_flops"):
            value = check_number(f"Hardware.{field}", getattr(self, field), 0.0, strict=True)
            object.__setattr__(self, field, value)


H200: Final = Hardware("H200 SXM", 141e9, 4.8e12, 989e12)
"""NVIDIA H200 SXM: 141 GB HBM3e at 4.8 TB/s, ~989 TFLOP/s dense bf16 (NVIDIA's datasheet)."""
H100: Final = Hardware("H100 SXM", 80e9, 3.35e12, 989e12)
"""NVIDIA H100 SXM: 80 GB HBM3 at 3.35 TB/s, ~989 TFLOP/s dense bf16 (NVIDIA's datasheet)."""
A100_80GB: Final = Hardware("A100 80GB", 80e9, 2.0e12, 312e12)
"""NVIDIA A100 80 GB SXM: 2.0 TB/s, 312 TFLOP/s dense bf16 (NVIDIA's datasheet)."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only model's size.

    Attributes:
        name: label.
        params: parameters (> 0).
        bytes_per_param: weight bytes per parameter (2 for bf16, 1 for fp8).
        layers: transformer layers (>= 1).
        hidden: model width ``d_model`` (>= 1), for the attention FLOPs.
        kv_bytes_per_token: KV-cache bytes per token, all layers (> 0):
            ``2 * layers * kv_heads * head_dim * bytes``.
    """

    name: str
    params: float
    bytes_per_param: float
    layers: int
    hidden: int
    kv_bytes_per_token: float

    def __post_init__(self) -> None:
        check_str("ModelSpec.name", self.name)
        for field in ("params", "bytes_per_param", "kv_bytes_per_token"):
            value = check_number(f"ModelSpec.{field}", getattr(self, field), 0.0, strict=True)
            object.__setattr__(self, field, value)
        object.__setattr__(self, "layers", check_int("ModelSpec.layers", self.layers, 1))
        object.__setattr__(self, "hidden", check_int("ModelSpec.hidden", self.hidden, 1))

    @property
    def weight_bytes(self) -> float:
        """``params * bytes_per_param``."""
        return self.params * self.bytes_per_param


LLAMA_3_1_8B: Final = ModelSpec("Llama-3.1-8B bf16", 8.03e9, 2.0, 32, 4096, 131072.0)
"""Llama-3.1-8B in bf16: 16.1 GB of weights; 32 layers x 8 KV heads x 128 x 2 x 2 bytes =
128 KiB of KV per token (Meta's model card and config)."""
LLAMA_3_1_70B_FP8: Final = ModelSpec("Llama-3.1-70B fp8", 70.6e9, 1.0, 80, 8192, 327680.0)
"""Llama-3.1-70B in fp8 weights, bf16 KV: 70.6 GB; 80 x 8 x 128 x 2 x 2 = 320 KiB per token."""
LLAMA_2_70B: Final = ModelSpec("Llama-2-70B bf16", 69e9, 2.0, 80, 8192, 327680.0)
"""Llama-2-70B in bf16 (splitwise-sim's measured model); GQA with 8 KV heads: 320 KiB/token."""
OPT_13B: Final = ModelSpec("OPT-13B fp16", 12.9e9, 2.0, 40, 5120, 819200.0)
"""OPT-13B in fp16 (DistServe's profiled model); 40 layers x 5120 x 2 x 2 = 800 KiB/token."""


def kv_capacity_tokens(
    model: ModelSpec,
    hardware: Hardware,
    *,
    gpus: int = 1,
    memory_utilization: float = 0.9,
    reserve_bytes: float = 2e9,
) -> int:
    """KV-cache tokens a vLLM-style engine gets: ``gpus * memory * memory_utilization`` minus
    the weights and ``reserve_bytes`` per GPU (activations, CUDA graphs), over the KV bytes per
    token (vLLM's ``gpu_memory_utilization`` default is 0.9).

    Raises:
        ValueError: an argument out of range, or no memory left for the cache.
    """
    check_int("gpus", gpus, 1)
    check_in_range("memory_utilization", memory_utilization, 0.0, 1.0, open_low=True)
    check_number("reserve_bytes", reserve_bytes, 0.0)
    free = gpus * (hardware.memory_bytes * memory_utilization - reserve_bytes) - model.weight_bytes
    if free <= model.kv_bytes_per_token:
        raise ValueError(
            f"{model.name} on {gpus} x {hardware.name} leaves no memory for the KV cache "
            f"({free / 1e9:.1f} GB)"
        )
    return int(free // model.kv_bytes_per_token)


@dataclass(frozen=True)
class Roofline:
    """Step time as the slower of memory and compute, at efficiency factors.

    ``bytes = weights + kv_bytes_per_token * (decode_context + prefill context read +
    tokens written)``; ``flops = 2 * params * tokens + 4 * layers * hidden * attention``
    (attention: ``decode_context + prefill_attention``); ``step = step_overhead_s +
    max(bytes / (bandwidth * bandwidth_efficiency), flops / (peak * compute_efficiency))``.

    Attributes:
        model, hardware: what runs where.
        gpus: tensor-parallel GPUs (>= 1): bandwidth and peak add up, the weights split.
        bandwidth_efficiency: share of the bandwidth reached, in (0, 1] (0.7: real engines
            reach about 60-80 % of the bandwidth floor).
        compute_efficiency: share of the peak reached by prefill, in (0, 1] (0.6, assumed).
        step_overhead_s: fixed time per step, seconds (scheduling, launches; 1.5 ms assumed).
    """

    model: ModelSpec
    hardware: Hardware
    gpus: int = 1
    bandwidth_efficiency: float = 0.7
    compute_efficiency: float = 0.6
    step_overhead_s: float = 0.0015

    def __post_init__(self) -> None:
        check_int("Roofline.gpus", self.gpus, 1)
        for field in ("bandwidth_efficiency", "compute_efficiency"):
            check_in_range(f"Roofline.{field}", getattr(self, field), 0.0, 1.0, open_low=True)
        check_number("Roofline.step_overhead_s", self.step_overhead_s, 0.0)

    def step_s(
        self,
        decodes: int,
        decode_context: float,
        prefill_tokens: float,
        prefill_attention: float,
    ) -> float:
        """One step's seconds (see the class docstring)."""
        model = self.model
        tokens = decodes + prefill_tokens
        if tokens <= 0:
            return 0.0
        # prefill reads the KV of its chunk's earlier context: attention work over its length
        prefill_read = prefill_attention / prefill_tokens if prefill_tokens > 0 else 0.0
        kv_tokens = decode_context + prefill_read + tokens
        memory_s = (model.weight_bytes + model.kv_bytes_per_token * kv_tokens) / (
            self.hardware.bandwidth_bytes_s * self.gpus * self.bandwidth_efficiency
        )
        flops = 2.0 * model.params * tokens + 4.0 * model.layers * model.hidden * (
            decode_context + prefill_attention
        )
        compute_s = flops / (self.hardware.peak_flops * self.gpus * self.compute_efficiency)
        return self.step_overhead_s + max(memory_s, compute_s)


@dataclass(frozen=True)
class ClosedFormFit:
    """DistServe's closed form, milliseconds: prefill ``a + b * tokens + c * sum(len**2)``,
    decode ``a + b * context + c * batch`` (a second decode set from ``large_batch_from``
    sequences on, as DistServe keeps).

    A mixed step (decodes and prefill chunks together, vLLM's chunked prefill) costs one
    intercept, the larger of the two, plus both variable terms; a chunk of ``q`` tokens after
    ``c`` computed ones counts ``q**2 + 2 * q * c`` for ``len**2`` (its attention work; a whole
    prompt gives ``len**2``). That combination is ours, not DistServe's (whose simulator never
    mixes the two phases).

    Attributes:
        name: label.
        prefill_ms: ``(a, b, c)``: ms, ms per token, ms per token squared.
        decode_ms: ``(a, b, c)``: ms, ms per context token, ms per sequence.
        decode_large_ms: the set used from ``large_batch_from`` sequences on (None: one set).
        large_batch_from: the batch size the large set starts at (>= 1).
        source: where the coefficients come from.
    """

    name: str
    prefill_ms: tuple[float, float, float]
    decode_ms: tuple[float, float, float]
    decode_large_ms: tuple[float, float, float] | None = None
    large_batch_from: int = 1 << 30
    source: str = ""

    def __post_init__(self) -> None:
        check_str("ClosedFormFit.name", self.name)
        check_int("ClosedFormFit.large_batch_from", self.large_batch_from, 1)
        sets = [("prefill_ms", self.prefill_ms), ("decode_ms", self.decode_ms)]
        if self.decode_large_ms is not None:
            sets.append(("decode_large_ms", self.decode_large_ms))
        for name, values in sets:
            if len(values) != 3:
                raise ValueError(f"ClosedFormFit.{name} must hold 3 numbers, got {values!r}")
            check_number(f"ClosedFormFit.{name}[0]", values[0], 0.0)

    def step_s(
        self,
        decodes: int,
        decode_context: float,
        prefill_tokens: float,
        prefill_attention: float,
    ) -> float:
        """One step's seconds (see the class docstring)."""
        ms = 0.0
        intercept = 0.0
        if prefill_tokens > 0:
            a, b, c = self.prefill_ms
            intercept = a
            ms += b * prefill_tokens + c * 2.0 * prefill_attention
        if decodes > 0:
            large = self.decode_large_ms is not None and decodes >= self.large_batch_from
            a, b, c = self.decode_large_ms if large and self.decode_large_ms else self.decode_ms
            intercept = max(intercept, a)
            ms += b * decode_context + c * decodes
        return max(intercept + ms, 0.0) / 1e3


_DISTSERVE = (
    "LLMServe/DistServe, simdistserve/estimators/profile_data/{file} (commit {commit}), "
    "facebook/opt-13b, tensor parallel 1, one A100 80 GB; Apache-2.0"
)
_SPLITWISE = (
    "fitted by us (least squares on relative error) to Mutinifni/splitwise-sim data/perf_model.csv "
    "(commit 3780880), llama2-70b on h100-80gb, tensor parallel 4: prompt_time of prompts 128-8192 "
    "at batch 1 and of 512-token prompts at batch 2-64, token_time at batch 1-64; MIT"
)

FITS: Final[Mapping[str, ClosedFormFit]] = MappingProxyType(
    {
        "distserve_opt13b_a100_vllm": ClosedFormFit(
            "OPT-13B on A100 (vLLM), DistServe",
            prefill_ms=(23.62736227, 0.15054561, 8.65348374e-06),
            decode_ms=(19.562534173678987, 0.0004941120550644942, 0.05060571771697455),
            decode_large_ms=(16.8386301447433, 0.00043897725301957885, 0.14000261546561776),
            large_batch_from=95,
            source=_DISTSERVE.format(file="profiler-a100-80g.vllm.json", commit="0bba606"),
        ),
        "distserve_opt13b_a100": ClosedFormFit(
            "OPT-13B on A100 (DistServe engine), DistServe",
            prefill_ms=(16.456860431694288, 0.09264750660897617, 6.474785740229194e-06),
            decode_ms=(19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
            decode_large_ms=(7.1661889468253595, 0.0005798000403396046, 0.15831096191764046),
            large_batch_from=95,
            source=_DISTSERVE.format(file="profiler-a100-80g.distserve.json", commit="7057aef"),
        ),
        "splitwise_llama2_70b_h100_tp4": ClosedFormFit(
            "Llama-2-70B on 4 x H100, fitted to splitwise-sim",
            prefill_ms=(25.98, 0.08947, 2.640e-06),
            decode_ms=(28.70, 9.764e-05, 0.2803),
            source=_SPLITWISE,
        ),
    }
)
"""Closed-form coefficient sets by name, each with its ``source``: DistServe's published A100
profiles of OPT-13B (vLLM and DistServe's own engine), and our fit of splitwise-sim's
Llama-2-70B measurements on four H100s (prefill within 24 % of every row used, decode within
3 %)."""


@dataclass(frozen=True)
class Deployment:
    """A step-time model and the KV cache of the device it runs on.

    Attributes:
        name: label.
        step: the step-time model.
        kv_capacity_tokens: KV-cache tokens the engine has (>= 1).
    """

    name: str
    step: StepTimeModel
    kv_capacity_tokens: int

    def __post_init__(self) -> None:
        check_str("Deployment.name", self.name)
        if not isinstance(self.step, StepTimeModel):
            raise TypeError(f"Deployment.step must have step_s, got {type(self.step).__name__}")
        check_int("Deployment.kv_capacity_tokens", self.kv_capacity_tokens, 1)

    def decode_limit_tokens_s(self, context_tokens: float, max_num_seqs: int) -> float:
        """The most decode tokens per second the device gives sequences of ``context_tokens``:
        the largest batch that fits (``max_num_seqs``, or the KV cache) over its decode step."""
        batch = max(1, min(max_num_seqs, int(self.kv_capacity_tokens // max(context_tokens, 1))))
        return batch / self.step.step_s(batch, batch * context_tokens, 0.0, 0.0)


def h200_llama_8b() -> Deployment:
    """Llama-3.1-8B bf16 on one H200 by the :class:`Roofline` (about 820 k KV tokens)."""
    model = Roofline(LLAMA_3_1_8B, H200)
    return Deployment(
        "Llama-3.1-8B on H200 (roofline)", model, kv_capacity_tokens(LLAMA_3_1_8B, H200)
    )
