"""The sans-IO glue of the admission gate and its controller, shared by every shell.

:class:`GateCore` is to the LLM gate what
:class:`~adaptive_batcher.core.batcher_core.BatcherCore` is to the batcher: the simulator
(:mod:`adaptive_batcher.sim.llm`) drives it on a virtual clock, an asyncio shell drives it
from request handlers and engine streams, and both make the same calls:

======================================  ===================================================
shell event                             call
======================================  ===================================================
a request reaches the gate              :meth:`GateCore.arrive` -> the request and actions
its first token streams                 :meth:`GateCore.first_token`
tokens stream (one per stream, after    :meth:`GateCore.tokens` (aggregated: ``streams``
the previous one)                       streams, each ``gap_s`` after its previous token)
its last token and usage arrive         :meth:`GateCore.finish`
the engine fails it                     :meth:`GateCore.fail`
its caller goes away                    :meth:`GateCore.cancel`
engine metrics were scraped             :meth:`GateCore.engine_metrics`
the timer fires, or any time            :meth:`GateCore.poll`
shutdown                                :meth:`GateCore.close`
======================================  ===================================================

Each returns the gate's actions (:class:`~adaptive_batcher.llm.gate.Admit`,
:class:`~adaptive_batcher.llm.gate.Reject`, :class:`~adaptive_batcher.llm.gate.Expire`,
:class:`~adaptive_batcher.llm.gate.Abort`, then one
:class:`~adaptive_batcher.core.engine.SetTimer`) for the shell to carry out. The controller ticks
inside :meth:`~GateCore.arrive` and :meth:`~GateCore.poll` when due, so ticks ride on the
shell's calls: a gate that only receives arrivals still ticks.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from adaptive_batcher.llm.controller import TokenController
from adaptive_batcher.llm.gate import (
    Abort,
    AdmissionGate,
    Admit,
    Expire,
    GateAction,
    GateCounts,
    GateRequest,
    Reject,
    RequestState,
)
from adaptive_batcher.llm.signals import EngineMetrics

__all__ = ["GateCore"]

H = TypeVar("H")


class GateCore(Generic[H]):
    """An :class:`~adaptive_batcher.llm.gate.AdmissionGate` steered by a
    :class:`~adaptive_batcher.llm.controller.TokenController`.

    Each request's EDF key is its arrival plus the SLO's TTFT target. The core keeps the
    estimate of the tokens in flight (prompts admitted plus tokens streamed, less those of
    requests that ended) that the controller's step-time fit needs.

    Args:
        controller: the controller (its decision in force sets the gate's starting knobs).
    """

    def __init__(self, controller: TokenController) -> None:
        if not isinstance(controller, TokenController):
            raise TypeError(
                f"controller must be a TokenController, got {type(controller).__name__}"
            )
        self.controller = controller
        decision = controller.decision
        self.gate: AdmissionGate[H] = AdmissionGate(decision.limits, decision.forecast)
        self._ttft_s = controller.slo.ttft_s
        self._context = 0.0
        self._gap_sequences = 0
        self._gap_context = 0.0

    @property
    def context_tokens(self) -> float:
        """The estimated tokens in flight (prompts plus generated)."""
        return self._context

    def counts(self) -> GateCounts:
        """The gate's request counts."""
        return self.gate.counts()

    # -- events ----------------------------------------------------------------------------

    def arrive(
        self,
        handle: H,
        now: float,
        prompt_tokens: int,
        *,
        max_tokens: int | None = None,
        deadline_s: float | None = None,
    ) -> tuple[GateRequest[H], list[GateAction]]:
        """A new request arrives at ``now`` with ``prompt_tokens`` of prompt: the request (keep
        it for the later calls) and the actions."""
        request = GateRequest(
            handle,
            now,
            prompt_tokens,
            max_tokens=max_tokens,
            deadline_s=deadline_s,
            ttft_deadline_s=now + self._ttft_s,
        )
        self.controller.record_arrival(now)
        self._maybe_tick(now)
        actions = self.gate.arrive(request, now)
        self._observe(actions, now)
        return request, actions

    def first_token(self, request: GateRequest[H], now: float) -> None:
        """``request``'s first token streamed at ``now``."""
        if request.state != RequestState.RUNNING or request.first_token_s is not None:
            return
        admitted = request.admitted_s if request.admitted_s is not None else now
        # the controller first: a sample it refuses (a clock gone back) changes nothing
        self.controller.record_first_token(
            now, now - admitted, request.admit_backlog + request.prompt_tokens
        )
        self.gate.first_token(request, now)
        self._context += 1.0

    def tokens(self, now: float, streams: int, gap_s: float) -> None:
        """``streams`` streams each got one more token at ``now``, ``gap_s`` after their
        previous one (in the simulator: one engine step)."""
        self.controller.record_gap(now, streams, gap_s, self._gap_sequences, self._gap_context)
        self._context += streams
        self._gap_sequences = self.gate.in_flight
        self._gap_context = self._context

    def finish(self, request: GateRequest[H], now: float, output_tokens: int) -> list[GateAction]:
        """``request`` ended with its last token at ``now``, having produced ``output_tokens``
        (its usage count). Ignored, but for the timer, when it is no longer running."""
        if request.state == RequestState.RUNNING:
            first = request.first_token_s if request.first_token_s is not None else now
            admitted = request.admitted_s if request.admitted_s is not None else request.arrival_s
            tpot = (now - first) / (output_tokens - 1) if output_tokens > 1 else 0.0
            # the controller first, with the in-flight count that includes this request (as
            # Netflix's limiter counts it): a sample it refuses leaves the request running
            self.controller.record_finish(
                now, first - request.arrival_s, tpot, output_tokens, now - admitted,
                self.gate.in_flight,
            )  # fmt: skip
            self._context -= request.prompt_tokens + output_tokens
            actions = self.gate.finish(request, now)
        else:
            actions = self.gate.poll(now)
        self._observe(actions, now)
        return actions

    def fail(self, request: GateRequest[H], now: float) -> list[GateAction]:
        """The engine failed ``request`` at ``now``."""
        if request.state == RequestState.RUNNING:
            self._context -= request.prompt_tokens
        actions = self.gate.fail(request, now)
        self._observe(actions, now)
        return actions

    def cancel(self, request: GateRequest[H], now: float) -> list[GateAction]:
        """``request``'s caller went away at ``now`` (an :class:`Abort` tells the shell to
        stop it upstream when it was running)."""
        actions = self.gate.cancel(request, now)
        self._observe(actions, now)
        return actions

    def engine_metrics(self, now: float, metrics: EngineMetrics) -> None:
        """A scrape of the engine's metrics at ``now``."""
        self.controller.record_engine(now, metrics)

    def poll(self, now: float) -> list[GateAction]:
        """Tick the controller when due, then let the gate expire, abort and admit."""
        self._maybe_tick(now)
        actions = self.gate.poll(now)
        self._observe(actions, now)
        return actions

    def close(self, now: float, *, drain: bool = True) -> list[GateAction]:
        """Stop arrivals; without ``drain`` the waiting requests are rejected now."""
        actions = self.gate.close(now, drain=drain)
        self._observe(actions, now)
        return actions

    # -- internals -------------------------------------------------------------------------

    def _maybe_tick(self, now: float) -> None:
        controller = self.controller
        if controller.due(now):
            decision = controller.tick(
                now,
                in_flight=self.gate.in_flight,
                waiting=self.gate.waiting,
                context_tokens=self._context,
            )
            self.gate.set_limits(decision.limits, now)
            self.gate.set_forecast(decision.forecast)

    def _observe(self, actions: list[GateAction], now: float) -> None:
        controller = self.controller
        for action in actions:
            kind = type(action)
            if kind is Admit:
                request = action.request  # type: ignore[union-attr]
                controller.record_admit(now, request.prompt_tokens)
                self._context += request.prompt_tokens
            elif kind is Reject:
                controller.record_reject(now)
            elif kind is Expire:
                controller.record_expire(now)
            elif kind is Abort:
                self._context -= action.request.prompt_tokens  # type: ignore[union-attr]
        if self.gate.in_flight == 0 or self._context < 0:
            self._context = 0.0
