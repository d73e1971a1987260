"""Non-stationary multi-armed bandits over a grid of (window, cap) arms.

Two selection rules share one machinery (:class:`Bandit`):

- :class:`DiscountedUCB`: discounted UCB of Garivier & Moulines, "On upper-confidence bound
  policies for switching bandit problems" (ALT 2011);
- :class:`DiscountedThompson`: Gaussian Thompson sampling (Agrawal & Goyal, AISTATS 2013) on
  discounted statistics, the Gaussian analogue of Raj & Kalyani's discounted Thompson sampling
  ("Taming non-stationary bandits: a Bayesian approach", 2017).

Discounting: on every tick that carries information, every arm's count and reward sum are
multiplied by ``discount`` before the arm played is credited (``N <- discount * N + 1``,
``S <- discount * S + reward``), so an observation ``k`` ticks old weighs ``discount ** k`` and
the policy forgets within about ``1 / (1 - discount)`` ticks: a changed load is re-learnt.

The reward of a tick is :func:`tick_reward`, scaled by the best throughput (or power) seen so
far; its formula is in that function's docstring.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypedDict, Unpack

import numpy as np

from adaptive_batcher._validate import check_int, check_number, check_optional_int
from adaptive_batcher.control.types import Bounds, Decision, Observation

__all__ = [
    "DEFAULT_WINDOWS_MS",
    "Arm",
    "ArmStats",
    "Bandit",
    "BanditOptions",
    "DiscountedThompson",
    "DiscountedUCB",
    "tick_reward",
]

Arm = tuple[float, int]
"""One grid point: (window_ms, max_batch_size)."""

DEFAULT_WINDOWS_MS: tuple[float, ...] = (0.0, 2.0, 5.0, 10.0, 20.0)
"""The windows of the default grid, ms (clamped into the bounds)."""


def tick_reward(
    observation: Observation,
    scale: float,
    *,
    miss_penalty: float = 1.0,
    violation_penalty: float = 0.5,
) -> float:
    """The reward of one tick, in [0, 1].

    With an SLO (goodput with an SLO-miss penalty, DESIGN.md section 6)::

        miss   = 1 - goodput_rps / throughput_rps          (fraction answered late)
        over   = 1 if latency_ms > slo.p99_ms else 0       (the tick broke the SLO percentile)
        reward = goodput_rps / scale - miss_penalty * miss - violation_penalty * over

    where ``scale`` is the best throughput seen so far, req/s. Without an SLO the reward is
    Kleinrock's power normalised, ``power / scale``, where ``power = throughput_rps / mean_s``
    (:attr:`Observation.power`) and ``scale`` is the best power seen so far. Either way the
    result is clipped to [0, 1]. A NaN ``latency_ms`` counts as not over.

    Args:
        observation: the tick; it must carry information (``throughput_rps > 0``, and a finite
            power without an SLO).
        scale: the normaliser, > 0 (req/s with an SLO, req/s per s without).
        miss_penalty: weight of the late fraction, >= 0.
        violation_penalty: weight of a broken percentile, >= 0.
    """
    if observation.slo is None:
        value = observation.power / scale
    else:
        good, answered = observation.goodput_rps, observation.throughput_rps
        miss = min(max(1.0 - good / answered, 0.0), 1.0)
        over = 1.0 if observation.latency_ms > observation.slo.p99_ms else 0.0
        value = good / scale - miss_penalty * miss - violation_penalty * over
    return min(max(value, 0.0), 1.0)


@dataclass(frozen=True, slots=True)
class ArmStats:
    """Discounted statistics of one arm.

    Attributes:
        count: discounted number of ticks credited (0 when never tried).
        total: discounted sum of their rewards.
        tried: whether the arm was ever credited.
    """

    count: float = 0.0
    total: float = 0.0
    tried: bool = False

    @property
    def mean(self) -> float:
        """``total / count``, NaN when the count is 0."""
        return self.total / self.count if self.count > 0 else math.nan


class BanditOptions(TypedDict, total=False):
    """The arguments every :class:`Bandit` takes; see :class:`Bandit`."""

    discount: float
    windows_ms: Sequence[float]
    caps: Sequence[int] | None
    max_caps: int | None
    dwell_ticks: int
    miss_penalty: float
    violation_penalty: float


BANDIT_PARAMETERS: tuple[str, ...] = tuple(BanditOptions.__annotations__)
"""The constructor arguments every :class:`Bandit` takes."""


class Bandit(ABC):
    """A discounted bandit over (window, cap) arms; subclasses supply the selection rule.

    Arms: the caps (``caps`` as given, else ``bounds.cap_candidates()`` thinned to ``max_caps``
    evenly spaced ones, ends kept) times the windows ``windows_ms``, each moved into the bounds
    (and onto a bucket), duplicates dropped. The grid is built from the first observation's
    bounds and rebuilt, keeping what was learnt, when the bounds change.

    Each tick the arm this policy played is credited with :func:`tick_reward` (not the nearest
    arm to the setting in force: guards may trim the played arm, e.g. shorten its window, and
    the reward is what playing it earned). Before the first play, the arm nearest
    ``observation.current`` (nearest cap by ratio, then nearest window) stands for it. Ticks
    without completed requests carry no information: they are ignored and do not count towards
    the dwell. An arm is kept for ``dwell_ticks`` informative ticks, then the next arm is
    chosen: first every arm not yet tried, nearest to the arm played first (the rewards are
    scaled by the best seen so far, so the first arm alone would look perfect), then by the
    rule. Reasons:
    ``bandit.hold`` until the first choice, then ``bandit.exploit`` when the chosen arm has the
    best estimated reward and ``bandit.explore`` otherwise.

    ``reset(current)`` keeps what was learnt and restarts from the arm nearest ``current``,
    held for one dwell (bumpless transfer).

    Defaults: a discounted bandit remembers about ``1 / (1 - discount)`` informative ticks and
    must fit every arm into that memory, so the grid is kept small (4 caps x 5 windows = 20
    arms) and ``discount`` is 0.99 (~100 ticks; Garivier & Moulines suggest
    ``1 - sqrt(breakpoints / horizon) / 4``, 0.987 for 10 changes in 3600 ticks). On a synthetic
    switching table (rewards 0.2-1, noise 0.02-0.1, optimum moved after 1500 ticks) the full
    9 x 6 grid at discount 0.95 did no better than a random arm; with these defaults UCB stayed
    within about 0.06 of the best reward and Thompson within 0.01-0.03, and both re-found the
    moved optimum in 30-240 ticks.

    Args:
        discount: weight kept per informative tick, in (0, 1]; 1 never forgets.
        windows_ms: the windows of the grid, ms (each >= 0, at least one).
        caps: the caps of the grid, size units (each int >= 1, at least one); None: from bounds.
        max_caps: keep at most this many of the caps taken from the bounds (int >= 2); None
            keeps all. Caps given in ``caps`` are all kept.
        dwell_ticks: informative ticks an arm is kept before choosing again (int >= 1).
        miss_penalty: reward weight of the late fraction, >= 0; see :func:`tick_reward`.
        violation_penalty: reward weight of a broken percentile, >= 0; see :func:`tick_reward`.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range; the message names it as ``Class.argument``.
    """

    name: str = "bandit"

    def __init__(
        self,
        *,
        discount: float = 0.99,
        windows_ms: Sequence[float] = DEFAULT_WINDOWS_MS,
        caps: Sequence[int] | None = None,
        max_caps: int | None = 4,
        dwell_ticks: int = 3,
        miss_penalty: float = 1.0,
        violation_penalty: float = 0.5,
    ) -> None:
        who = type(self).__name__
        self.discount = check_number(f"{who}.discount", discount, 0.0, strict=True)
        if self.discount > 1.0:
            raise ValueError(f"{who}.discount must be in (0, 1], got {discount!r}")
        if not windows_ms:
            raise ValueError(f"{who}.windows_ms must not be empty")
        self.windows_ms = tuple(check_number(f"{who}.windows_ms", w, 0.0) for w in windows_ms)
        if caps is not None and not caps:
            raise ValueError(f"{who}.caps must not be empty")
        self.caps = None if caps is None else tuple(check_int(f"{who}.caps", c, 1) for c in caps)
        self.max_caps = check_optional_int(f"{who}.max_caps", max_caps, 2)
        self.dwell_ticks = check_int(f"{who}.dwell_ticks", dwell_ticks, 1)
        self.miss_penalty = check_number(f"{who}.miss_penalty", miss_penalty, 0.0)
        self.violation_penalty = check_number(f"{who}.violation_penalty", violation_penalty, 0.0)
        self._bounds: Bounds | None = None
        self._arms: list[Arm] = []
        self._stats: dict[Arm, ArmStats] = {}
        self._scale = 0.0  # best throughput (with an SLO) or power (without) seen so far
        self._start: Decision | None = None
        self._arm: Arm | None = None
        self._dwell = 0
        self._reason = "bandit.hold"

    @property
    def arms(self) -> tuple[Arm, ...]:
        """The grid, caps then windows increasing (empty before the first ``decide``)."""
        return tuple(self._arms)

    def stats(self, arm: Arm) -> ArmStats:
        """What was learnt about ``arm`` (zeros if nothing)."""
        return self._stats.get(arm, ArmStats())

    def reset(self, current: Decision) -> None:
        """Restart from the arm nearest ``current``, keeping the statistics."""
        self._start, self._arm, self._dwell, self._reason = current, None, 0, "bandit.hold"

    def decide(self, observation: Observation) -> Decision:
        """Credit the tick to the arm played; choose again after a dwell; see the class."""
        if observation.bounds != self._bounds:
            self._build(observation.bounds)
        if self._arm is None:
            self._arm = self._nearest(observation.current if self._start is None else self._start)
            self._start = None
        reward = self._reward(observation)
        if reward is not None:
            # credit the arm this policy played: guards may have trimmed it (e.g. the budget guard
            # shortening its window), and the reward is what playing that arm earned; crediting
            # the trimmed setting's nearest arm instead left the played arm untried for ever
            self._credit(self._arm, reward)
            self._dwell += 1
        if self._dwell >= self.dwell_ticks:
            self._arm = self._choose(self._arms)
            self._reason = "bandit.exploit" if self._arm == self._best() else "bandit.explore"
            self._dwell = 0
        window_ms, cap = self._arm
        return observation.bounds.clamp(Decision(window_ms, cap, self._reason))

    def _choose(self, arms: list[Arm]) -> Arm:
        untried = [arm for arm in arms if not self.stats(arm).tried]
        if untried:
            assert self._arm is not None
            here = Decision(*self._arm)
            return min(untried, key=lambda arm: _distance(arm, here))
        return self._select(arms)

    @abstractmethod
    def _select(self, arms: list[Arm]) -> Arm:
        """The next arm among ``arms`` (the grid, never empty, every arm tried)."""

    def _estimate(self, arm: Arm) -> float:
        """The point estimate of ``arm``'s reward that ``bandit.exploit`` refers to."""
        mean = self.stats(arm).mean
        return -math.inf if math.isnan(mean) else mean

    def _best(self) -> Arm:
        return max(self._arms, key=self._estimate)

    def _build(self, bounds: Bounds) -> None:
        def cap_in(size: int) -> int:
            return bounds.clamp(Decision(bounds.min_window_ms, size)).max_batch_size

        def window_in(window_ms: float) -> float:
            return bounds.clamp(Decision(window_ms, bounds.min_batch_size)).window_ms

        source = self.caps or bounds.cap_candidates() or [bounds.max_batch_size]
        caps = sorted({cap_in(c) for c in source})
        if self.caps is None and self.max_caps is not None and len(caps) > self.max_caps:
            picks = np.linspace(0, len(caps) - 1, self.max_caps).round().astype(int)
            caps = [caps[i] for i in sorted(set(picks.tolist()))]
        windows = sorted({window_in(w) for w in self.windows_ms})
        self._bounds = bounds
        self._arms = [(w, c) for c in caps for w in windows]
        if self._arm is not None:
            self._arm = self._nearest(Decision(*self._arm))

    def _nearest(self, decision: Decision) -> Arm:
        return min(self._arms, key=lambda arm: _distance(arm, decision))

    def _reward(self, observation: Observation) -> float | None:
        if not observation.throughput_rps > 0:
            return None
        sample = observation.throughput_rps if observation.slo is not None else observation.power
        if not math.isfinite(sample):
            return None
        self._scale = max(self._scale, sample)
        return tick_reward(
            observation,
            self._scale,
            miss_penalty=self.miss_penalty,
            violation_penalty=self.violation_penalty,
        )

    def _credit(self, arm: Arm, reward: float) -> None:
        gamma = self.discount
        for key, old in self._stats.items():
            self._stats[key] = ArmStats(gamma * old.count, gamma * old.total, old.tried)
        old = self.stats(arm)
        self._stats[arm] = ArmStats(old.count + 1.0, old.total + reward, True)


