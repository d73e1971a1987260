"""The sans-IO controller: observations in, decisions out; guards; the service-time model."""

from adaptive_batcher.control.controller import Controller, default_guards
from adaptive_batcher.control.guards import (
    BucketGuard,
    BudgetGuard,
    Guard,
    MemoryGuard,
    PowerGuard,
    ShedGuard,
    StallGuard,
    StepGuard,
)
from adaptive_batcher.control.guards.cap_probe import CapProbeGuard
from adaptive_batcher.control.guards.unused_window import UnusedWindowGuard
from adaptive_batcher.control.policy import GuardFactory, Policy
from adaptive_batcher.control.service_estimator import ServiceTimeEstimator
from adaptive_batcher.control.slack import TailSlack
from adaptive_batcher.control.types import Bounds, Decision, Observation

__all__ = [
    "Bounds",
    "BucketGuard",
    "BudgetGuard",
    "CapProbeGuard",
    "Controller",
    "Decision",
    "Guard",
    "GuardFactory",
    "MemoryGuard",
    "Observation",
    "Policy",
    "PowerGuard",
    "ServiceTimeEstimator",
    "ShedGuard",
    "StallGuard",
    "StepGuard",
    "TailSlack",
    "UnusedWindowGuard",
    "default_guards",
]
