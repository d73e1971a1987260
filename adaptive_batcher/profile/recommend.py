"""Step 3 of the practitioners' method: keep a safety margin, and check the latency budget.

The rules (sources: the seed article's "sweep, find the knee, take ~80 % of the knee's window"
method, and the latency budget of an inference request: end-to-end latency = queueing (the
window) + preprocessing + compute, so window <= SLO - preprocess - compute(batch), with a safety
margin):

- **cap** = the knee's batch size. With an SLO whose budget the knee's compute does not fit, the
  cap is the largest profiled batch size, not above the knee, whose compute fits.
- **compute(n)** = the p99 batch latency measured at batch size n, so the tail of the compute time
  is budgeted, not only its median.
- **budget** = ``slo.latency_ms - slo.preprocess_ms``: what is left for queueing + compute.
- **window** = ``window_fraction * (budget - compute(cap))`` with an SLO; without one,
  ``window_fraction * median latency at the knee`` ("take ~80 % of the knee's window").

Two safety margins, not to be confused: ``window_fraction`` (here) is the share of the *window
that would fit* (the slack left after compute) that the recommended window takes, applied once,
offline; ``SLO.margin`` is the share of the *latency target* the online controller aims at
(``target_ms = margin * latency_ms``), applied at every control tick. ``recommend`` does not apply
``SLO.margin``: the controller does, on top, when it runs within the recommended bounds.
- When even the smallest profiled batch size (normally 1) does not fit the budget, the SLO cannot
  be met on this model and hardware: ``meets_slo`` is False, the cap is that smallest size and the
  window 0, and the first reason says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from adaptive_batcher._validate import (
    check_bool,
    check_in_range,
    check_int,
    check_number,
    check_strings,
)
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.profile.knee import Knee, find_knee
from adaptive_batcher.profile.result import ProfileResult, ProfileRow
from adaptive_batcher.slo import SLO, check_slo

__all__ = ["DEFAULT_WINDOW_FRACTION", "Recommendation", "controller_bounds", "recommend"]

DEFAULT_WINDOW_FRACTION: Final = 0.8
"""Share of the window that would fit that the recommended window takes: the seed article's
"take ~80 % of the knee's window". Not ``SLO.margin`` (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A batch cap and a batching window for a model, with the reasoning behind them.

    Attributes:
        max_batch_size: the recommended batch cap, items (>= 1).
        window_ms: the recommended batching window, ms (>= 0).
        slo_latency_ms: the SLO's latency target (at its percentile) the recommendation was
            checked against, ms, or None.
        meets_slo: False when even the smallest profiled batch size cannot meet the SLO; True
            otherwise (also when no SLO was given).
        reasons: the reasoning, one sentence per step; when ``meets_slo`` is False the first one
            is the warning (see :attr:`message`).
        noisy: True when the sweep it comes from was noisy (``ProfileResult.noisy``): the cap
            and window are then not reliable (see :attr:`noise_message`).
        warnings: the sweep's warnings (``ProfileResult.warnings``), stable wording.

    Raises:
        TypeError, ValueError: on a field of the wrong type or out of range (message names it).
    """

    max_batch_size: int
    window_ms: float
    slo_latency_ms: float | None
    meets_slo: bool
    reasons: tuple[str, ...]
    noisy: bool = False
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_int("Recommendation.max_batch_size", self.max_batch_size, 1)
        window = check_number("Recommendation.window_ms", self.window_ms, 0.0)
        object.__setattr__(self, "window_ms", window)
        if self.slo_latency_ms is not None:
            target = check_number(
                "Recommendation.slo_latency_ms", self.slo_latency_ms, 0.0, strict=True
            )
            object.__setattr__(self, "slo_latency_ms", target)
        object.__setattr__(
            self, "meets_slo", check_bool("Recommendation.meets_slo", self.meets_slo)
        )
        object.__setattr__(self, "reasons", check_strings("Recommendation.reasons", self.reasons))
        object.__setattr__(self, "noisy", check_bool("Recommendation.noisy", self.noisy))
        object.__setattr__(
            self, "warnings", check_strings("Recommendation.warnings", self.warnings)
        )

    @property
    def message(self) -> str | None:
        """The warning when the SLO cannot be met (the first reason), else None."""
        if self.meets_slo or not self.reasons:
            return None
        return self.reasons[0]

    @property
    def noise_message(self) -> str | None:
        """When :attr:`noisy`: a warning that the cap and window are NOT RELIABLE; else None."""
        if not self.noisy:
            return None
        return (
            f"recommendation NOT RELIABLE: cap {self.max_batch_size} and window "
            f"{self.window_ms:.2f} ms come from a noisy sweep (timings that did not settle, or "
            "a larger batch measurably faster than a smaller one; see the warnings). Rerun the "
            "profile on an idle machine, with fewer torch threads or more repeats, before "
            "using them"
        )

    def controller_bounds(self) -> Bounds:
        """The :class:`~adaptive_batcher.control.Bounds` for ``AdaptiveBatcher(bounds=...)``:
        same as :func:`controller_bounds` of this recommendation."""
        return controller_bounds(self)


def controller_bounds(recommendation: Recommendation) -> Bounds:
    """The range the online controller should stay within, as the
    :class:`~adaptive_batcher.control.Bounds` that ``AdaptiveBatcher(bounds=...)`` takes.

    The window ranges from 0 ms (dispatch what is queued as soon as the model is free: on the
    H200 measurements, resnet50 served under load, as good as or better than a 5 ms window) to
    the recommended window, which already keeps ``window_fraction`` of the slack inside the
    latency budget when an SLO was given. The cap ranges from 1 to the recommended cap; no
    buckets (``batch_sizes=()``): pass ``replace(bounds, batch_sizes=...)`` to add them.
    ``AdaptiveBatcher(model, max_batch_size=rec.max_batch_size, window_ms=rec.window_ms,
    bounds=rec.controller_bounds())`` starts the batcher at the recommendation.

    Raises:
        TypeError: ``recommendation`` is not a :class:`Recommendation`.
    """
    if not isinstance(recommendation, Recommendation):
        raise TypeError(
            f"recommendation must be a Recommendation, got {type(recommendation).__name__}"
        )
    return Bounds(
        min_window_ms=0.0,
        max_window_ms=recommendation.window_ms,
        min_batch_size=1,
        max_batch_size=recommendation.max_batch_size,
    )


def _items(value: float) -> str:
    return f"{value:,.0f} items/s"


def recommend(
    result: ProfileResult,
    slo: SLO | None = None,
    window_fraction: float = DEFAULT_WINDOW_FRACTION,
    *,
    knee: Knee | None = None,
) -> Recommendation:
    """Recommend a batch cap and a batching window from a sweep (rules in the module docstring).

    Args:
        result: a sweep with at least one row.
        slo: the latency objective to check against, or None.
        window_fraction: share of the window that would fit (the budget left after the cap's
            p99 compute; without an SLO, the knee's median batch latency) that the recommended
            window takes, in (0, 1]; 0.8 by default (the practitioners' "~80 % of the knee's
            window"). Not ``slo.margin``, which the online controller applies to the target
            (see the module docstring).
        knee: the knee to use; default :func:`find_knee` of ``result``.

    Returns:
        The :class:`Recommendation`, with its reasoning in ``reasons``, and the sweep's
        ``noisy`` flag and ``warnings`` carried over: from a noisy sweep it is computed by the
        same rules but flagged as not reliable (:attr:`Recommendation.noise_message`).

    Raises:
        TypeError: ``result`` is not a ProfileResult, ``slo`` not an SLO or None, ``knee`` not a
            Knee or None, ``window_fraction`` not a number.
        ValueError: ``result`` has no rows, ``window_fraction`` is outside (0, 1], or ``knee`` is
            not at a profiled batch size.
    """
    rec = _recommend(result, slo, window_fraction, knee)
    return replace(rec, noisy=result.noisy, warnings=result.warnings)


def _recommend(
    result: ProfileResult, slo: SLO | None, window_fraction: float, knee: Knee | None
) -> Recommendation:
    if not isinstance(result, ProfileResult):
        raise TypeError(f"result must be a ProfileResult, got {type(result).__name__}")
    check_slo(slo)
    m = check_in_range("window_fraction", window_fraction, 0.0, 1.0, open_low=True)
    if not result.rows:
        raise ValueError(
            "cannot recommend from a profile with no rows "
            f"(batch size {result.oom_batch_size} already ran out of memory)"
        )
    if knee is None:
        knee = find_knee(result)
    elif not isinstance(knee, Knee):
        raise TypeError(f"knee must be a Knee or None, got {type(knee).__name__}")
    if knee.batch_size not in result.batch_sizes:
        raise ValueError(
            f"knee batch size {knee.batch_size} is not among the profiled batch sizes "
            f"{list(result.batch_sizes)}"
        )
    knee_row = result.row(knee.batch_size)

    how = (
        "found by Kneedle"
        if knee.method == "kneedle"
        else "Kneedle found no knee; fallback: the smallest batch size near the max throughput, "
        "within find_knee's fallback_fraction (90 % by default)"
    )
    share = knee_row.items_per_s / result.max_items_per_s
    reasons = [
        f"knee of the throughput curve at batch {knee_row.batch_size}: "
        f"{_items(knee_row.items_per_s)}, {share:.0%} of the max {_items(result.max_items_per_s)}, "
        f"median {knee_row.median_ms:.2f} ms ({how})"
    ]
    if knee_row is result.rows[-1] and result.oom_batch_size is None and len(result.rows) > 1:
        reasons.append(
            f"the knee is the largest batch size profiled ({knee_row.batch_size}): throughput may "
            "still rise beyond it; profile larger batch sizes to find out"
        )
    if result.oom_batch_size is not None:
        reasons.append(f"batch {result.oom_batch_size} ran out of memory; the cap stays below it")

    if slo is None:
        window = m * knee_row.median_ms
        reasons.append(f"cap = the knee: {knee_row.batch_size}")
        reasons.append(
            f"no SLO given: window = window_fraction {m:g} x the knee's median batch latency "
            f"{knee_row.median_ms:.2f} ms = {window:.2f} ms "
            "(practitioners' method: take ~80 % of the knee's window)"
        )
        return Recommendation(knee_row.batch_size, window, None, True, tuple(reasons))

    budget = slo.room_ms
    budget_text = (
        f"latency budget for queueing + compute = SLO p{slo.percentile:g} {slo.latency_ms:g} ms "
        f"- preprocess {slo.preprocess_ms:g} ms = {budget:g} ms "
        "(end-to-end = queueing + preprocessing + compute)"
    )
    smallest = result.rows[0]
    if smallest.p99_ms > budget:
        warning = (
            f"SLO cannot be met: even batch {smallest.batch_size} takes p99 "
            f"{smallest.p99_ms:.2f} ms of compute, over the budget of {budget:g} ms "
            f"(SLO {slo.latency_ms:g} ms - preprocess {slo.preprocess_ms:g} ms); use a faster "
            f"model or hardware, or relax the SLO. Falling back to cap {smallest.batch_size}, "
            "window 0 ms"
        )
        return Recommendation(
            smallest.batch_size, 0.0, slo.latency_ms, False, (warning, *reasons, budget_text)
        )

    reasons.append(budget_text)
    cap_row: ProfileRow
    if knee_row.p99_ms <= budget:
        cap_row = knee_row
        reasons.append(
            f"compute at the knee (batch {knee_row.batch_size}, p99 {knee_row.p99_ms:.2f} ms) "
            f"fits the budget: cap = {knee_row.batch_size}"
        )
    else:
        fitting = [
            row
            for row in result.rows
            if row.batch_size <= knee_row.batch_size and row.p99_ms <= budget
        ]
        cap_row = fitting[-1]  # non-empty: the smallest row fits (checked above)
        reasons.append(
            f"compute at the knee (batch {knee_row.batch_size}, p99 {knee_row.p99_ms:.2f} ms) "
            f"exceeds the budget of {budget:g} ms: cap = the largest profiled batch size whose "
            f"p99 compute fits, {cap_row.batch_size} (p99 {cap_row.p99_ms:.2f} ms)"
        )
    window = max(m * (budget - cap_row.p99_ms), 0.0)
    reasons.append(
        f"window = window_fraction {m:g} x (budget {budget:g} ms - compute "
        f"{cap_row.p99_ms:.2f} ms) "
        f"= {window:.2f} ms"
    )
    return Recommendation(cap_row.batch_size, window, slo.latency_ms, True, tuple(reasons))
