"""The policy interface: a control law that maps an Observation to a Decision.

Policies see samples, not requests (the split of Netflix concurrency-limits: the algorithm is
separate from the admission machinery). Smoothing, safety and logging are not their business:
guards (:mod:`adaptive_batcher.control.guards`) wrap any policy, and the controller logs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from adaptive_batcher.control.types import Decision, Observation

__all__ = ["GuardFactory", "Policy", "declares_shedding"]


@runtime_checkable
class Policy(Protocol):
    """A control law over (window, cap).

    ``decide`` is called once per control tick with what was observed during the tick and returns
    the settings for the next one; it may keep state. ``reset`` is called when the policy takes
    over (at start, or when switched in at run time) with the settings then in force, so that it
    continues from them without a bump ("bumpless transfer").

    A policy whose decisions fail requests by themselves (set ``Decision.shed_after_ms``), as
    :class:`~adaptive_batcher.policies.cork.BentoCork` does, declares the class attribute
    ``sheds = True``, and so does a guard that sheds
    (:class:`~adaptive_batcher.control.guards.ShedGuard`); :func:`declares_shedding` reads it.
    It is optional: a policy without it is taken not to shed. Replays compare a contender that
    sheds with the best static setting *with* shedding, not the one without.
    """

    name: str

    def decide(self, observation: Observation) -> Decision: ...

    def reset(self, current: Decision) -> None: ...


GuardFactory = Callable[[Policy], Policy]
"""Wraps a policy in a guard (see :mod:`adaptive_batcher.control.guards`)."""


def declares_shedding(policy_or_guard: object) -> bool:
    """Whether a policy or guard (an instance or its class) declares ``sheds = True``: its
    decisions fail requests that can no longer meet the SLO (see :class:`Policy`)."""
    return getattr(policy_or_guard, "sheds", False) is True
