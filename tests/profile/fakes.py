"""Test doubles and measured tables for the profiler tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from adaptive_batcher.profile import ProfileResult, ProfileRow


class FakeClock:
    """A clock in seconds that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeModel:
    """A batch model whose call takes ``latency_ms(batch_size, call_index)`` on a fake clock.

    ``call_index`` counts the calls at that batch size, warm-up included, from 0. ``fail_at``
    maps a batch size to the exception raised when the model is called with it.
    """

    def __init__(
        self,
        clock: FakeClock,
        latency_ms: Callable[[int, int], float],
        fail_at: dict[int, BaseException] | None = None,
    ) -> None:
        self.clock = clock
        self.latency_ms = latency_ms
        self.fail_at = fail_at or {}
        self.calls: list[int] = []

    def __call__(self, batch: Sequence[Any]) -> list[Any]:
        n = len(batch)
        if n in self.fail_at:
            raise self.fail_at[n]
        index = self.calls.count(n)
        self.calls.append(n)
        self.clock.advance(self.latency_ms(n, index) / 1e3)
        return list(batch)


def make_list_batch(n: int) -> list[int]:
    """A batch of ``n`` ints."""
    return list(range(n))


# resnet50, bf16, eager, H200 (adaptive_batcher/data/h200/batch_profile.csv): batch, median ms,
# p90 ms (stands in for p99 here), items/s, peak MiB.
RESNET50_H200 = [
    (1, 3.676, 3.818, 272.0, 303.9),
    (2, 6.284, 6.47, 318.2, 309.2),
    (4, 3.881, 4.966, 1030.7, 319.8),
    (8, 3.968, 4.13, 2016.1, 340.7),
    (16, 3.916, 4.003, 4085.7, 382.9),
    (32, 4.041, 4.167, 7919.4, 470.1),
    (64, 7.219, 7.452, 8865.9, 635.5),
    (128, 8.778, 8.807, 14581.9, 972.4),
    (256, 16.651, 16.678, 15374.4, 1646.6),
    (512, 32.228, 32.275, 15886.6, 2994.6),
]

BERT_BASE_SEQ128_H200 = [
    (1, 6.675, 6.86, 149.8, 446.6),
    (2, 6.45, 6.669, 310.1, 302.8),
    (4, 4.557, 6.65, 877.8, 306.9),
    (8, 4.465, 4.713, 1791.8, 315.1),
    (16, 4.744, 6.215, 3372.9, 331.7),
    (32, 4.569, 5.014, 7004.2, 364.7),
    (64, 4.432, 6.04, 14441.4, 430.7),
    (128, 7.364, 7.605, 17382.5, 562.8),
    (256, 14.139, 14.428, 18105.5, 826.9),
    (512, 27.825, 29.238, 18400.9, 1355.1),
]


def table_result(
    table: Sequence[tuple[int, float, float, float, float]],
    *,
    oom_batch_size: int | None = None,
    model_name: str = "resnet50",
) -> ProfileResult:
    """A ProfileResult from (batch, median ms, p99 ms, items/s, peak MiB) tuples."""
    rows = tuple(
        ProfileRow(b, med, p99, ips, round(mib * 1024 * 1024)) for b, med, p99, ips, mib in table
    )
    return ProfileResult(rows, oom_batch_size, "cuda:0 (NVIDIA H200)", model_name, 20)
