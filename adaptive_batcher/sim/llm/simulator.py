"""Replays token arrivals through the admission gate into a simulated continuous-batching engine.

The gate and its controller are the production code (:class:`~adaptive_batcher.llm.core.GateCore`);
the engine (:class:`~adaptive_batcher.sim.llm.engine.ContinuousBatchingEngine`) is the ground
truth. The gate sees only what a client would: the times of each stream's first and later
tokens, usage counts when a request ends, and, every ``metrics_interval_s``, the engine's
Prometheus-style metrics (if the contender reads them).

The loop: the engine steps back to back while it has work; arrivals (and the gate's timers)
during a step are handled at their own times, and what they admit joins the engine's queue for
the next step, as a real engine's scheduler sees it. At a step's end the streams' tokens are
reported (first tokens, finished requests, then the step as one token gap for the other
streams), the engine metrics when due, and the gate is polled (its controller ticks there).
When the engine is idle, time jumps to the next arrival or timer. Same inputs, same seed, same
result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from adaptive_batcher._validate import check_int, check_number, check_str
from adaptive_batcher.core.engine import SetTimer
from adaptive_batcher.llm.controller import TokenController
from adaptive_batcher.llm.core import GateCore
from adaptive_batcher.llm.gate import Abort, Admit, Expire, GateAction, GateRequest, Reject
from adaptive_batcher.llm.slo import TokenSLO
from adaptive_batcher.sim.llm.baselines import TrtllmDynamicBatchTuner
from adaptive_batcher.sim.llm.engine import ContinuousBatchingEngine, EngineConfig
from adaptive_batcher.sim.llm.result import LLMOutcome, LLMSimResult
from adaptive_batcher.sim.llm.step_time import Deployment
from adaptive_batcher.sim.llm.workloads import TokenArrivals

__all__ = ["LLMContender", "LLMSimulator"]


@dataclass(frozen=True)
class LLMContender:
    """One way of serving: the engine's settings and what stands in front of it.

    Attributes:
        name: label.
        engine: the engine's startup settings.
        controller: makes a fresh :class:`~adaptive_batcher.llm.controller.TokenController`
            for a replay (None: no gate, every request goes straight into the engine's queue).
        reads_engine_metrics: whether the gate is given the engine's metrics.
        trtllm_tuner: whether TensorRT-LLM's dynamic batch tuner sets the engine's caps
            between steps.
    """

    name: str
    engine: EngineConfig
    controller: Callable[[], TokenController] | None = None
    reads_engine_metrics: bool = True
    trtllm_tuner: bool = False

    def __post_init__(self) -> None:
        check_str("LLMContender.name", self.name)


@dataclass
class _State:
    admitted: np.ndarray
    first: np.ndarray
    done: np.ndarray
    outcome: np.ndarray
    requests: list[GateRequest[int] | None] = field(default_factory=list)
    timer: float | None = None
    series: list[tuple[float, ...]] = field(default_factory=list)


class LLMSimulator:
    """Replays :class:`~adaptive_batcher.sim.llm.workloads.TokenArrivals` for one contender.

    Args:
        deployment: the device's step-time model and KV cache.
        contender: what serves.
        slo: the objective the result is judged by.
        seed: seed of the engine's step-time jitter (>= 0).
        noise_sigma: lognormal jitter of step times (>= 0).
        metrics_interval_s: seconds between engine-metric readings and series rows (> 0).
        grace_s: how long after the last arrival the replay runs on; what has not finished
            then counts as a miss (>= 0).
    """

    def __init__(
        self,
        deployment: Deployment,
        contender: LLMContender,
        slo: TokenSLO,
        *,
        seed: int = 0,
        noise_sigma: float = 0.0,
        metrics_interval_s: float = 1.0,
        grace_s: float = 120.0,
    ) -> None:
        self.deployment = deployment
        self.contender = contender
        self.slo = slo
        self.seed = check_int("seed", seed, 0)
        self.noise_sigma = check_number("noise_sigma", noise_sigma, 0.0)
        self.metrics_interval_s = check_number(
            "metrics_interval_s", metrics_interval_s, 0.0, strict=True
        )
        self.grace_s = check_number("grace_s", grace_s, 0.0)

    def run(self, workload: TokenArrivals) -> LLMSimResult:
        """Replay ``workload``; the result holds every request's times and outcome."""
        contender = self.contender
        n = len(workload)
        times = workload.times_s.tolist()
        prompts = workload.prompt_tokens.tolist()
        outputs = workload.output_tokens.tolist()
        engine = ContinuousBatchingEngine(
            contender.engine, self.deployment.step, n, noise_sigma=self.noise_sigma, seed=self.seed
        )
        core: GateCore[int] | None = None
        if contender.controller is not None:
            core = GateCore(contender.controller())
        tuner = None
        if contender.trtllm_tuner:
            cfg = contender.engine
            tuner = TrtllmDynamicBatchTuner(
                cfg.kv_blocks, cfg.block_size, cfg.max_num_seqs, cfg.max_num_batched_tokens
            )
        nan = np.full(n, np.nan)
        state = _State(nan.copy(), nan.copy(), nan.copy(), np.zeros(n, dtype=np.int8))
        state.requests = [None] * n

        def carry_out(actions: list[GateAction], now: float) -> None:
            for action in actions:
                kind = type(action)
                if kind is SetTimer:
                    state.timer = action.at_s  # type: ignore[union-attr]
                    continue
                rid = action.request.handle  # type: ignore[union-attr]
                if kind is Admit:
                    engine.add(rid, prompts[rid], outputs[rid])
                    state.admitted[rid] = now
                elif kind is Reject:
                    state.outcome[rid] = LLMOutcome.REJECTED
                    state.done[rid] = now
                elif kind is Expire:
                    state.outcome[rid] = LLMOutcome.EXPIRED
                    state.done[rid] = now
                elif kind is Abort:
                    engine.abort(rid)
                    error = action.error  # type: ignore[union-attr]
                    state.outcome[rid] = (
                        LLMOutcome.CANCELLED if error is None else LLMOutcome.EXPIRED
                    )
                    state.done[rid] = now

        i = 0

        def handle_until(until: float, inclusive: bool) -> None:
            nonlocal i
            while True:
                arrival = times[i] if i < n else math.inf
                timer = state.timer if state.timer is not None else math.inf
                at = min(arrival, timer)
                if at > until or (at == until and not inclusive) or at == math.inf:
                    return
                if arrival <= timer:
                    rid = i
                    i += 1
                    if core is None:
                        engine.add(rid, prompts[rid], outputs[rid])
                        state.admitted[rid] = arrival
                    else:
                        request, actions = core.arrive(rid, arrival, prompts[rid])
                        state.requests[rid] = request
                        carry_out(actions, arrival)
                else:
                    state.timer = None
                    assert core is not None
                    carry_out(core.poll(timer), timer)

        now = 0.0
        stop_at = workload.duration_s + self.grace_s
        next_reading = 0.0
        interval = self.metrics_interval_s
        while now <= stop_at:
            if engine.idle:
                arrival = times[i] if i < n else math.inf
                timer = state.timer if state.timer is not None else math.inf
                at = min(arrival, timer)
                if at == math.inf:
                    break
                now = max(now, at)
                handle_until(now, True)
                continue
            outcome = engine.step()
            if outcome is None:  # pragma: no cover - a non-idle engine always schedules
                break
            end = now + outcome.duration_s
            handle_until(end, False)
            state.first[outcome.first] = end
            finished = outcome.finished
            state.done[finished] = end
            state.outcome[finished] = LLMOutcome.COMPLETED
            if core is not None:
                requests = state.requests
                for rid in outcome.first.tolist():
                    request = requests[rid]
                    if request is not None:
                        core.first_token(request, end)
                for rid in finished.tolist():
                    request = requests[rid]
                    if request is not None:
                        carry_out(core.finish(request, end, outputs[rid]), end)
                core.tokens(end, outcome.decode_tokens, outcome.duration_s)
            if end >= next_reading:
                next_reading = end + interval
                metrics = engine.metrics()
                if core is not None and contender.reads_engine_metrics:
                    core.engine_metrics(end, metrics)
                gate_limit = waiting = in_flight = math.nan
                if core is not None:
                    gate = core.gate
                    gate_limit = float(gate.limits.max_in_flight)
                    waiting, in_flight = float(gate.waiting), float(gate.in_flight)
                state.series.append(
                    (
                        end,
                        gate_limit,
                        waiting,
                        in_flight,
                        float(metrics.running),
                        float(metrics.waiting),
                        metrics.kv_usage,
                    )
                )
            if core is not None:
                carry_out(core.poll(end), end)
            if tuner is not None:
                inputs, wanted = engine.running_lengths()
                tuner.update(inputs, wanted)
                caps = tuner.caps()
                if caps is not None:
                    engine.set_caps(*caps)
            now = end
        series = np.asarray(state.series, dtype=np.float64).reshape(-1, 7)
        context = float(np.mean(workload.prompt_tokens + workload.output_tokens / 2)) if n else 1.0
        limit = self.deployment.decode_limit_tokens_s(context, contender.engine.max_num_seqs)
        return LLMSimResult(
            contender.name,
            self.slo,
            workload.duration_s,
            np.asarray(workload.times_s, dtype=np.float64),
            state.admitted,
            state.first,
            state.done,
            np.asarray(workload.prompt_tokens),
            np.asarray(workload.output_tokens),
            state.outcome,
            engine.preempted_count.copy(),
            engine.preemptions,
            engine.steps,
            limit,
            series,
        )
