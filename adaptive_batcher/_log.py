"""The library's logger: structlog events that can never break serving.

Library code never configures logging; it emits structlog events with stable names. An
application's logging pipeline may still raise (a processor that expects a key, a closed sink).
A log call on the serving path must not strand a request or stop the controller, so every call
goes through :class:`SafeLogger`, which drops the event when the pipeline raises.

Until the application configures structlog (``structlog.configure(...)``), the library's debug
and info events are dropped and only warnings and errors reach structlog's default output
(stdout): an unconfigured application would otherwise print one ``batch.dispatched`` line per
batch. Once structlog is configured, every event goes to the application's pipeline, which
filters as it chooses.
"""

from __future__ import annotations

from typing import Any

import structlog

__all__ = ["SafeLogger", "get_logger"]


class SafeLogger:
    """``debug/info/warning/error(event, **kw)`` on a structlog logger; never raises."""

    def __init__(self, name: str) -> None:
        self._logger = structlog.get_logger(name)

    def debug(self, event: str, **kw: Any) -> None:
        if structlog.is_configured():
            self._emit("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        if structlog.is_configured():
            self._emit("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit("warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._emit("error", event, kw)

    def _emit(self, level: str, event: str, kw: dict[str, Any]) -> None:
        try:  # not contextlib.suppress: an object per event, on the serving path
            getattr(self._logger, level)(event, **kw)
        except Exception:  # a broken log pipeline must not break serving
            return


def get_logger(name: str = "adaptive_batcher") -> SafeLogger:
    """The library's logger (structlog underneath; the application configures structlog)."""
    return SafeLogger(name)
