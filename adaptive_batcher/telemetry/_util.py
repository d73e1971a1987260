"""Private helpers shared by the telemetry sources."""

from __future__ import annotations

__all__ = ["describe_error"]


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"`` for a log field; never raises (NVML messages call into NVML)."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
