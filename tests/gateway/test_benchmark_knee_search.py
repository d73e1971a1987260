"""The real-engine benchmark's knee search (benchmarks/llm_engine.py), on a fake probe."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from benchmarks.llm_engine import slo_knee


def _engine(knee_rps: float, probed: list[float]) -> Callable[[float], Awaitable[float]]:
    async def probe(rate_rps: float) -> float:
        probed.append(rate_rps)
        return 0.95 if rate_rps <= knee_rps else 0.5

    return probe


@pytest.mark.parametrize("knee_rps", [3.0, 7.5, 12.9])
async def test_the_knee_is_the_highest_rate_probed_that_meets_the_attainment(
    knee_rps: float,
) -> None:
    probed: list[float] = []
    found = await slo_knee(_engine(knee_rps, probed), 16.0, steps=5)
    assert len(probed) == 5 and probed[0] == 16.0
    assert found <= knee_rps < found + 16.0 / 2**4  # within the last bracket
    assert found in probed


async def test_an_engine_that_meets_the_slo_at_its_throughput_has_that_knee() -> None:
    probed: list[float] = []
    assert await slo_knee(_engine(20.0, probed), 16.0) == 16.0
    assert probed == [16.0]


async def test_an_engine_that_meets_it_nowhere_probed_gets_the_lowest_bracket() -> None:
    probed: list[float] = []
    found = await slo_knee(_engine(0.1, probed), 16.0, steps=4)
    assert probed == [16.0, 8.0, 4.0, 2.0] and found == 1.0
