"""Fake batch models that record what they saw."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

__all__ = ["EchoModel"]


class EchoModel:
    """An ``async`` batch model that returns its inputs and records every batch it receives.

    Args:
        delay_s: time each call takes (an ``asyncio.sleep``), seconds.
        fail_on: items whose presence makes the whole batch raise ``ValueError``.
    """

    def __init__(self, delay_s: float = 0.0, fail_on: Sequence[Any] = ()) -> None:
        self.delay_s = delay_s
        self.fail_on = list(fail_on)
        self.batches: list[list[Any]] = []
        self.start_times: list[float] = []

    @property
    def sizes(self) -> list[int]:
        """Items per call, in call order."""
        return [len(b) for b in self.batches]

    @property
    def seen(self) -> list[Any]:
        """Every item the model received, in order."""
        return [item for batch in self.batches for item in batch]

    async def __call__(self, batch: list[Any]) -> list[Any]:
        self.batches.append(list(batch))
        self.start_times.append(asyncio.get_running_loop().time())
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        for item in batch:
            if item in self.fail_on:
                raise ValueError(f"poisoned item {item!r}")
        return list(batch)
