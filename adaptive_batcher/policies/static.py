"""Static: fixed window and cap, today's Triton / Ray Serve / TorchServe behaviour."""

from __future__ import annotations

from typing import ClassVar

from adaptive_batcher._validate import check_number, check_optional_int
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["Static"]


class Static:
    """Always the same window and cap.

    Args:
        window_ms: the window, ms; None keeps whatever is in force when the policy takes over.
        max_batch_size: the cap, units; None keeps whatever is in force.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (the message names
            it, as ``Static.window_ms``).
    """

    name = "static"
    parameters: ClassVar[tuple[str, ...]] = ("window_ms", "max_batch_size")

    def __init__(self, window_ms: float | None = None, max_batch_size: int | None = None) -> None:
        self.window_ms = (
            None if window_ms is None else check_number("Static.window_ms", window_ms, 0)
        )
        self.max_batch_size = check_optional_int("Static.max_batch_size", max_batch_size, 1)
        self._fixed: Decision | None = None

    def reset(self, current: Decision) -> None:
        self._fixed = Decision(
            current.window_ms if self.window_ms is None else self.window_ms,
            current.max_batch_size if self.max_batch_size is None else self.max_batch_size,
            "static",
        )

    def decide(self, observation: Observation) -> Decision:
        if self._fixed is None:
            self.reset(observation.current)
        assert self._fixed is not None
        return self._fixed
