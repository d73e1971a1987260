"""The real-time benchmarks' verdict on a shortfall (benchmarks/chance.py): a draw of late
answers passes, a regression does not."""

from __future__ import annotations

import pytest

from benchmarks.chance import no_worse_beyond_chance


@pytest.mark.parametrize(
    ("ours", "other", "offered", "verdict"),
    [
        (17_895, 17_895, 17_895, True),  # both answer every request in time
        (17_894, 17_895, 17_895, True),  # one late against none: a draw
        (17_891, 17_895, 17_895, True),  # four late against none: 4 <= 2 * sqrt(4)
        (17_890, 17_895, 17_895, False),  # five: 5 > 2 * sqrt(5)
        (900, 1000, 1000, False),  # 100 late against none
        (700, 720, 1000, True),  # 300 late against 280: 20 <= 2 * sqrt(580)
        (600, 720, 1000, False),  # 400 against 280
        (1000, 900, 1000, True),  # ours ahead
    ],
)
def test_a_shortfall_within_chance_passes(
    ours: int, other: int, offered: int, verdict: bool
) -> None:
    assert no_worse_beyond_chance(ours, other, offered) is verdict


@pytest.mark.parametrize(("ours", "other"), [(-1, 0), (11, 0), (0, 11)])
def test_counts_outside_the_offered_are_refused(ours: int, other: int) -> None:
    with pytest.raises(ValueError, match=r"within-SLO counts must lie in \[0, offered=10\]"):
        no_worse_beyond_chance(ours, other, 10)
