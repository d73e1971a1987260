"""Log an outage of something the gateway polls (the engine's health route, its metrics page)
without one line per poll.

:class:`OutageLog` emits its ``down`` event (a warning) when a run of failures begins, repeats
it while the run lasts at doubling spacing (``first_repeat_s``, twice that, ... at most
``max_repeat_s`` apart) with the number of failures so far, and emits its ``up`` event (info)
once when a success ends the run. A poller that fails every second for an hour so writes about a
dozen lines, not 3,600.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from adaptive_batcher._log import SafeLogger
from adaptive_batcher._validate import check_callable, check_number

__all__ = ["OutageLog", "loggable_url"]


def loggable_url(url: str) -> str:
    """``url`` without its user and password (``http://user:pw@host/x`` ->
    ``http://host/x``), for a log line."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class OutageLog:
    """Logs when failures begin, while they last (spaced out) and when they end.

    Args:
        logger: where the events go.
        down_event: the warning's name, e.g. ``engine_telemetry.failed``.
        up_event: the warning's name when a success follows failures, e.g.
            ``engine_telemetry.recovered``.
        first_repeat_s: seconds from the first warning of a run to its first repeat (> 0).
        max_repeat_s: the longest spacing of repeats, seconds (>= ``first_repeat_s``).
        clock: the clock, seconds (default ``time.monotonic``).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
    """

    def __init__(
        self,
        logger: SafeLogger,
        down_event: str,
        up_event: str,
        *,
        first_repeat_s: float = 10.0,
        max_repeat_s: float = 300.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._log = logger
        self._down_event = down_event
        self._up_event = up_event
        self._first_repeat_s = check_number("first_repeat_s", first_repeat_s, 0.0, strict=True)
        self._max_repeat_s = check_number("max_repeat_s", max_repeat_s, self._first_repeat_s)
        self._clock: Callable[[], float] = (
            time.monotonic if clock is None else check_callable("clock", clock)
        )
        self._failures = 0
        self._started_s = 0.0
        self._next_log_s = 0.0
        self._spacing_s = self._first_repeat_s

    @property
    def failures(self) -> int:
        """Failures in the current run; 0 while things work."""
        return self._failures

    def failed(self, **fields: Any) -> None:
        """One failure: the warning if it starts a run or a repeat is due, else nothing."""
        now = self._clock()
        if self._failures == 0:
            self._started_s = now
            self._next_log_s = now
            self._spacing_s = self._first_repeat_s
        self._failures += 1
        if now < self._next_log_s:
            return
        down_for_s = round(now - self._started_s, 3)
        self._log.warning(
            self._down_event, failures=self._failures, down_for_s=down_for_s, **fields
        )
        self._next_log_s = now + self._spacing_s
        self._spacing_s = min(self._spacing_s * 2.0, self._max_repeat_s)

    def succeeded(self, **fields: Any) -> None:
        """One success: the warning that the run of failures ended, if one did, else nothing."""
        if self._failures == 0:
            return
        down_for_s = round(self._clock() - self._started_s, 3)
        # a warning too: whoever saw the outage at the default level must see its end
        self._log.warning(self._up_event, failures=self._failures, down_for_s=down_for_s, **fields)
        self._failures = 0
