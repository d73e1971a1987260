"""When a real-time run's shortfall is chance: late answers counted as rare events.

Two runs of one setting on the same arrivals differ in their late answers by the scheduler's
draw: a late answer is a rare event, so its count is about Poisson and the difference of two
counts has a standard deviation of about ``sqrt(late_a + late_b)``. The real-time verdicts
(``test_realtime_faults.py``, ``test_demo.py``) call ours no worse than a static setting when it
trails by no more than twice that: one late answer against none is a draw, not a regression;
ten against none is not.
"""

from __future__ import annotations

import math

__all__ = ["CHANCE_Z", "no_worse_beyond_chance"]

CHANCE_Z = 2.0
"""How many standard deviations of the late counts' difference ours may trail by."""


def no_worse_beyond_chance(ours_within: int, other_within: int, offered: int) -> bool:
    """Whether ours, with ``ours_within`` of ``offered`` requests answered within the SLO, is
    no worse than another contender with ``other_within`` of the same arrivals, beyond chance.

    Raises:
        ValueError: a count above ``offered`` or below 0.
    """
    if not (0 <= ours_within <= offered and 0 <= other_within <= offered):
        raise ValueError(
            f"within-SLO counts must lie in [0, offered={offered}], got {ours_within} and "
            f"{other_within}"
        )
    late_ours, late_other = offered - ours_within, offered - other_within
    return late_ours - late_other <= CHANCE_Z * math.sqrt(late_ours + late_other)
