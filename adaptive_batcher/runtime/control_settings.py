"""The batcher's controller arguments, checked once at construction."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_batcher._validate import (
    check_bool,
    check_callable,
    check_number,
    check_optional_int,
    check_sequence,
)
from adaptive_batcher.control.controller import GuardFactory
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.policies.base import Policy
from adaptive_batcher.slo import SLO

__all__ = ["ControlSettings", "check_policy"]


@dataclass(frozen=True)
class ControlSettings:
    """The controller's constructor arguments, checked once."""

    policy: Policy | None
    bounds: Bounds
    guards: Sequence[GuardFactory] | None
    interval_s: float
    interval_batches: int | None
    service_seed: tuple[tuple[int, float], ...]
    shed_late: bool

    @classmethod
    def check(
        cls,
        slo: SLO | None,
        policy: Policy | None,
        bounds: Bounds | None,
        guards: Sequence[GuardFactory] | None,
        interval_ms: float,
        interval_batches: int | None,
        service_profile: str | os.PathLike[str] | Sequence[tuple[int, float]] | None,
        shed_late: bool,
        *,
        default_bounds: Bounds,
    ) -> ControlSettings:
        if policy is not None:
            check_policy(policy)
        elif slo is not None:
            from adaptive_batcher.policies.pid import PID

            policy = PID()
        if bounds is not None and not isinstance(bounds, Bounds):
            raise TypeError(f"bounds must be a Bounds, got {type(bounds).__name__}")
        if guards is not None:  # a tuple: a generator checked here would reach the controller empty
            guards = check_sequence("guards", guards, "guard factories")
            for guard in guards:
                check_callable("each guard", guard)
        shed_late = check_bool("shed_late", shed_late)
        if shed_late and slo is None:
            raise ValueError("shed_late=True needs an slo: shedding is relative to the SLO")
        return cls(
            policy=policy,
            bounds=bounds or default_bounds,
            guards=guards,
            interval_s=check_number("control_interval_ms", interval_ms, 0.0, strict=True) / 1e3,
            interval_batches=check_optional_int("control_interval_batches", interval_batches, 1),
            service_seed=_service_seed(service_profile),
            shed_late=shed_late,
        )


def check_policy(policy: object) -> None:
    if not (callable(getattr(policy, "decide", None)) and callable(getattr(policy, "reset", None))):
        raise TypeError(
            f"policy must be a Policy (with decide() and reset()), got {type(policy).__name__}"
        )


def _service_seed(
    profile: str | os.PathLike[str] | Sequence[tuple[int, float]] | None,
) -> tuple[tuple[int, float], ...]:
    """``(batch_size, median_ms)`` rows from a profile JSON path or the rows themselves."""
    if profile is None:
        return ()
    if isinstance(profile, str | os.PathLike):
        from adaptive_batcher.profile.report import load_profile

        result, _ = load_profile(profile)
        return tuple((row.batch_size, row.median_ms) for row in result.rows)
    rows = tuple((int(n), float(ms)) for n, ms in profile)
    if not rows or any(n < 1 or not ms > 0 for n, ms in rows):
        raise ValueError("service_profile needs rows of (batch_size >= 1, median_ms > 0)")
    return rows
