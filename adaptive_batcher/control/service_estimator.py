"""The controller's online estimate of batch service time, ms, from the batches it has run.

:class:`ServiceTimeEstimator` fits the medians of recent batches per size (isotonic regression:
a larger batch never takes less time) and keeps the ratios of measured to predicted times, its
error bars. Its estimates, each in ms for a batch of ``n`` units (NaN before a fit), are named
by what quantile of what they are, as the ``Observation`` and ``Plan`` fields that carry them:

* :meth:`~ServiceTimeEstimator.median_ms`: the median; optimistic beyond the largest size seen,
  so that larger caps get explored;
* :meth:`~ServiceTimeEstimator.median_bound_ms`: the median, growing in proportion beyond the
  sizes known (never optimistic); the rest are it times a quantile of the ratios:
* :meth:`~ServiceTimeEstimator.spread_ms`: their ``spread_quantile`` (0.95), all batches;
* :meth:`~ServiceTimeEstimator.p99_ms`: their 99th percentile, all batches (stalls and spikes
  included);
* :meth:`~ServiceTimeEstimator.body_spread_ms`: the ``spread_quantile`` of the noise's body (a
  lognormal fitted robustly, which rare stalls leave alone);
* :meth:`~ServiceTimeEstimator.body_p999_ms`: the body's 99.9th percentile;
* :meth:`~ServiceTimeEstimator.mean_ms`: :meth:`~ServiceTimeEstimator.median_ms` times the
  ratios' mean (their 99th percentile caps each): the mean, what throughput rests on.

Isolated outliers (a batch that measured a stall of the event loop) are kept out of the
medians; a lasting change of every size's time (contention) moves its ``level``. The law, the
figures behind the constants and their sources: docs/policies.md, "The service-time model".
The simulator's ground truth is :class:`~adaptive_batcher.sim.service.ServiceModel` (seconds).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from statistics import NormalDist

import numpy as np

from adaptive_batcher.metrics.recorder import BatchSample

__all__ = [
    "CATCH_UP_MAX_S",
    "CHANGE_ALPHA",
    "CHANGE_RATIO",
    "END_STEP_Z",
    "JUDGE_SIGMA_MAX",
    "KNOWN_SPAN",
    "MAX_LEVEL",
    "OPTIMISM",
    "OUTLIER_CONFIRM",
    "OUTLIER_ELASTICITY_MIN",
    "OUTLIER_FACTOR",
    "OUTLIER_LEVERAGE",
    "OUTLIER_MEMORY",
    "OUTLIER_WINDOW",
    "P99_QUANTILE",
    "P99_Z",
    "P999_Z",
    "REFINE_AFTER",
    "REFINE_MEMORY",
    "REFINE_STEP",
    "SEED_ALPHA",
    "SUSPECT_KEEP_MIN",
    "SUSPECT_MEMORY",
    "ServiceTimeEstimator",
    "isotonic_fit",
]

OPTIMISM = 0.25  # least slope beyond the observed range, as a fraction of proportional growth
_TABLE_SIZES = 4096  # at most this many sizes predicted at once after a refit

END_STEP_Z = 2.0
"""A step at the top of the isotonic fit is kept when it exceeds this many standard errors of
the noise (see :func:`isotonic_fit`)."""

_MEDIAN_SD_FACTOR = math.sqrt(math.pi / 2)  # a median of k values: ~1.25 sigma / sqrt(k)

OUTLIER_FACTOR = 3.0
"""A batch measured above ``OUTLIER_FACTOR`` times the noise body's ``spread_quantile`` (see
:meth:`ServiceTimeEstimator.body_spread_ms`) times its prediction is an outlier."""

OUTLIER_WINDOW = 8
"""Recent batches among which outliers are counted."""

OUTLIER_ELASTICITY_MIN = 8
"""Recent outliers needed before :attr:`ServiceTimeEstimator.outlier_elasticity` is measured."""

OUTLIER_MEMORY = 32
"""Recent outliers behind :attr:`ServiceTimeEstimator.outlier_elasticity`."""

HELD_STALLS = 16
"""The latest held-out stalls listed in :attr:`ServiceTimeEstimator.recent_stalls`."""

OUTLIER_LEVERAGE = math.log(1.25)
"""The least log-ratio between the predicted times of the longer and the shorter half of the
outliers for their elasticity to be measured (batches of about the same time cannot show how
an outlier's excess grows with the batch)."""

OUTLIER_CONFIRM = 5
"""Outliers of one direction (slow or fast) among the last ``OUTLIER_WINDOW`` batches that make
them a change of service time, not isolated ones (a stall spans one batch per execution
slot)."""

CHANGE_RATIO = 1.5
"""A batch beyond this ratio to its prediction either way (or beyond the noise body's 99.9th
percentile, if that is wider) is suspect: ``OUTLIER_CONFIRM`` of them in one direction among
the last ``OUTLIER_WINDOW`` batches are a change of level (see
:attr:`ServiceTimeEstimator.level`)."""

KNOWN_SPAN = 2.0
"""The widest ratio between two fitted sizes across which the fit's chord judges a batch of a
size between them (see :meth:`ServiceTimeEstimator.update`)."""

SUSPECT_MEMORY = 256
"""Batches before the last ``OUTLIER_WINDOW``, since the last change of level, whose rate of
suspects a run of them is judged against (see :meth:`ServiceTimeEstimator.update`)."""

CHANGE_ALPHA = 1e-4
"""How unlikely a run of suspects must be, at their earlier rate, to be a change of level."""

JUDGE_SIGMA_MAX = 0.5
"""The widest noise body (its sigma) that the bounds for outliers and suspects are drawn from: a
wider spread of measured / predicted ratios is the fit being wrong at some sizes (a few samples
of a size, some of them 10x spikes), not a device's noise, and bounds drawn from it let every
spike in (docs/policies.md, "Changes of level")."""

SEED_ALPHA = 0.01
"""While the fit rests on a seed alone (a profile, or the warm-up's batches), how unlikely the
suspects of one direction among the batches so far must be if they were at most half of them,
to be a change of the seed's level (see :meth:`ServiceTimeEstimator.update`)."""

SUSPECT_KEEP_MIN = 3
"""The fewest samples a size must have for a slow suspect of it, unconfirmed, to join them."""

MAX_LEVEL = 1e3
"""The most :attr:`ServiceTimeEstimator.level` may move from 1, either way."""

CATCH_UP_MAX_S = 5.0
"""The longest a loop is taken to need after a stall to catch up with what the stall held back
(see :meth:`ServiceTimeEstimator.update`), s."""

MAX_TAKEN = 64
"""The most batches one update takes in, evenly spread over those new since the last (the
newest included), so that the controller's tick holds the event loop a bounded time whatever
the batch rate (docs/policies.md, "The service-time estimates")."""

REFINE_AFTER = 16
"""Batches after a change of level (those that confirmed it not counted), of sizes an earlier
epoch ran, whose times first say how far that epoch's samples are off (see
:meth:`ServiceTimeEstimator.update`)."""

REFINE_MEMORY = 256
"""The most recent of those batches that keep saying it."""

REFINE_STEP = 0.005
"""The least change of an epoch's correction that rescales its samples."""


P999_Z = 3.09
"""Standard normal quantile of :meth:`ServiceTimeEstimator.body_p999_ms` (99.9 %); why 99.9 %:
docs/policies.md, "The service-time model"."""

P99_QUANTILE = 0.99
"""Quantile of the measured / predicted ratios behind :meth:`ServiceTimeEstimator.p99_ms`."""

P99_Z = NormalDist().inv_cdf(P99_QUANTILE)
"""Standard normal quantile of ``P99_QUANTILE``: the noise body's 99th percentile, the least
:meth:`ServiceTimeEstimator.p99_ms` of a pause that does not scale with the batch."""

_CUSUM_LIMIT = math.log(1.0 / CHANGE_ALPHA)  # a CUSUM of suspects past it is a change

_REFERENCE_MIN = 3  # samples of a size that make its median a reference for a lone sample
_LONE_ALPHA = 0.01  # held out of one size at the rate of outliers, less likely: its time
_GAP_VERDICTS = 16  # first samples' verdicts kept per gap between measured sizes
_TORN_MAX = 8  # samples of a size whose median may be mostly stalls where stalls are common
_NORMAL = NormalDist()
_NORMAL_MAD = 0.6745  # median absolute deviation of a standard normal distribution


class ServiceTimeEstimator:
    """The controller's online estimate of batch service time, ms, from batch size (units).

    Not the simulator's :class:`~adaptive_batcher.sim.service.ServiceModel` (the simulated
    device's true service time, seconds): this one is learnt from measured batches.

    Args:
        min_samples: batches needed before the model predicts anything but NaN (or the seed).
        refit_every: refit after this many new batches (a fit costs tens of microseconds).
        seed: optional prior ``(batch_size, median_ms)`` rows, e.g. from ``adaptive-batcher
            profile``; used until enough batches have been seen, and blended in afterwards for
            sizes never observed.
        per_size: recent samples kept per batch size.
        spread_quantile: the quantile of measured / predicted ratios that sets the error bars,
            in (0.5, 1).
        spread_window: batches whose ratios are kept for it.

    ``outliers_held_out`` counts the isolated outliers kept out of the per-size samples.

    Raises:
        ValueError: ``min_samples`` < 1 or ``refit_every`` < 1.
    """

    def __init__(
        self,
        min_samples: int = 8,
        refit_every: int = 8,
        seed: Sequence[tuple[int, float]] = (),
        per_size: int = 32,
        spread_quantile: float = 0.95,
        spread_window: int = 512,
    ) -> None:
        if min_samples < 1 or refit_every < 1:
            raise ValueError("min_samples and refit_every must be >= 1")
        self.min_samples = min_samples
        self.refit_every = refit_every
        self.per_size = per_size
        self._reservoir: dict[int, deque[float]] = {}
        self._kept = 0  # samples in all the reservoirs
        self._lone_held_out: dict[int, int] = {}  # per size, samples held out as lone stalls
        self._judged: dict[int, int] = {}  # per sparse size, its samples judged so far
        # per gap between measured sizes (by the one below), whether its first samples were beyond
        self._gap_verdicts: dict[int, deque[bool]] = {}
        self._fastest_z: dict[int, float] = {}  # per count of samples, see _fast_noise
        self._median_of: dict[int, float] = {}  # reservoir medians, dropped when one changes
        self._cache: dict[int, float] = {}
        # the sizes first, first + 1, ... interpolated at the last refit (see _predict_inside)
        self._inside_first = 0
        self._inside: list[float] = []
        self._seed = sorted((int(n), float(ms)) for n, ms in seed)
        self._seen_total = 0
        self._fitted_at = -refit_every
        self._sizes = np.empty(0)
        self._fitted_sizes: list[int] = []  # the same sizes, for a bisection per batch
        self._medians = np.empty(0)
        # the fit's (first size, last size, its time at the first, at the last) as floats
        self._ends: tuple[float, float, float, float] | None = None
        self.samples = 0
        self.spread_quantile = spread_quantile
        self._ratios: deque[float] = deque(maxlen=spread_window)
        self._ordered_ratios: list[float] = []  # the same ratios, kept sorted
        # the predicted time of each ratio's batch, ms (parallel to _ratios), for the excesses
        self._ratio_predictions: deque[float] = deque(maxlen=spread_window)
        # (ratios taken when computed, (the excess's p99, its capped mean), ms)
        self._excess = (-1, (0.0, 0.0))
        self._excesses: tuple[int, tuple[float, ...]] = (-1, ())  # (ratios taken, excesses)
        self._quantiles: dict[float, float] = {}  # raw quantiles of the ratios, by quantile
        self._quantiles_at = 0  # the ratios taken when they were computed
        self._spread_z = NormalDist().inv_cdf(spread_quantile)
        self._body = (1.0, 0.0)
        self._body_at = 0  # the ratios taken when the body was last fitted
        # the ratios of the batches of sizes the fit knows (see _known), for mean_ratio
        self._known_ratios: deque[float] = deque(maxlen=spread_window)
        self._mean, self._mean_at = 1.0, -1  # mean_ratio, and the ratios taken then
        self._ratios_taken = 0
        self._floor: dict[int, float] = {}  # the lowest fitted time seen per observed size
        self.contention = 1.0
        # the direction of each recent batch: 1 a slow outlier, -1 a fast one, 0 neither, and
        # its (units, ms)
        self._recent_outliers: deque[int] = deque(maxlen=OUTLIER_WINDOW)
        self._recent_batches: deque[tuple[int, float]] = deque(maxlen=OUTLIER_WINDOW)
        # the batches before those since the last change of level, what a run of suspects is
        # judged against (see _confirms_change), and their directions as the fit and error
        # bars of _judged_by judge them (re-judged when those change)
        self._earlier: deque[tuple[int, float]] = deque(maxlen=SUSPECT_MEMORY)
        self._earlier_judged: deque[int] = deque(maxlen=SUSPECT_MEMORY)
        self._fit_version = 0  # bumped whenever the predictions change
        self._judged_by: tuple[int, float, float] | None = None
        self._cusum = {1: 0.0, -1: 0.0}  # per direction, see _note_suspects
        # suspect batches held out: (batch number, units, ms, ratio to the prediction,
        # direction, whether an outlier)
        self._held: deque[tuple[int, int, float, float, int, bool]] = deque()
        self.level = 1.0  # every size's time over the fitted shape's (see _change_level)
        # the changes of level so far, and per size the change after which each sample was
        # taken (parallel to its reservoir); see _refine_level
        self._epoch = 0
        self._epochs: dict[int, deque[int]] = {}
        # per epoch before the current: its samples' median per size at the last change (the
        # seed's rows are epoch 0's where it had none), until refined
        self._anchors: dict[int, dict[int, float]] = {}
        # per epoch in _anchors: the ratios of the latest samples taken since to its medians,
        # and the correction given to its samples so far
        self._ratios_to: dict[int, deque[float]] = {}
        self._corrected: dict[int, float] = {}
        self._seed_scale = 1.0  # epoch 0's corrections, for the seed's rows
        self.level_changes = 0
        self._taken = 0
        self.outliers_held_out = 0
        self.outliers_seen = 0
        # (end_s, excess_ms) of the latest batches held out as stalls: when each ended, and by
        # how much it outlasted its prediction
        self.recent_stalls: deque[tuple[float, float]] = deque(maxlen=HELD_STALLS)
        self._outliers: deque[tuple[float, float]] = deque(maxlen=OUTLIER_MEMORY)
        self._elasticity = (0, math.nan)  # (outliers seen when measured, the elasticity)
        self._alike = (0, False)  # (outliers seen when judged, whether alike in ms)
        if self._seed:
            self._fit_points([n for n, _ in self._seed], [ms for _, ms in self._seed], None)

    def update(
        self,
        batches: Sequence[BatchSample],
        total_seen: int,
        stall: tuple[float, float] = (-math.inf, -math.inf),
        run_size: Callable[[int], int] | None = None,
    ) -> None:
        """Take in the batches recorded since the last call and refit if due.

        ``batches`` are the most recent batch samples (oldest first) and ``total_seen`` the
        running count of batches ever recorded; the samples new since the last call (at most
        :data:`MAX_TAKEN` of them, evenly spread) are kept in a small per-size reservoir
        (``per_size`` most recent each), so sizes seen long ago stay known when one size
        dominates for a while. A batch that ran across ``stall`` (the latest stall of the
        event loop, ``(start_s, end_s)``), or began before the loop can have caught up with it
        (as long after its end as it lasted, at most ``CATCH_UP_MAX_S``), is left out: it
        measured the stall, not the model. ``run_size``
        maps a batch's units to the size the model ran (its bucket, padding included; None:
        the units): the service time is that size's. A time that is negative, NaN or
        infinite (a broken clock) is left out.
        """
        new = min(total_seen - self._seen_total, len(batches))
        self._seen_total = total_seen
        # the error bars as last read (reading them here would move when they are recomputed)
        outlier_ratio, change_ratio = math.inf, math.inf
        if self._ends is not None:
            outlier_ratio = OUTLIER_FACTOR * self._body_quantile(self._spread_z, JUDGE_SIGMA_MAX)
            change_ratio = min(
                outlier_ratio, max(CHANGE_RATIO, self._body_quantile(P999_Z, JUDGE_SIGMA_MAX))
            )
        stall_start, stall_end = stall
        caught_up = stall_end + min(stall_end - stall_start, CATCH_UP_MAX_S)
        for sample in _spread(batches, new, MAX_TAKEN):
            if sample.end_s >= stall_start and sample.end_s - sample.service_s <= caught_up:
                continue  # it ran across a stall of the loop, or before the loop caught up
            measured_ms = float(sample.service_s) * 1e3  # a numpy clock gives numpy floats
            if not 0.0 <= measured_ms < math.inf:
                continue  # a broken clock's reading measures nothing
            units = (
                sample.units if run_size is None or sample.units <= 0 else run_size(sample.units)
            )
            if units <= 0:
                continue
            excess_ms = self._take(units, measured_ms, outlier_ratio, change_ratio)
            if excess_ms is not None:
                self.recent_stalls.append((sample.end_s, excess_ms))
        count = self._kept
        if total_seen - self._fitted_at < self.refit_every or count < self.min_samples:
            return
        self._fitted_at = total_seen
        self._refine_level()
        self._hold_out_lone_outliers(outlier_ratio)
        self.samples = self._kept
        sizes = sorted(self._reservoir)
        medians = [self._median_at(n) for n in sizes]
        counts = [float(len(self._reservoir[n])) for n in sizes]
        for n, ms in self._seed:  # prior points for sizes outside the observed range
            if n < sizes[0] or n > sizes[-1]:
                sizes.append(n)
                medians.append(ms * self._seed_scale)
                counts.append(1.0)
        observed_max = max(self._reservoir)
        order = sorted(range(len(sizes)), key=sizes.__getitem__)
        self._fit_points(
            [sizes[i] for i in order],
            [medians[i] for i in order],
            [counts[i] for i in order],
            observed_max,
        )
        self._note_level()

    @property
    def last_stall_s(self) -> float:
        """When the latest batch held out as an isolated outlier (a stall) ended, s (-inf:
        none, or those held out turned out to be a change of level)."""
        return self.recent_stalls[-1][0] if self.recent_stalls else -math.inf

    def _hold_out_lone_outliers(self, outlier_ratio: float) -> None:
        """Hold out the samples of a size measured fewer than ``_REFERENCE_MIN`` times (too
        few for a median that ignores a stall) that are beyond ``outlier_ratio`` times the most
        it can take (see :meth:`_lone_limits_ms`). Sizes measured a few more times whose median
        is beyond that much of their fastest sample are judged so too, where stalls are common
        enough that most of their samples may be stalls. The first batch of a size beyond the
        fit is judged against an optimistic prediction, so a stall there stood as the size's
        time, and the tail cap kept the size from running again. Samples held out more often
        than the rate of outliers among the batches of sizes the fit knows makes likely (below
        ``_LONE_ALPHA``) are the sizes' time, not stalls: so for a size (a model that slows
        down past it) and for the sizes between two measured ones (a jump in time that each
        size between would otherwise pay for on its own)."""
        if not outlier_ratio < math.inf:
            return
        reservoir = self._reservoir
        few, torn = set(), []
        for size, kept in reservoir.items():
            if len(kept) < _REFERENCE_MIN:
                few.add(size)
            elif len(kept) < _TORN_MAX and self._torn(size, kept, outlier_ratio):
                torn.append(size)
        if not (few or torn):
            return  # the common case once every size has run: no pass over the ratios
        known = self._known_ratios  # not the sizes beyond the fit: held out, they would count
        stalls = sum(1 for ratio in known if ratio > outlier_ratio)
        rate = _rate_seen(stalls, len(known))
        few.update(n for n in torn if _stalls_may_be_most(len(reservoir[n]), rate))
        reference = [n for n in sorted(reservoir) if n not in few]
        allowed = math.ceil(math.log(_LONE_ALPHA) / math.log(rate))
        limits = self._lone_limits_ms(sorted(few), reference, outlier_ratio)
        believed = {gap for *_, gap in limits.values() if self._gap_believed(gap, rate)}
        for size, (firm_ms, grown_ms, gap) in limits.items():
            if grown_ms < firm_ms:  # only an extrapolation can miss a jump
                self._note_verdicts(size, gap, grown_ms)
            limit_ms = firm_ms if gap in believed else min(firm_ms, grown_ms)
            if limit_ms < math.inf:
                self._hold_out_beyond(size, limit_ms, allowed - self._lone_held_out.get(size, 0))
                self._judged[size] = len(reservoir.get(size, ()))
        for size in [n for n in self._judged if n not in limits]:
            del self._judged[size]  # measured often enough: judged anew if it ever is again

    def _lone_limits_ms(
        self, few: list[int], reference: list[int], outlier_ratio: float
    ) -> dict[int, tuple[float, float, int]]:
        """Per size of ``few`` (ascending), ``outlier_ratio`` times the most a batch of it can
        take, ms (inf: unbounded), as ``(firm, grown, gap)``, the gap being the ``reference``
        size below it (0: none). Firm, as a larger batch never takes
        less time: the least of the next larger ``reference`` size's median and the fastest
        sample of the size or of any larger size of ``few`` (fast by accident only within the
        noise: see :meth:`_fast_noise`). Grown: :meth:`_grown_bound_ms`, which a jump in time
        between two sizes outgrows."""
        fastest_ms, samples, limits = math.inf, 0, {}
        for size in reversed(few):
            kept = self._reservoir[size]
            fastest_ms, samples = min(fastest_ms, min(kept)), samples + len(kept)
            above = bisect_left(reference, size)
            larger_ms = self._median_at(reference[above]) if above < len(reference) else math.inf
            firm_ms = min(larger_ms, self._fast_ceiling_ms(fastest_ms, samples))
            grown_ms = self._grown_bound_ms(size, reference, above)
            gap = reference[above - 1] if above > 0 else 0
            limits[size] = (outlier_ratio * firm_ms, outlier_ratio * grown_ms, gap)
        return limits

    def _torn(self, size: int, kept: deque[float], outlier_ratio: float) -> bool:
        """Whether ``size``'s few samples (``kept``, ms) put its median beyond ``outlier_ratio``
        times its fastest sample (allowed the noise, :meth:`_fast_noise`): most of them may be
        stalls."""
        median_ms = self._median_at(size)
        if not median_ms > outlier_ratio * min(kept):
            return False
        return median_ms > outlier_ratio * self._fast_ceiling_ms(min(kept), len(kept))

    def _fast_ceiling_ms(self, fastest_ms: float, samples: int) -> float:
        """The most a batch takes whose size ran as fast as ``fastest_ms`` (or a larger size
        did) in one of ``samples`` batches, ms: ``fastest_ms`` over :meth:`_fast_noise`; inf
        where the noise's body is at 0 (batches measured at 0 ms)."""
        noise = self._fast_noise(samples)
        return fastest_ms / noise if noise > 0.0 else math.inf

    def _fast_noise(self, samples: int) -> float:
        """The measured / predicted ratio that the noise's :meth:`body` leaves the fastest of
        ``samples`` batches below as rarely as the outlier bound leaves one batch above (one
        minus its ``spread_quantile``), at most 1."""
        median, sigma = self.body()
        if sigma <= 0.0:
            return min(1.0, median)
        z = self._fastest_z.get(samples)
        if z is None:
            z = self._fastest_z[samples] = _NORMAL.inv_cdf(
                1.0 - (1.0 - self.spread_quantile) / samples
            )
        return min(1.0, median * math.exp(-z * sigma))

    def _note_verdicts(self, size: int, gap: int, limit_ms: float) -> None:
        """Note, for the gap ``size`` lies in, whether each sample of ``size`` not judged
        before is beyond ``limit_ms``."""
        verdicts = self._gap_verdicts.get(gap)
        if verdicts is None:
            verdicts = self._gap_verdicts[gap] = deque(maxlen=_GAP_VERDICTS)
        verdicts.extend(
            ms > limit_ms for ms in islice(self._reservoir[size], self._judged.get(size, 0), None)
        )

    def _gap_believed(self, gap: int, rate: float) -> bool:
        """Whether the first samples of the sizes in ``gap`` were beyond their limits so much
        more often than ``rate`` (in the last ``_GAP_VERDICTS`` judged) that they are the
        sizes' time: a binomial tail below ``_LONE_ALPHA``."""
        verdicts = self._gap_verdicts.get(gap, ())
        beyond = sum(verdicts)
        return beyond > 0 and _binomial_tail(len(verdicts), beyond, rate) < _LONE_ALPHA

    def _grown_bound_ms(self, size: int, reference: list[int], above: int) -> float:
        """The most a batch of ``size`` takes if the time per unit does not grow from the
        ``reference`` size below it (``above``: the index of the next larger one), ms; inf
        where that one is more than ``KNOWN_SPAN`` times smaller (a convex model outgrows
        it)."""
        below = reference[above - 1] if above > 0 else 0
        if not below or size > KNOWN_SPAN * below:
            return math.inf
        return self._median_at(below) * size / below

    def _hold_out_beyond(self, size: int, limit_ms: float, most: int) -> None:
        """Hold out the samples of ``size`` beyond ``limit_ms``, the slowest first and at most
        ``most`` of them, counting them."""
        reservoir = self._reservoir
        samples = list(reservoir[size])
        beyond = sorted(
            (i for i, ms in enumerate(samples) if ms > limit_ms), key=samples.__getitem__
        )
        dropped = set(beyond[max(0, len(beyond) - most) :]) if most > 0 and limit_ms > 0 else set()
        if not dropped:
            return
        self._lone_held_out[size] = self._lone_held_out.get(size, 0) + len(dropped)
        self._kept -= len(dropped)
        self.outliers_held_out += len(dropped)
        self._median_of.pop(size, None)
        self._floor.pop(size, None)
        if len(dropped) == len(samples):
            del reservoir[size], self._epochs[size]
            return
        epochs = list(self._epochs[size])
        kept = [i for i in range(len(samples)) if i not in dropped]
        reservoir[size] = deque((samples[i] for i in kept), maxlen=self.per_size)
        self._epochs[size] = deque((epochs[i] for i in kept), maxlen=self.per_size)

    def _take(
        self, units: int, measured_ms: float, outlier_ratio: float, change_ratio: float
    ) -> float | None:
        """One batch's time: into the error bars, and into its size's samples unless it is
        suspect (beyond ``change_ratio`` either way: held until it is either part of a change
        of level or old) or an isolated outlier (beyond ``outlier_ratio``: dropped; see
        docs/policies.md). A size the fit does not know (see :meth:`_known`) is suspect only
        as a slow outlier, and enters the error bars only as one. If it is held out as a slow
        outlier (a stall): by how much it outlasted its prediction, ms; else None."""
        direction, ratio, outlier, predicted = 0, math.nan, False, math.nan
        if outlier_ratio < math.inf:
            predicted = self.median_ms(units)
            if predicted > 0:
                ratio = measured_ms / predicted
                # beyond the sizes known the prediction is optimistic on purpose: no outliers
                inside = self._ends is not None and units <= self._ends[1]
                known = not inside or self._known(units)
                if known or ratio > outlier_ratio:  # a chord's error is no noise, a stall is
                    self._note_ratio(ratio, predicted)
                if inside and known:
                    self._known_ratios.append(ratio)
                direction = self._direction(units, ratio, outlier_ratio, change_ratio)
                if inside and ratio > outlier_ratio:
                    outlier = True  # a batch is never fast by accident
                    self._outliers.append((predicted, measured_ms - predicted))
                    self.outliers_seen += 1
        self._taken += 1
        self._remember(units, measured_ms, direction, (outlier_ratio, change_ratio))
        if outlier_ratio < math.inf:
            self._note_suspects(direction, outlier_ratio, change_ratio)
        self._release_aged()
        if direction == 0:
            self._keep(units, measured_ms)
            return None
        self._held.append((self._taken, units, measured_ms, ratio, direction, outlier))
        stall = outlier and direction > 0
        self.outliers_held_out += stall
        if self._confirms_change(direction, outlier_ratio, change_ratio):
            self._change_level(direction, outlier_ratio, change_ratio)  # it has changed
            return None
        return measured_ms - predicted if stall else None

    def _direction(
        self, units: int, ratio: float, outlier_ratio: float, change_ratio: float
    ) -> int:
        """Whether a batch of ``units`` measured at ``ratio`` times its prediction is a slow
        suspect (1), a fast one (-1) or neither (0). Beyond the fitted sizes the prediction is
        optimistic on purpose: no suspects; at a size the fit does not know (see
        :meth:`_known`) a chord's error is within ``outlier_ratio`` and a stall beyond."""
        ends = self._ends
        if ends is None or units > ends[1] or math.isnan(ratio):
            return 0
        if self._known(units):
            return (ratio > change_ratio) - (ratio * change_ratio < 1.0)
        return int(ratio > outlier_ratio)

    def _remember(
        self, units: int, measured_ms: float, direction: int, bars: tuple[float, float]
    ) -> None:
        """A batch into the recent window; the oldest one there into the memory of earlier
        batches (with its direction now, if the memory's are current for ``bars``)."""
        recent, batches = self._recent_outliers, self._recent_batches
        if len(recent) == recent.maxlen:
            self._earlier.append(batches[0])
            if self._judged_by == (self._fit_version, *bars):
                self._earlier_judged.append(self._judge(*batches[0], *bars))
        recent.append(direction)
        batches.append((units, measured_ms))

    def _judge(
        self, units: int, measured_ms: float, outlier_ratio: float, change_ratio: float
    ) -> int:
        """The direction of a batch of ``units`` that took ``measured_ms``, by today's fit."""
        predicted = self.median_ms(units)
        ratio = measured_ms / predicted if predicted > 0 else math.nan
        return self._direction(units, ratio, outlier_ratio, change_ratio)

    def _known(self, units: int) -> bool:
        """Whether the fit's prediction for ``units`` is close enough to a measurement to judge
        a batch by: a size fitted itself, or one between two fitted sizes at most
        ``KNOWN_SPAN`` times apart. Elsewhere the prediction is a chord or a flat extension
        of a curve (a convex one's chord is far above it: ``1 + 0.02 n**2`` ms fitted at 1 and
        32 predicts 1.78 times the time at 16), which a batch's time contradicts without any
        change of level."""
        sizes = self._fitted_sizes
        above = bisect_left(sizes, units)
        if above < len(sizes) and sizes[above] == units:
            return True
        return 0 < above < len(sizes) and sizes[above] <= KNOWN_SPAN * sizes[above - 1]

    def _confirms_change(self, direction: int, outlier_ratio: float, change_ratio: float) -> bool:
        """Whether the suspects of ``direction`` among the last ``OUTLIER_WINDOW`` batches are a
        change of service time: at least ``OUTLIER_CONFIRM`` of them, and

        * while the fit rests on a seed alone (no measured batch has refitted it: the seed's
          level is in question), more than half of all the batches judged so far are suspects
          of that direction (a binomial tail at 1/2 below ``SEED_ALPHA``);
        * else, so many are unlikely at the rate of such suspects, by today's fit and error
          bars, among the earlier batches since the last change (at most ``SUSPECT_MEMORY``):
          a beta-binomial tail (the rate's uniform prior updated by those batches) below
          ``CHANGE_ALPHA``, or a CUSUM of the suspects against that rate past
          ``log(1 / CHANGE_ALPHA)`` (see :meth:`_note_suspects`).

        Why: docs/policies.md, "Changes of level"."""
        count = self._recent_outliers.count(direction)
        if count < OUTLIER_CONFIRM:
            return False
        seed_only = bool(self._seed) and self.samples == 0
        if not seed_only and self._cusum[direction] >= _CUSUM_LIMIT:
            return True
        alike, earlier = self._earlier_suspects(direction, outlier_ratio, change_ratio)
        if seed_only:  # most batches so far against the seed's level
            judged = earlier + len(self._recent_outliers)
            return _binomial_tail(judged, alike + count, 0.5) < SEED_ALPHA
        tail = _beta_binomial_tail(OUTLIER_WINDOW, count, 1.0 + alike, 1.0 + earlier - alike)
        return tail < CHANGE_ALPHA

    def _earlier_suspects(
        self, direction: int, outlier_ratio: float, change_ratio: float
    ) -> tuple[int, int]:
        """The suspects of ``direction`` among the earlier batches since the last change, by
        today's fit and error bars, and how many batches those are."""
        bars = (self._fit_version, outlier_ratio, change_ratio)
        if self._judged_by != bars or len(self._earlier_judged) != len(self._earlier):
            self._earlier_judged = deque(
                (
                    self._judge(units, ms, outlier_ratio, change_ratio)
                    for units, ms in self._earlier
                ),
                maxlen=SUSPECT_MEMORY,
            )
            self._judged_by = bars
        return self._earlier_judged.count(direction), len(self._earlier_judged)

    def _note_suspects(self, direction: int, outlier_ratio: float, change_ratio: float) -> None:
        """One batch into the CUSUM of each direction (Page, 1954): the log-likelihood ratio
        of the batch being a suspect at rate ``(1 + p) / 2`` against the earlier rate ``p``
        (the posterior mean, uniform prior), summed and floored at 0. A run too short to be
        unlikely in ``OUTLIER_WINDOW`` batches where suspects are common (10x spikes on 30 %
        of batches: 8 of 8 at 6.6e-5) adds up over a longer one: a slowdown under such
        spikes confirms after about 14 batches, where 8 of 8 could not."""
        for side in (1, -1):
            total = self._cusum[side]
            if direction != side and total == 0.0:
                continue  # a batch not suspect in this direction only lowers it
            alike, earlier = self._earlier_suspects(side, outlier_ratio, change_ratio)
            rate = _rate_seen(alike, earlier)
            changed = (1.0 + rate) / 2.0
            if direction == side:
                total += math.log(changed / rate)
            else:
                total += math.log((1.0 - changed) / (1.0 - rate))
            self._cusum[side] = max(0.0, total)

    def _release_aged(self) -> None:
        """The suspect batches that left the last ``OUTLIER_WINDOW`` with no change of level:
        kept as samples, but for the outliers (isolated ones: never counted) and slow ones of
        a size with fewer than ``SUSPECT_KEEP_MIN`` samples, whose median they would set (a
        stall of 2.5x on the one batch of 113 that had run lifted the fit at 128 by half)."""
        held, oldest = self._held, self._taken - OUTLIER_WINDOW
        while held and held[0][0] <= oldest:
            _, units, measured_ms, _, direction, outlier = held.popleft()
            few = len(self._reservoir.get(units, ())) < SUSPECT_KEEP_MIN
            if not outlier and not (direction > 0 and few):
                self._keep(units, measured_ms)

    def _change_level(self, direction: int, outlier_ratio: float, change_ratio: float) -> None:
        """The recent suspect batches of ``direction`` (1: slow, -1: fast) are a change of
        service time, not isolated ones: every size's time is rescaled by their median ratio
        to the prediction (see :meth:`_change_ratio`), and they are kept as samples (see the
        module docstring)."""
        confirming = [entry for entry in self._held if entry[4] == direction]
        alike, earlier = self._earlier_suspects(direction, outlier_ratio, change_ratio)
        usual = alike / earlier if earlier else 0.0
        ratio = _change_ratio([entry[3] for entry in confirming], direction, usual)
        self._anchors = self._epoch_medians()
        self._epoch += 1
        level = min(MAX_LEVEL, max(1.0 / MAX_LEVEL, self.level * ratio))
        factor, self.level = level / self.level, level  # batches measured at 0 ms included
        self.level_changes += 1
        self._cache = {}
        self._fit_version += 1
        for _, units, measured_ms, ratio, _, _ in confirming:
            self._replace_ratio(ratio, factor)
            self._keep(units, measured_ms)
        self._held = deque(entry for entry in self._held if entry[4] != direction)
        self._ratios_to, self._corrected = {}, {}  # the batches that set it do not judge it
        if direction > 0:
            self.outliers_held_out -= sum(entry[5] for entry in confirming)
            self.recent_stalls.clear()  # they were no isolated stalls after all
        # a new epoch, whose suspects are judged against its own batches: the confirming ones
        # first, and the rest of the window (before the change) forgotten
        self._earlier = deque(
            (
                batch
                for d, batch in zip(self._recent_outliers, self._recent_batches, strict=True)
                if d == direction
            ),
            maxlen=SUSPECT_MEMORY,
        )
        self._earlier_judged.clear()
        self._cusum = {1: 0.0, -1: 0.0}
        self._recent_outliers.clear()
        self._recent_batches.clear()

    def _refine_level(self) -> None:
        """A change of level is judged on its first few batches (a batch that began before a
        slowdown looks less slow than the slowdown is; batch sizes slow down by different
        ratios), and every sample taken before it was divided by a level judged so. Once
        ``REFINE_AFTER`` batches of sizes that an earlier epoch (the span between two changes;
        the seed's rows count as the first) ran have come since, the median ratio of their
        times (the last ``REFINE_MEMORY``) to that epoch's medians at the change at their
        sizes is how far its samples are off now. Where they are too slow, they follow it
        (every size's, and the seed's rows for the first epoch), never above their own
        times: a size too slow may never run again (the tail cap stays below it), so it would
        keep the misjudgement for good. A size too fast corrects itself: a cap raised on it
        runs it. Why epochs: after a slowdown the sizes it ran hold its
        samples, and only the ones from before it tell the level of the sizes from before it
        (docs/policies.md, "Refining a change of level")."""
        for epoch, ratios in self._ratios_to.items():
            if len(ratios) < REFINE_AFTER:
                continue
            correction = min(1.0, _median(ratios))
            factor = correction / self._corrected.get(epoch, 1.0)
            if abs(factor - 1.0) > REFINE_STEP:
                self._rescale_epoch(epoch, factor)
                self._corrected[epoch] = correction

    def _epoch_medians(self) -> dict[int, dict[int, float]]:
        """Per epoch, per size: the median of the samples taken in it (the seed's rows for
        sizes the first epoch has none of)."""
        grouped: dict[int, dict[int, list[float]]] = {}
        for size, reservoir in self._reservoir.items():
            for value, epoch in zip(reservoir, self._epochs[size], strict=True):
                grouped.setdefault(epoch, {}).setdefault(size, []).append(value)
        medians = {e: {n: _median(v) for n, v in sizes.items()} for e, sizes in grouped.items()}
        first = medians.setdefault(0, {})
        for size, ms in self._seed:
            first.setdefault(size, ms * self._seed_scale)
        return medians

    def _rescale_epoch(self, epoch: int, factor: float) -> None:
        """Multiply the samples taken in ``epoch`` (and the seed's rows for the first) by
        ``factor``."""
        if epoch == 0:
            self._seed_scale *= factor
        for size, reservoir in self._reservoir.items():
            taken = [i for i, taken_in in enumerate(self._epochs[size]) if taken_in == epoch]
            for index in taken:
                reservoir[index] *= factor
            if taken:
                self._median_of.pop(size, None)

    def _keep(self, units: int, measured_ms: float) -> None:
        normalised_ms = measured_ms / self.level
        for epoch, anchors in self._anchors.items():  # a change of level waits to be refined
            anchor = anchors.get(units, 0.0)
            if anchor > 0 and normalised_ms > 0:  # 0 ms tells nothing of the other sizes
                ratios = self._ratios_to.get(epoch)
                if ratios is None:
                    ratios = self._ratios_to[epoch] = deque(maxlen=REFINE_MEMORY)
                ratios.append(normalised_ms / anchor)
        reservoir = self._reservoir.get(units)
        if reservoir is None:
            reservoir = self._reservoir[units] = deque(maxlen=self.per_size)
            self._epochs[units] = deque(maxlen=self.per_size)
        if len(reservoir) < self.per_size:
            self._kept += 1
        reservoir.append(normalised_ms)
        self._epochs[units].append(self._epoch)
        self._median_of.pop(units, None)

    def _note_ratio(self, ratio: float, predicted_ms: float) -> None:
        """One measured / predicted ratio, of a batch predicted at ``predicted_ms``, into the
        error bars' window (the oldest leaves it when it is full), kept sorted as well: a tick
        reads a quantile of a few hundred ratios of which only a few are new."""
        ratios, ordered = self._ratios, self._ordered_ratios
        if len(ratios) == ratios.maxlen:
            del ordered[bisect_left(ordered, ratios[0])]
        ratios.append(ratio)
        self._ratio_predictions.append(predicted_ms)
        insort(ordered, ratio)
        self._ratios_taken += 1

    def _replace_ratio(self, old: float, factor: float) -> None:
        """``old``, one of the ratios in the error bars' window, read against a prediction
        ``factor`` times its own (it stays where it was in the window's order)."""
        ratios, ordered = self._ratios, self._ordered_ratios
        index = bisect_left(ordered, old)
        if index == len(ordered) or ordered[index] != old:
            return  # it has left the window
        del ordered[index]
        insort(ordered, old / factor)
        for position, value in enumerate(ratios):
            if value == old:
                ratios[position] = old / factor
                self._ratio_predictions[position] *= factor
                break
        self._ratios_taken += 1  # the quantiles and the body are stale

    @property
    def spread(self) -> float:
        """The error bars: the ``spread_quantile`` of measured / predicted ratios (>= 1; 1
        before any ratio was seen)."""
        return self._raw_quantile(self.spread_quantile)

    @property
    def outlier_elasticity(self) -> float:
        """How an outlier's excess time grows with its batch's predicted time: the log-ratio
        of the median excess of the longer half of the recent outliers (by predicted time) to
        the shorter half's, over the log-ratio of their median predicted times. About 1 when
        outliers scale with the batch's own work (a throttled clock, interleaved kernels: a
        smaller batch escapes part of them), about 0 for a pause added whatever the batch (a
        garbage-collector stop). NaN until ``OUTLIER_ELASTICITY_MIN`` outliers were seen
        among batches whose times differ enough (``OUTLIER_LEVERAGE``)."""
        seen, value = self._elasticity
        if seen != self.outliers_seen:
            value = _elasticity(sorted(self._outliers))
            self._elasticity = (self.outliers_seen, value)
        return value

    def body(self) -> tuple[float, float]:
        """The noise's body: ``(median, sigma)`` of a lognormal fitted robustly to the
        measured / predicted ratios of the last ``spread_window`` batches (their median, and
        sigma from the median absolute deviation of their logarithms over 0.6745, a normal's);
        ``(1, 0)`` before 4 ratios were seen. Why a fitted body: docs/policies.md, "The
        service-time model"."""
        if self._body_at != self._ratios_taken:
            self._body = _robust_lognormal(self._ordered_ratios)
            self._body_at = self._ratios_taken
        return self._body

    def _body_quantile(self, z: float, sigma_max: float = math.inf) -> float:
        median, sigma = self.body()
        return max(1.0, median * math.exp(z * min(sigma, sigma_max)))

    def body_spread_ms(self, batch_size: int) -> float:
        """:meth:`median_bound_ms` times the ``spread_quantile`` of the noise's :meth:`body`,
        ms (NaN before a fit): a batch's time with the noise a window can escape (window
        plans, the outlier test)."""
        return self.median_bound_ms(batch_size) * self._body_quantile(self._spread_z)

    def body_p999_ms(self, batch_size: int) -> float:
        """:meth:`median_bound_ms` times the 99.9th percentile (``P999_Z``) of the noise's
        :meth:`body`, ms (NaN before a fit): a rare batch's time."""
        return self.median_bound_ms(batch_size) * self._body_quantile(P999_Z)

    def p99_ms(self, batch_size: int) -> float:
        """The time of the batch that a p99 request rides, stalls and spikes included, ms
        (NaN before a fit): :meth:`median_bound_ms` times the 99th percentile
        (``P99_QUANTILE``) of all the measured / predicted ratios where outliers scale with
        the batch; where they are pauses added whatever the batch (see
        :meth:`_outliers_added`), :meth:`median_bound_ms` plus the 99th percentile of all the
        batches' excess over their prediction, ms, and at least the noise body's 99th
        percentile. Why: docs/policies.md, "The service-time model"."""
        bound = self.median_bound_ms(batch_size)
        if not self._outliers_added():
            return bound * self._raw_quantile(P99_QUANTILE)
        return max(bound + self._excess_ms()[0], bound * self._body_quantile(P99_Z))

    def _outliers_added(self) -> bool:
        """Whether outliers are pauses added whatever the batch: :attr:`outlier_elasticity`
        below 0.5, or, where it is unknown, the outliers more alike in ms than in ratio."""
        elasticity = self.outlier_elasticity
        if math.isnan(elasticity):
            return self._outliers_alike_in_ms()
        return elasticity < 0.5

    def _outliers_alike_in_ms(self) -> bool:
        """Whether the recent outliers are more alike in their excess, ms, than in their ratio
        to the prediction (the median absolute deviation of the logarithms, the smaller): a
        pause added whatever the batch, where :attr:`outlier_elasticity` cannot tell (their
        batches' times too close); False with fewer than ``OUTLIER_ELASTICITY_MIN``."""
        seen, alike = self._alike
        if seen != self.outliers_seen:
            alike = _alike_in_ms(self._outliers)
            self._alike = (self.outliers_seen, alike)
        return alike

    def added_pauses_ms(self) -> tuple[float, ...]:
        """Where outliers are pauses added whatever the batch (see :meth:`_outliers_added`),
        each of the last ``spread_window`` batches' time over its prediction, ms, increasing,
        each >= 0 (most near 0: a batch without a pause); ``()`` where outliers scale with the
        batch or none were seen. What the window plan prices a pause's share of late answers
        from (docs/policies.md, "The plan")."""
        if not self._outliers_added():
            return ()
        return tuple(max(0.0, excess) for excess in self._sorted_excesses())

    def _sorted_excesses(self) -> tuple[float, ...]:
        """The window's batches' measured less predicted time, ms (< 0 for a fast one),
        increasing, kept until new ratios arrive."""
        taken, value = self._excesses
        if taken != self._ratios_taken:
            value = tuple(
                sorted(
                    (ratio - 1.0) * predicted
                    for ratio, predicted in zip(self._ratios, self._ratio_predictions, strict=True)
                )
            )
            self._excesses = (self._ratios_taken, value)
        return value

    def _excess_ms(self) -> tuple[float, float]:
        """The 99th percentile (``P99_QUANTILE``) of the window's batches' measured less
        predicted time, and their mean with each capped at it, ms (each >= 0; 0 before any),
        kept until new ratios arrive."""
        taken, value = self._excess
        if taken != self._ratios_taken:
            excesses = self._sorted_excesses()
            value = (0.0, 0.0)
            if excesses:
                top = excesses[min(len(excesses) - 1, int(P99_QUANTILE * len(excesses)))]
                mean = sum(min(excess, top) for excess in excesses) / len(excesses)
                value = (max(0.0, top), max(0.0, mean))
            self._excess = (self._ratios_taken, value)
        return value

    def _raw_quantile(self, q: float) -> float:
        """The ``q`` quantile of the measured / predicted ratios (>= 1; 1 before any), kept
        until new ratios arrive (not len(): a full window stays the same length)."""
        if self._quantiles_at != self._ratios_taken:
            self._quantiles, self._quantiles_at = {}, self._ratios_taken
        value = self._quantiles.get(q)
        if value is None:
            ordered = self._ordered_ratios
            index = min(len(ordered) - 1, int(q * len(ordered)))
            value = self._quantiles[q] = max(1.0, ordered[index]) if ordered else 1.0
        return value

    @property
    def mean_ratio(self) -> float:
        """The mean of the measured / predicted ratios of the last ``spread_window`` batches
        of sizes the fit knows (not beyond it, where it is optimistic on purpose), each capped
        at their 99th percentile (``P99_QUANTILE``), at least 1 (1 before any): how much
        longer than its median a batch takes on average, spikes and stalls included, while
        one stall of thousands of times a batch's time moves it little. Why:
        docs/policies.md, "The service-time model"."""
        if self._mean_at != self._taken:
            ratios = sorted(self._known_ratios)
            if ratios:
                top = ratios[min(len(ratios) - 1, int(P99_QUANTILE * len(ratios)))]
                total = sum(min(ratio, top) for ratio in ratios)
                self._mean = max(1.0, total / len(ratios))
            self._mean_at = self._taken
        return self._mean

    def mean_ms(self, batch_size: int) -> float:
        """A batch's mean time, what the device's throughput rests on, ms (NaN before a
        fit): :meth:`median_ms` times :attr:`mean_ratio`; where outliers are pauses added
        whatever the batch (as for :meth:`p99_ms`), :meth:`median_ms` plus the mean of the
        batches' excess over their prediction, each capped at its 99th percentile."""
        median = self.median_ms(batch_size)
        if not self._outliers_added():
            return median * self.mean_ratio
        return median + self._excess_ms()[1]

    def spread_ms(self, batch_size: int) -> float:
        """:meth:`median_bound_ms` times :attr:`spread` (the ``spread_quantile`` of all the
        measured / predicted ratios), ms (NaN before a fit): a batch's time with the error bars
        observed (shedding deadlines)."""
        return self.median_bound_ms(batch_size) * self.spread

    def median_bound_ms(self, batch_size: int) -> float:
        """:meth:`median_ms`, except beyond the largest size known (observed or seeded), where
        it grows in proportion to the size: never optimistic, what latency promises use, ms
        (NaN before a fit)."""
        ends = self._ends
        if ends is None or batch_size <= ends[1]:
            return self.median_ms(batch_size)
        return self.level * ends[3] * batch_size / ends[1]

    def _note_level(self) -> None:
        """Track how the fit compares with the fastest it has been, at the sizes observed."""
        levels = []
        for size in self._reservoir:
            fitted = self.median_ms(size)
            floor = self._floor.get(size)
            if floor is None or fitted < floor:
                self._floor[size] = floor = fitted
            if floor > 0:
                levels.append(fitted / floor)
        self.contention = _median(levels) if levels else 1.0

    def samples_at(self, batch_size: int) -> int:
        """Batches of exactly ``batch_size`` units behind the fit (its reservoir there): how
        well the fit at that size is measured (0: a profile's figure or a curve through it)."""
        kept = self._reservoir.get(batch_size)
        return 0 if kept is None else len(kept)

    def median_ms(self, batch_size: int) -> float:
        """The median service time of a batch of ``batch_size`` units, ms (NaN before a fit):
        the fit inside the sizes seen, flat below them, growing at ``OPTIMISM`` times the last
        per-unit cost beyond them."""
        cached = self._cache.get(batch_size)
        if cached is None:
            cached = self._cache[batch_size] = self.level * self._predict(batch_size)
        return cached

    def _median_at(self, size: int) -> float:
        """The median of the reservoir of ``size`` (kept until the reservoir changes)."""
        median = self._median_of.get(size)
        if median is None:
            median = self._median_of[size] = _median(self._reservoir[size])
        return median

    def _predict(self, batch_size: int) -> float:
        ends = self._ends
        if ends is None:
            return math.nan
        first_size, last_size, first_ms, last_ms = ends
        if batch_size <= first_size:
            return first_ms
        if batch_size >= last_size:
            slope = OPTIMISM * last_ms / last_size
            return last_ms + slope * (batch_size - last_size)
        offset = batch_size - self._inside_first
        if 0 <= offset < len(self._inside):
            return self._inside[offset]
        return float(np.interp(batch_size, self._sizes, self._medians))

    def __call__(self, batch_size: int) -> float:
        return self.median_ms(batch_size)

    def largest_within(self, budget_ms: float, candidates: Iterable[int]) -> int | None:
        """The largest candidate size whose predicted service time is <= ``budget_ms``."""
        fitting = [n for n in candidates if self.median_ms(n) <= budget_ms]
        return max(fitting) if fitting else None

    def _fit_points(
        self,
        sizes: Sequence[int],
        medians: Sequence[float],
        weights: Sequence[float] | None,
        observed_max: float = math.inf,
    ) -> None:
        """Fit ``medians`` at ``sizes`` (sorted); the noise pools the top of the observed sizes
        only (up to ``observed_max``): a prior beyond them is a profile's time, not a noisy
        median of a few batches, and joins the fit as a plain point."""
        self._cache = {}
        self._fit_version += 1
        x = np.asarray(sizes, dtype=float)
        noise = self.body()[1] * _MEDIAN_SD_FACTOR
        observed = bisect_right(sizes, observed_max)
        prefix_weights = None if weights is None else weights[:observed]
        fitted = isotonic_fit(medians[:observed], prefix_weights, noise, sizes[:observed])
        if observed < len(sizes):
            fitted = isotonic_fit([*fitted, *medians[observed:]], weights)
        y = np.maximum(np.asarray(fitted, dtype=float), 0.0)  # x is sorted; no time below 0
        self._sizes, self._medians = x, y
        self._fitted_sizes = list(sizes)
        self._ends = (float(x[0]), float(x[-1]), float(y[0]), float(y[-1])) if x.size else None
        self._predict_inside()

    def _predict_inside(self) -> None:
        """Interpolate every integer size strictly inside the fitted range in one call:
        ``np.interp`` on an array gives the values one call per size gives, and a controller
        tick asks for many sizes right after a refit (they enter the cache as they are asked
        for; ranges wider than _TABLE_SIZES stay lazy)."""
        x = self._sizes
        self._inside_first, self._inside = 0, []
        if x.size < 2:
            return
        first, last = math.floor(x[0]) + 1, math.ceil(x[-1]) - 1
        if last < first or last - first >= _TABLE_SIZES:
            return
        values = np.interp(np.arange(first, last + 1), x, self._medians)
        self._inside_first, self._inside = first, values.tolist()


def isotonic_fit(
    values: Sequence[float],
    weights: Sequence[float] | None = None,
    relative_sd: float = 0.0,
    sizes: Sequence[float] | None = None,
) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares, its top
    steps kept only where the noise cannot explain them.

    The pool-adjacent-violators algorithm (Ayer et al., 1955; the algorithm behind
    scikit-learn's ``isotonic_regression``), in pure Python: the controller fits a few dozen
    points per refit, where a library call's argument checks would cost more than the fit.
    With ``relative_sd`` > 0 (the noise of one value of weight 1, relative to it), the last
    block is then pooled with the one before while the step between them is within
    ``END_STEP_Z`` standard errors: the isotonic estimate spikes at the end of its range,
    where the largest of a few noisy values stands alone (Woodroofe and Sun, 1993, "A
    penalized maximum likelihood estimate of f(0+) when f is non-increasing"). With ``sizes``
    (increasing, one per value), a block so pooled follows the weighted least-squares line
    through its values where its slope stands out of the noise (never below the block
    before), so that a real slope is not flattened at the top.
    """
    # the blocks so far, as three stacks: weighted mean, weight, number of values
    means: list[float] = []
    totals: list[float] = []
    counts: list[int] = []
    for value, weight in zip(values, weights or [1.0] * len(values), strict=True):
        mean, total, count = float(value), float(weight), 1
        while means and means[-1] > mean:  # pool with the block before, which is above it
            before, before_total = means.pop(), totals.pop()
            combined = before_total + total
            mean = (before * before_total + mean * total) / combined
            total = combined
            count += counts.pop()
        means.append(mean)
        totals.append(total)
        counts.append(count)
    pooled = _pool_noisy_top(means, totals, counts, relative_sd) if relative_sd > 0.0 else 0
    fitted: list[float] = []
    for mean, count in zip(means, counts, strict=True):
        fitted.extend([mean] * count)
    if pooled > 1 and sizes is not None:
        start = len(fitted) - pooled
        floor = means[-2] if len(means) >= 2 else -math.inf
        fitted[start:] = _end_line(
            sizes[start:],
            values[start:],
            (weights or [1.0] * len(values))[start:],
            floor,
            relative_sd,
        )
    return fitted


def _end_line(
    sizes: Sequence[float],
    values: Sequence[float],
    weights: Sequence[float],
    floor: float,
    relative_sd: float,
) -> list[float]:
    """The weighted least-squares line through ``(sizes, values)`` at ``sizes``, flat unless
    its slope exceeds ``END_STEP_Z`` standard errors (``relative_sd * mean / sqrt(sum of
    w (x - mean x)**2)``), and its first value at least ``floor``."""
    total = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, sizes, strict=True)) / total
    mean_y = sum(w * y for w, y in zip(weights, values, strict=True)) / total
    spread = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, sizes, strict=True))
    moment = sum(
        w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, sizes, values, strict=True)
    )
    slope = moment / spread if spread > 0 else 0.0
    if slope <= END_STEP_Z * relative_sd * mean_y / math.sqrt(spread or 1.0):
        slope = 0.0  # a slope the noise explains: the block's mean
    lift = max(0.0, floor - (mean_y + slope * (sizes[0] - mean_x)))
    return [mean_y + lift + slope * (x - mean_x) for x in sizes]


def _pool_noisy_top(
    means: list[float], totals: list[float], counts: list[int], relative_sd: float
) -> int:
    """Pool the last two blocks (in place) while the step between them is within
    ``END_STEP_Z`` standard errors of their means (``relative_sd * mean / sqrt(weight)``); the
    number of values in the last block when any were pooled, else 0."""
    pooled = 0
    while len(means) >= 2:
        top, below = means[-1], means[-2]
        error = relative_sd * math.hypot(top / math.sqrt(totals[-1]), below / math.sqrt(totals[-2]))
        if top - below > END_STEP_Z * error:
            break
        top_total, top_count = totals.pop(), counts.pop()
        means.pop()
        combined = totals[-1] + top_total
        means[-1] = (below * totals[-1] + top * top_total) / combined
        totals[-1] = combined
        counts[-1] += top_count
        pooled = counts[-1]
    return pooled


def _robust_lognormal(ordered: Sequence[float]) -> tuple[float, float]:
    """``(median, sigma)`` of sorted positive ratios (see :meth:`ServiceTimeEstimator.body`);
    ``(1, 0)`` for fewer than 4."""
    count = len(ordered)
    if count < 4:
        return 1.0, 0.0
    middle = int(0.5 * (count - 1))
    median = ordered[middle]
    if not median > 0:
        return median, 0.0
    return median, _median_log_deviation(ordered, middle) / _NORMAL_MAD


def _median_log_deviation(ordered: Sequence[float], middle: int) -> float:
    """The ``middle``-th smallest (from 0) of ``|log r - log ordered[middle]|`` over the
    sorted ``ordered`` (its median absolute deviation, in logarithms), in O(log n) logarithms:
    the ratios from the median up and from the median down are two sorted runs of deviations,
    and the k-th smallest of two sorted runs is found by bisecting how many come from each."""
    centre = math.log(ordered[middle])
    up, down = len(ordered) - middle, middle  # ordered[middle:], ordered[middle - 1::-1]

    def above(j: int) -> float:
        return math.log(ordered[middle + j]) - centre

    def below(j: int) -> float:
        value = ordered[middle - 1 - j]
        return centre - math.log(value) if value > 0 else math.inf

    wanted = middle + 1  # how many of the smallest deviations, the last of them the answer
    low, high = max(0, wanted - down), min(wanted, up)
    while True:
        taken = (low + high) // 2  # from the run above; the rest from below
        rest = wanted - taken
        if taken < up and rest > 0 and below(rest - 1) > above(taken):
            low = taken + 1
        elif taken > 0 and rest < down and above(taken - 1) > below(rest):
            high = taken - 1
        else:
            last_above = above(taken - 1) if taken > 0 else -math.inf
            last_below = below(rest - 1) if rest > 0 else -math.inf
            return max(last_above, last_below)


def _elasticity(outliers: Sequence[tuple[float, float]]) -> float:
    """See :attr:`ServiceTimeEstimator.outlier_elasticity`; ``outliers`` are
    ``(predicted_ms, excess_ms)`` pairs sorted by predicted time."""
    if len(outliers) < OUTLIER_ELASTICITY_MIN:
        return math.nan
    half = len(outliers) // 2
    shorter, longer = outliers[:half], outliers[-half:]
    leverage = math.log(_median(p for p, _ in longer) / _median(p for p, _ in shorter))
    if leverage < OUTLIER_LEVERAGE:
        return math.nan
    return math.log(_median(e for _, e in longer) / _median(e for _, e in shorter)) / leverage


def _alike_in_ms(outliers: Sequence[tuple[float, float]]) -> bool:
    """See :meth:`ServiceTimeEstimator._outliers_alike_in_ms`; ``outliers`` are
    ``(predicted_ms, excess_ms)`` pairs."""
    if len(outliers) < OUTLIER_ELASTICITY_MIN:
        return False
    excesses = [math.log(e) for p, e in outliers if p > 0 and e > 0]
    ratios = [math.log(1.0 + e / p) for p, e in outliers if p > 0 and e > 0]
    if len(excesses) < OUTLIER_ELASTICITY_MIN:
        return False
    return _log_spread(excesses) < _log_spread(ratios)


def _log_spread(logs: list[float]) -> float:
    """The median absolute deviation of ``logs`` from their median."""
    middle = _median(logs)
    return _median(abs(value - middle) for value in logs)


def _change_ratio(ratios: Sequence[float], direction: int, usual_rate: float) -> float:
    """A change of level's ratio to the prediction, from the ``ratios`` of the suspects of
    ``direction`` that confirmed it: their median, once the share that the usual rate of such
    suspects explains (``usual_rate``, before the change: 10x spikes on 30 % of batches, slowed
    down with the rest) is left out at the far end, at most half of them."""
    ordered = sorted(ratios, reverse=direction < 0)
    usual = min(len(ordered) // 2, math.floor(usual_rate * len(ordered)))
    return _median(ordered[: len(ordered) - usual])


def _rate_seen(hits: int, trials: int) -> float:
    """The rate of an event seen ``hits`` times in ``trials``: the posterior mean under a
    uniform prior (Laplace's rule of succession)."""
    return (1.0 + hits) / (2.0 + trials)


def _stalls_may_be_most(samples: int, rate: float) -> bool:
    """Whether more than half of ``samples`` batches are stalls at least ``_LONE_ALPHA`` of
    the time, stalls coming at ``rate``."""
    return _binomial_tail(samples, samples // 2 + 1, rate) >= _LONE_ALPHA


def _binomial_tail(trials: int, least: int, rate: float) -> float:
    """P(at least ``least`` successes in ``trials``), each with probability ``rate``."""
    return sum(
        math.comb(trials, k) * rate**k * (1.0 - rate) ** (trials - k)
        for k in range(least, trials + 1)
    )


def _beta_binomial_tail(trials: int, least: int, alpha: float, beta: float) -> float:
    """P(at least ``least`` successes in ``trials``) when the rate of success has the
    distribution Beta(``alpha``, ``beta``): the posterior predictive of a rate seen
    ``alpha - 1`` times in ``alpha + beta - 2`` trials under a uniform prior."""
    log_norm = _log_beta(alpha, beta)
    return sum(
        math.exp(
            math.log(math.comb(trials, k)) + _log_beta(alpha + k, beta + trials - k) - log_norm
        )
        for k in range(least, trials + 1)
    )


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _median(values: Iterable[float]) -> float:
    """Median of a short sequence (pure Python: faster than numpy below ~100 values)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def _spread(batches: Sequence[BatchSample], new: int, most: int) -> list[BatchSample]:
    """The last ``new`` of ``batches``, oldest first; more than ``most`` thinned to ``most``
    evenly spread over them, the newest included."""
    if new <= 0:
        return []
    recent = list(islice(batches, len(batches) - new, None))
    if new <= most:
        return recent
    return [recent[(i + 1) * new // most - 1] for i in range(most)]
