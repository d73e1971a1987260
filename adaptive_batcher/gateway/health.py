"""Whether the engine behind the gateway answers: the upstream part of ``GET /health``.

:class:`UpstreamCheck` asks the engine's own health route (``GET /health`` by default: vLLM,
SGLang, TGI and llama.cpp's ``llama-server`` serve it) and reads the answer as:

* **up**: any answer below 500 (a 404 from a server without the route still proves that it
  answers);
* **down**: no connection, no answer within ``timeout_s``, or a 5xx (vLLM answers 503 when its
  engine core is dead, llama.cpp while it loads the model).

Readings are kept for ``max_age_s``, and callers that ask while a check is under way share it,
so a load balancer polling often costs the engine at most one request per ``max_age_s``.
An outage is logged when it begins and, spaced out, while it lasts (``gateway.upstream_down``
warning), and once when it ends (``gateway.upstream_up``, a warning too, so that it shows
wherever the outage did), never per check
(:class:`~adaptive_batcher.gateway.outage.OutageLog`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adaptive_batcher._log import get_logger
from adaptive_batcher._validate import check_callable, check_number, check_str
from adaptive_batcher.errors import describe
from adaptive_batcher.gateway.errors import UpstreamError
from adaptive_batcher.gateway.openai import OpenAIEngine
from adaptive_batcher.gateway.outage import OutageLog, loggable_url

__all__ = ["UpstreamCheck", "UpstreamState"]

_log = get_logger("adaptive_batcher.gateway.health")


@dataclass(frozen=True, slots=True)
class UpstreamState:
    """One reading of the engine's health.

    Attributes:
        up: the engine answered below 500.
        status: its HTTP status, None without an answer.
        error: why it is down (the adapter's error or the status), None when up.
        latency_ms: how long the check took, milliseconds.
        checked_at_s: when it ended, on the check's clock, seconds.
    """

    up: bool
    status: int | None
    error: str | None
    latency_ms: float
    checked_at_s: float

    def as_json(self, now_s: float) -> dict[str, Any]:
        """The reading for a health answer, with its age in seconds."""
        return {
            "up": self.up,
            "status": self.status,
            "error": self.error,
            "latency_ms": round(self.latency_ms, 3),
            "age_s": round(max(now_s - self.checked_at_s, 0.0), 3),
        }


class UpstreamCheck:
    """The engine's health, asked at most once per ``max_age_s`` (see the module).

    Args:
        engine: the engine to ask.
        path: its health route (``/health``).
        timeout_s: the longest a check waits for the answer, seconds (> 0).
        max_age_s: how long a reading is reused, seconds (>= 0).
        clock: the clock, seconds (default ``time.monotonic``); readings' ``checked_at_s`` are
            on it.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        engine: OpenAIEngine,
        *,
        path: str = "/health",
        timeout_s: float = 2.0,
        max_age_s: float = 1.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(engine, OpenAIEngine):
            raise TypeError(f"engine must be an OpenAIEngine, got {type(engine).__name__}")
        self.path = check_str("path", path)
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")
        self.timeout_s = check_number("timeout_s", timeout_s, 0.0, strict=True)
        self.max_age_s = check_number("max_age_s", max_age_s, 0.0)
        self.clock: Callable[[], float] = (
            time.monotonic if clock is None else check_callable("clock", clock)
        )
        self._engine = engine
        self._outage = OutageLog(
            _log, "gateway.upstream_down", "gateway.upstream_up", clock=self.clock
        )
        self._last: UpstreamState | None = None
        self._pending: asyncio.Future[UpstreamState] | None = None

    @property
    def last(self) -> UpstreamState | None:
        """The latest reading, None before the first."""
        return self._last

    async def state(self) -> UpstreamState:
        """A reading no older than ``max_age_s``: the kept one, the one under way, or a new
        one. Never raises but for cancellation (a check cancelled by one caller goes on for
        the others)."""
        last = self._last
        if last is not None and self.clock() - last.checked_at_s <= self.max_age_s:
            return last
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._check())
        return await asyncio.shield(self._pending)

    async def _check(self) -> UpstreamState:
        start = self.clock()
        status: int | None = None
        try:
            response = await self._engine.get(self.path, timeout_s=self.timeout_s)
            status = response.status_code
            error = None if status < 500 else f"the engine answered HTTP {status}"
        except UpstreamError as exc:
            error = describe(exc)
        except Exception as exc:  # a health check reports; it never fails the health route
            error = f"the check failed: {describe(exc)}"
        now = self.clock()
        state = UpstreamState(error is None, status, error, (now - start) * 1e3, now)
        url = loggable_url(self._engine.base_url + self.path)
        if state.up:
            self._outage.succeeded(url=url, status=status)
        else:
            self._outage.failed(url=url, error=error)
        self._last = state
        return state
