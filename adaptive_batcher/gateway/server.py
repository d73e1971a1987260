"""uvicorn's server for the gateway, whose shutdown drains the gate first.

uvicorn alone, on SIGTERM or Ctrl-C, stops listening, waits ``timeout_graceful_shutdown`` for
its connections, then cancels the requests still running: a stream is cut mid-body and its
client sees a broken connection, not an error. :class:`DrainingServer` starts the gate's drain
(:meth:`~adaptive_batcher.gateway.shell.LLMGate.aclose`) as uvicorn's shutdown begins, so a
stream still running when the drain ends gets the gateway's error event (503
``gateway_closed``) and a complete body; uvicorn's own bound should exceed the drain by
:data:`WRITE_GRACE_S` so those last events reach their clients. A second Ctrl-C (uvicorn's
``force_exit``) cuts the drain short: the running streams end with that error event
at once.
"""

from __future__ import annotations

import asyncio
import socket

from adaptive_batcher._validate import check_number
from adaptive_batcher.gateway._extra import missing_extra
from adaptive_batcher.gateway.shell import LLMGate

try:
    import uvicorn
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra(__name__, exc) from exc

__all__ = ["FORCE_POLL_S", "WRITE_GRACE_S", "DrainingServer"]

#: how often the shutdown looks for a second signal, seconds
FORCE_POLL_S = 0.1

#: seconds after the drain for the last events to reach their clients (the margin of uvicorn's
#: ``timeout_graceful_shutdown`` over the drain)
WRITE_GRACE_S = 5


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose shutdown closes ``gate`` with a drain of at most
    ``drain_timeout_s`` seconds (>= 0; None: no bound) while uvicorn stops listening and waits
    for its connections; the shutdown returns once both are done.

    Raises:
        TypeError, ValueError: ``gate`` not an ``LLMGate``, ``drain_timeout_s`` out of range.
    """

    def __init__(
        self, config: uvicorn.Config, gate: LLMGate, *, drain_timeout_s: float | None
    ) -> None:
        if not isinstance(gate, LLMGate):
            raise TypeError(f"gate must be an LLMGate, got {type(gate).__name__}")
        if drain_timeout_s is not None:
            check_number("drain_timeout_s", drain_timeout_s, 0.0)
        super().__init__(config)
        self._gate = gate
        self._drain_timeout_s = drain_timeout_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain the gate and shut uvicorn down, together; a second signal (uvicorn's
        ``force_exit``) cuts the drain short."""
        drain = asyncio.ensure_future(
            self._gate.aclose(drain=True, timeout_s=self._drain_timeout_s)
        )
        forced = asyncio.ensure_future(self._cut_when_forced(drain))
        try:
            await super().shutdown(sockets)
        finally:
            await drain
            forced.cancel()

    async def _cut_when_forced(self, drain: asyncio.Future[None]) -> None:
        while not drain.done():
            if self.force_exit:
                await self._gate.aclose(drain=False)
                return
            await asyncio.sleep(FORCE_POLL_S)