def _distance(arm: Arm, decision: Decision) -> tuple[float, float]:
    window_ms, cap = arm
    return abs(math.log(decision.max_batch_size / cap)), abs(decision.window_ms - window_ms)


class DiscountedUCB(Bandit):
    """Discounted UCB (Garivier & Moulines 2011) over (window, cap) arms; name ``bandit_ucb``.

    Once every arm was tried (see :class:`Bandit`), the arm with the largest index
    ``mean + exploration * sqrt(log(n) / N)`` is chosen, where ``N`` is the arm's discounted
    count, ``mean`` its discounted mean reward and ``n`` the sum of all ``N`` (``log`` taken as
    0 below ``n = 1``). The paper's padding is
    ``2 * B * sqrt(xi * log(n) / N)`` with rewards in [0, B]; ``exploration`` stands for
    ``2 * B * sqrt(xi)``. Their constant (about 1.5 for B = 1) is sized for worst-case bounds;
    the default 0.05 is sized to the reward differences between neighbouring arms (a few
    hundredths), else every arm's padding outgrows them and the policy explores forever.

    Args:
        exploration: the padding constant, >= 0.
        **options: see :class:`Bandit`.

    Raises:
        TypeError, ValueError: as :class:`Bandit`, and for ``exploration``.
    """

    name = "bandit_ucb"
    parameters: ClassVar[tuple[str, ...]] = (*BANDIT_PARAMETERS, "exploration")

    def __init__(self, *, exploration: float = 0.05, **options: Unpack[BanditOptions]) -> None:
        super().__init__(**options)
        self.exploration = check_number("DiscountedUCB.exploration", exploration, 0.0)

    def _select(self, arms: list[Arm]) -> Arm:
        log_n = math.log(max(sum(self.stats(arm).count for arm in arms), 1.0))

        def index(arm: Arm) -> float:
            stats = self.stats(arm)
            if stats.count < 1e-12:
                return math.inf
            return stats.mean + self.exploration * math.sqrt(log_n / stats.count)

        return max(arms, key=index)


