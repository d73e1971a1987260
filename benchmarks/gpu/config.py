"""The sizes and durations of one run: the full H200 run, and the tiny one of ``--quick``.

The full run is budgeted to end within 7 minutes on an H200. Estimated (not yet measured on
one): 10-15 s to import torch and start CUDA, 8 s of telemetry, 12 serving runs of 15 s each
with their warm-ups and drains (about 200 s), a 25-30 s memory squeeze, then the decoder grid
in at most 90 s: about 5-6 minutes. Each phase checks ``budget_s`` before it starts, and the
long ones stop early, and say so, when it runs out.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "PHASES", "QUICK", "RunConfig"]

PHASES: tuple[str, ...] = ("environment", "telemetry", "serving", "squeeze", "llm")
"""The phases, in the order they run."""

GIB = 2**30


@dataclass(frozen=True)
class RunConfig:
    """Everything a run's size depends on (times in seconds, rates in requests per second).

    Attributes:
        budget_s: the whole run's wall-clock budget; a phase that would start past it is
            skipped, and the long phases stop early to stay inside it.
        image_size: resnet input height and width, pixels.
        resnet_layers: residual blocks per stage (ResNet-50: 3, 4, 6, 3).
        resnet_width: channels of the stem (ResNet-50: 64).
        prefer_torchvision: use ``torchvision.models.resnet50`` when the shape is ResNet-50's
            and torchvision imports.
        channels_last: run the convolutions in the channels-last memory format.
        buckets: the batch sizes warmed and padded to; the largest is the cap.
        naive_cap: the naive configuration's cap (no buckets, no warm-up).
        rates_rps: the Poisson rates of the serving phase.
        run_s: seconds of arrivals per serving run.
        drain_s: longest wait for a run's requests to settle once arrivals stop.
        slos_ms: the p99 SLOs of our configurations.
        graphs: also run static window 0 and ours with the model as one CUDA graph per bucket.
        freeze_gc: ``warmup(freeze_gc=True)`` for the warmed configurations (the dry run
            leaves the test process's heap alone).
        control_interval_ms: the controller's tick.
        telemetry_hz: the batchers' telemetry sampling rate.
        cost_samples: calls timed per telemetry source for the cost table.
        idle_s, load_s, load_settle_s: telemetry readings idle, under load (after letting the
            load settle for ``load_settle_s``).
        squeeze_rate_rps: the squeeze phase's Poisson rate.
        squeeze_before_s, squeeze_hold_s, squeeze_after_s: before, during and after the
            squeeze.
        squeeze_leave_bytes: the free memory the squeeze leaves on the device.
        timeline_s: the squeeze timeline's period.
        llm_batches, llm_contexts: the decoder grid (sequences x context tokens).
        llm_hidden, llm_layers, llm_heads, llm_kv_heads, llm_intermediate, llm_vocab: the
            Llama-shaped decoder (the full run: the 1.2B shape of the H200 tables).
        llm_prefill_reps, llm_decode_steps: timed calls per grid cell (after one warm-up).
        llm_budget_s: the longest the decoder grid may take.
    """

    budget_s: float = 400.0
    image_size: int = 224
    resnet_layers: tuple[int, int, int, int] = (3, 4, 6, 3)
    resnet_width: int = 64
    prefer_torchvision: bool = True
    channels_last: bool = True
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    naive_cap: int = 512
    rates_rps: tuple[float, ...] = (2000.0, 6000.0, 12000.0)
    run_s: float = 15.0
    drain_s: float = 5.0
    slos_ms: tuple[float, ...] = (50.0, 10.0)
    graphs: bool = True
    freeze_gc: bool = True
    control_interval_ms: float = 250.0
    telemetry_hz: float = 20.0
    cost_samples: int = 500
    idle_s: float = 2.0
    load_s: float = 3.0
    load_settle_s: float = 1.0
    squeeze_rate_rps: float = 2000.0
    squeeze_before_s: float = 4.0
    squeeze_hold_s: float = 8.0
    squeeze_after_s: float = 6.0
    squeeze_leave_bytes: int = GIB
    timeline_s: float = 0.25
    llm_batches: tuple[int, ...] = (1, 4, 16, 64)
    llm_contexts: tuple[int, ...] = (128, 512, 2048)
    llm_hidden: int = 2048
    llm_layers: int = 16
    llm_heads: int = 32
    llm_kv_heads: int = 8
    llm_intermediate: int = 8192
    llm_vocab: int = 32000
    llm_prefill_reps: int = 3
    llm_decode_steps: int = 8
    llm_budget_s: float = 90.0

    @property
    def cap(self) -> int:
        """The batch cap of the warmed configurations: the largest bucket."""
        return self.buckets[-1]

    @property
    def squeeze_s(self) -> float:
        """The squeeze phase's arrivals and drain, seconds."""
        before, hold, after = self.squeeze_before_s, self.squeeze_hold_s, self.squeeze_after_s
        return before + hold + after + self.drain_s


FULL = RunConfig()
"""The H200 run."""

QUICK = RunConfig(
    budget_s=60.0,
    image_size=16,
    resnet_layers=(1, 1, 1, 1),
    resnet_width=8,
    prefer_torchvision=False,
    channels_last=False,
    buckets=(1, 2, 4, 8, 16),
    naive_cap=16,
    rates_rps=(100.0, 200.0, 400.0),
    run_s=0.25,
    drain_s=2.0,
    freeze_gc=False,
    control_interval_ms=20.0,
    telemetry_hz=100.0,
    cost_samples=20,
    idle_s=1.1,  # the energy counter is read once a second: two reads
    load_s=1.1,
    load_settle_s=0.02,
    squeeze_rate_rps=300.0,
    squeeze_before_s=0.2,
    squeeze_hold_s=0.5,
    squeeze_after_s=0.2,
    timeline_s=0.05,
    llm_batches=(1, 2),
    llm_contexts=(8, 16),
    llm_hidden=32,
    llm_layers=2,
    llm_heads=4,
    llm_kv_heads=2,
    llm_intermediate=64,
    llm_vocab=64,
    llm_prefill_reps=1,
    llm_decode_steps=2,
    llm_budget_s=20.0,
)
"""The tiny run of ``--quick`` (the CPU dry run of the test suite)."""
