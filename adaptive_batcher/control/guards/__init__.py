"""Guards: decorators around any policy that keep its decisions safe.

Each guard is itself a :class:`~adaptive_batcher.policies.Policy`: it asks the policy it wraps,
then corrects the answer (smoothing and safety as decorators around the algorithm, as in Netflix
concurrency-limits). The default chain (:func:`~adaptive_batcher.control.default_guards`),
innermost first: unused window, budget, power back-off, step limit, stalls, memory, cap probe,
then SLO-aware shedding when asked for, then buckets; the controller clamps the result to the
bounds. One module a guard; :mod:`~adaptive_batcher.control.guards.base` holds their base class,
the reasons more than one of them knows and their shared helpers.
"""

from adaptive_batcher.control.guards.base import Guard
from adaptive_batcher.control.guards.bucket import BucketGuard
from adaptive_batcher.control.guards.budget import BudgetGuard
from adaptive_batcher.control.guards.cap_probe import CapProbeGuard
from adaptive_batcher.control.guards.memory import MemoryGuard
from adaptive_batcher.control.guards.power import PowerGuard
from adaptive_batcher.control.guards.shed import ShedGuard
from adaptive_batcher.control.guards.stall import StallGuard
from adaptive_batcher.control.guards.step import StepGuard
from adaptive_batcher.control.guards.unused_window import UnusedWindowGuard

__all__ = [
    "BucketGuard",
    "BudgetGuard",
    "CapProbeGuard",
    "Guard",
    "MemoryGuard",
    "PowerGuard",
    "ShedGuard",
    "StallGuard",
    "StepGuard",
    "UnusedWindowGuard",
]
