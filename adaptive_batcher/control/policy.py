"""The policy interface: a control law that maps an Observation to a Decision.

Policies see samples, not requests (the split of Netflix concurrency-limits: the algorithm is
separate from the admission machinery). Smoothing, safety and logging are not their business:
guards (:mod:`adaptive_batcher.control.guards`) wrap any policy, and the controller logs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from adaptive_batcher.control.types import Decision, Observation

__all__ = ["GuardFactory", "Policy"]


@runtime_checkable
class Policy(Protocol):
    """A control law over (window, cap).

    ``decide`` is called once per control tick with what was observed during the tick and returns
    the settings for the next one; it may keep state. ``reset`` is called when the policy takes
    over (at start, or when switched in at run time) with the settings then in force, so that it
    continues from them without a bump ("bumpless transfer").
    """

    name: str

    def decide(self, observation: Observation) -> Decision: ...

    def reset(self, current: Decision) -> None: ...


GuardFactory = Callable[[Policy], Policy]
"""Wraps a policy in a guard (see :mod:`adaptive_batcher.control.guards`)."""