class DiscountedThompson(Bandit):
    """Gaussian Thompson sampling on discounted statistics; name ``bandit_thompson``.

    Each arm's reward has the posterior ``Normal((S + prior_mean) / (N + 1), sigma**2 / (N + 1))``
    given its discounted count ``N`` and sum ``S``: Agrawal & Goyal's Gaussian Thompson sampling
    (AISTATS 2013) with one pseudo-observation of ``prior_mean`` (the Gaussian counterpart of the
    Beta(1, 1) prior of Raj & Kalyani 2017), on Raj & Kalyani's discounted statistics. One
    sample is drawn per arm and the largest wins. As an arm is left alone its ``N`` decays and
    its posterior widens back to the prior, so it is tried again. Draws come from
    ``numpy.random.default_rng(seed)``: the same seed and observations give the same decisions.

    Args:
        sigma: the posterior's scale, reward units (> 0).
        prior_mean: the prior's mean reward, in [0, 1].
        seed: the generator's seed (None: fresh entropy, not reproducible).
        **options: see :class:`Bandit`.

    Raises:
        TypeError, ValueError: as :class:`Bandit`, and for ``sigma`` and ``prior_mean``.
    """

    name = "bandit_thompson"
    parameters: ClassVar[tuple[str, ...]] = (*BANDIT_PARAMETERS, "sigma", "prior_mean", "seed")

    def __init__(
        self,
        *,
        sigma: float = 0.15,
        prior_mean: float = 0.5,
        seed: int | None = 0,
        **options: Unpack[BanditOptions],
    ) -> None:
        super().__init__(**options)
        self.sigma = check_number("DiscountedThompson.sigma", sigma, 0.0, strict=True)
        self.prior_mean = check_number("DiscountedThompson.prior_mean", prior_mean, 0.0)
        if self.prior_mean > 1.0:
            raise ValueError(f"DiscountedThompson.prior_mean must be in [0, 1], got {prior_mean!r}")
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def _estimate(self, arm: Arm) -> float:
        stats = self.stats(arm)
        return (stats.total + self.prior_mean) / (stats.count + 1.0)

    def _select(self, arms: list[Arm]) -> Arm:
        counts = np.array([self.stats(arm).count for arm in arms]) + 1.0
        means = np.array([self._estimate(arm) for arm in arms])
        draws = self._rng.normal(means, self.sigma / np.sqrt(counts))
        return arms[int(np.argmax(draws))]
