"""Non-stationary bandits over how much of the planned window to use.

Two selection rules share one machinery (:class:`Bandit`):

- :class:`DiscountedUCB`: discounted UCB of Garivier & Moulines, "On upper-confidence bound
  policies for switching bandit problems" (ALT 2011);
- :class:`DiscountedThompson`: Gaussian Thompson sampling (Agrawal & Goyal, AISTATS 2013) on
  discounted statistics, the Gaussian analogue of Raj & Kalyani's discounted Thompson sampling
  ("Taming non-stationary bandits: a Bayesian approach", 2017).

**Safe arms.** An arm is a *fraction* of the widest window the tick's
:class:`~adaptive_batcher.control.plan.Plan` predicts within the latency budget, at the plan's
cap (the tail cap, never below the one that keeps up). So every arm is a setting the service
model predicts within the SLO, whatever the load: exploring never tries a window the plan
rules out, nor a small cap that cannot keep up (the first generation's grid of fixed
(window, cap) points shed 18-28 % of the requests at 30 % load while exploring, and tried caps
of 8 and below late in a run). Under overload the policy holds window 0 at the
highest-throughput cap and learns nothing.

**Priors from the model.** Each arm starts with one pseudo-observation of the reward the plan
predicts for it (its predicted device saving), so the policy begins at the arm the model
expects to be cheapest and explores another only while that one's observed reward is in doubt.

**The objective as the reward** (:func:`tick_reward`): meet the SLO at the least device cost.

Discounting: on every tick that carries information, every arm's count and reward sum are
multiplied by ``discount`` before the arm played is credited (``N <- discount * N + 1``,
``S <- discount * S + reward``), so an observation ``k`` ticks old weighs ``discount ** k`` and
the policy forgets within about ``1 / (1 - discount)`` ticks: a changed load is re-learnt.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypedDict, Unpack

import numpy as np

from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.control.plan import Plan
from adaptive_batcher.control.types import Decision, Observation

__all__ = [
    "BANDIT_PARAMETERS",
    "DEFAULT_FRACTIONS",
    "Arm",
    "ArmStats",
    "Bandit",
    "BanditOptions",
    "DiscountedThompson",
    "DiscountedUCB",
    "tick_reward",
]

Arm = float
"""One arm: the fraction of the plan's widest window to use, in [0, 1]."""

DEFAULT_FRACTIONS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
"""The arms of the default policy."""


def tick_reward(
    observation: Observation, reference_ms: float, *, miss_penalty: float = 4.0
) -> float:
    """The reward of one tick, in [0, 1].

    With an SLO (meet it, at the least device cost)::

        saving = 1 - device_ms_per_request / reference_ms   (the tick's device cost saved)
        miss   = 1 - goodput_rps / throughput_rps            (share answered late)
        reward = saving - miss_penalty * miss

    where ``reference_ms`` is the device cost the plan predicts at window 0 (natural batching)
    for the tick's load: the cost of spending none of the latency budget. Without an SLO the
    reward is Kleinrock's power normalised, ``power / reference_ms``, where ``reference_ms`` is
    then the best power seen so far (req/s per s). Either way the result is clipped to [0, 1].

    Args:
        observation: the tick; it must carry information (``throughput_rps > 0``, and a finite
            device cost with an SLO, a finite power without).
        reference_ms: the normaliser, > 0 (see above).
        miss_penalty: weight of the late share, >= 0 (4: one request in twenty-five late
            costs as much as the whole saving of a wide window).
    """
    if observation.slo is None:
        value = observation.power / reference_ms
    else:
        good, answered = observation.goodput_rps, observation.throughput_rps
        miss = min(max(1.0 - good / answered, 0.0), 1.0)
        saving = 1.0 - observation.device_ms_per_request / reference_ms
        value = saving - miss_penalty * miss
    return min(max(value, 0.0), 1.0)


@dataclass(frozen=True, slots=True)
class ArmStats:
    """Discounted statistics of one arm (a prior pseudo-observation included).

    Attributes:
        count: discounted number of ticks credited.
        total: discounted sum of their rewards.
    """

    count: float = 0.0
    total: float = 0.0

    @property
    def mean(self) -> float:
        """``total / count``, NaN when the count is 0."""
        return self.total / self.count if self.count > 0 else math.nan


class BanditOptions(TypedDict, total=False):
    """The arguments every :class:`Bandit` takes; see :class:`Bandit`."""

    discount: float
    fractions: Sequence[float]
    dwell_ticks: int
    miss_penalty: float
    prior_weight: float


BANDIT_PARAMETERS: tuple[str, ...] = tuple(BanditOptions.__annotations__)
"""The constructor arguments every :class:`Bandit` takes."""


class Bandit(ABC):
    """A discounted bandit over fractions of the planned window; subclasses supply the rule.

    Each tick, with an SLO and a ready service-time estimator: the arm this policy played is
    credited with :func:`tick_reward` (ticks without answers carry no information and do not
    count); after ``dwell_ticks`` credited ticks the next arm is chosen by the rule; the decision
    is the chosen fraction of the plan's widest window, at the plan's cap. Reasons:
    ``bandit.hold`` (no SLO or no service-time estimate yet), ``bandit.overload``, then
    ``bandit.exploit`` when the arm in play has the best estimated reward and ``bandit.explore``
    otherwise. Without an SLO the window is the fraction of the bounds' widest window, at the
    cap in force.

    ``reset(current)`` keeps what was learnt and restarts from the arm with the best estimate
    (bumpless transfer).

    Defaults: ``discount`` 0.99 (~100 ticks of memory; Garivier & Moulines suggest
    ``1 - sqrt(breakpoints / horizon) / 4``, 0.987 for 10 changes in 3600 ticks); five arms;
    a dwell of 3 ticks.

    Args:
        discount: weight kept per informative tick, in (0, 1]; 1 never forgets.
        fractions: the arms, each in [0, 1], at least one.
        dwell_ticks: informative ticks an arm is kept before choosing again (int >= 1).
        miss_penalty: weight of the late share in the reward, >= 0; see :func:`tick_reward`.
        prior_weight: pseudo-observations of the model's predicted reward each arm starts
            with, >= 0 (0: no prior).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range; the message names it as ``Class.argument``.
    """

    name: str = "bandit"

    def __init__(
        self,
        *,
        discount: float = 0.99,
        fractions: Sequence[float] = DEFAULT_FRACTIONS,
        dwell_ticks: int = 3,
        miss_penalty: float = 4.0,
        prior_weight: float = 1.0,
    ) -> None:
        who = type(self).__name__
        self.discount = check_number(f"{who}.discount", discount, 0.0, strict=True)
        if self.discount > 1.0:
            raise ValueError(f"{who}.discount must be in (0, 1], got {discount!r}")
        if not fractions:
            raise ValueError(f"{who}.fractions must not be empty")
        self.fractions = tuple(
            sorted({check_number(f"{who}.fractions", f, 0.0) for f in fractions})
        )
        if self.fractions[-1] > 1.0:
            raise ValueError(f"{who}.fractions must be in [0, 1], got {list(fractions)}")
        self.dwell_ticks = check_int(f"{who}.dwell_ticks", dwell_ticks, 1)
        self.miss_penalty = check_number(f"{who}.miss_penalty", miss_penalty, 0.0)
        self.prior_weight = check_number(f"{who}.prior_weight", prior_weight, 0.0)
        self._stats: dict[Arm, ArmStats] = {}
        self._arm: Arm | None = None
        self._dwell = 0
        self._reason = "bandit.hold"
        self._best_power = 0.0

    @property
    def arms(self) -> tuple[Arm, ...]:
        """The fractions played."""
        return self.fractions

    def stats(self, arm: Arm) -> ArmStats:
        """What was learnt about ``arm`` (zeros if nothing, not even a prior)."""
        return self._stats.get(arm, ArmStats())

    def reset(self, current: Decision) -> None:
        """Restart from the arm with the best estimate, keeping the statistics."""
        del current
        self._arm, self._dwell = None, 0

    def decide(self, observation: Observation) -> Decision:
        """Credit the tick to the arm played; choose again after a dwell; see the class."""
        plan = observation.plan()
        if not plan.ready:
            return observation.current.with_(reason="bandit.hold")
        budget = observation.budget_ms
        if observation.slo is not None and plan.overloaded(budget):
            cap = plan.cap(budget, observation.room_ms) or observation.current.max_batch_size
            return Decision(0.0, cap, "bandit.overload")
        cap, widest = self._setting(observation, plan)
        if not self._stats:
            self._start(observation, plan, cap, widest)
        reward = self._reward(observation, plan, cap)
        if reward is not None and self._arm is not None:
            self._credit(self._arm, reward)
            self._dwell += 1
        if self._arm is None or self._dwell >= self.dwell_ticks:
            self._arm = self._select(list(self.fractions))
            self._reason = "bandit.exploit" if self._arm == self._best() else "bandit.explore"
            self._dwell = 0
        return Decision(self._arm * widest, cap, self._reason)

    @abstractmethod
    def _select(self, arms: list[Arm]) -> Arm:
        """The next arm among ``arms`` (never empty)."""

    def _estimate(self, arm: Arm) -> float:
        """The point estimate of ``arm``'s reward that ``bandit.exploit`` refers to."""
        mean = self.stats(arm).mean
        return -math.inf if math.isnan(mean) else mean

    def _best(self) -> Arm:
        return max(self.fractions, key=self._estimate)

    def _setting(self, observation: Observation, plan: Plan) -> tuple[int, float]:
        """(cap, widest window ms) the arms scale: the plan's with an SLO, else the bounds'."""
        if observation.slo is None:
            return observation.current.max_batch_size, observation.bounds.max_window_ms
        cap = plan.cap(observation.budget_ms, observation.room_ms)
        cap = cap or observation.current.max_batch_size
        return cap, plan.widest_window_ms(observation.aim_budget_ms, cap)

    def _start(self, observation: Observation, plan: Plan, cap: int, widest: float) -> None:
        """One pseudo-observation per arm of the reward the plan predicts for it."""
        reference = plan.cost_ms_per_unit(0.0, cap)
        for arm in self.fractions:
            prior = 0.5
            if observation.slo is not None and reference > 0:
                prior = min(max(1.0 - plan.cost_ms_per_unit(arm * widest, cap) / reference, 0), 1)
            weight = self.prior_weight
            self._stats[arm] = ArmStats(weight, weight * prior)

    def _reward(self, observation: Observation, plan: Plan, cap: int) -> float | None:
        if not observation.throughput_rps > 0:
            return None
        if observation.slo is None:
            power = observation.power
            if not math.isfinite(power):
                return None
            self._best_power = max(self._best_power, power)
            return tick_reward(observation, self._best_power)
        if math.isnan(observation.device_ms_per_request):
            return None
        reference = plan.cost_ms_per_unit(0.0, cap) * observation.mean_request_units
        if not reference > 0:
            return None
        return tick_reward(observation, reference, miss_penalty=self.miss_penalty)

    def _credit(self, arm: Arm, reward: float) -> None:
        gamma = self.discount
        for key, old in self._stats.items():
            self._stats[key] = ArmStats(gamma * old.count, gamma * old.total)
        old = self.stats(arm)
        self._stats[arm] = ArmStats(old.count + 1.0, old.total + reward)


class DiscountedUCB(Bandit):
    """Discounted UCB (Garivier & Moulines 2011) over fractions of the planned window; name
    ``bandit_ucb``.

    The arm with the largest index ``mean + exploration * sqrt(log(n) / N)`` is chosen, where
    ``N`` is the arm's discounted count (its prior included), ``mean`` its discounted mean
    reward and ``n`` the sum of all ``N`` (``log`` taken as 0 below ``n = 1``). The paper's
    padding is ``2 * B * sqrt(xi * log(n) / N)`` with rewards in [0, B]; ``exploration`` stands
    for ``2 * B * sqrt(xi)``. Their constant (about 1.5 for B = 1) is sized for worst-case
    bounds; the default 0.05 is sized to the reward differences between neighbouring arms (a
    few hundredths), else every arm's padding outgrows them and the policy explores forever.

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

    Each arm's reward has the posterior ``Normal(S / N, sigma**2 / N)`` given its discounted
    count ``N`` and sum ``S``, the model's prior pseudo-observation included (``N`` is at least
    one pseudo-count, so an arm left alone widens back towards its prior and is tried again):
    Agrawal & Goyal's Gaussian Thompson sampling (AISTATS 2013) on Raj & Kalyani's discounted
    statistics. One sample is drawn per arm and the largest wins. Draws come from
    ``numpy.random.default_rng(seed)``: the same seed and observations give the same decisions.

    Args:
        sigma: the posterior's scale, reward units (> 0).
        seed: the generator's seed (None: fresh entropy, not reproducible).
        **options: see :class:`Bandit`.

    Raises:
        TypeError, ValueError: as :class:`Bandit`, and for ``sigma``.
    """

    name = "bandit_thompson"
    parameters: ClassVar[tuple[str, ...]] = (*BANDIT_PARAMETERS, "sigma", "seed")

    def __init__(
        self,
        *,
        sigma: float = 0.05,
        seed: int | None = 0,
        **options: Unpack[BanditOptions],
    ) -> None:
        super().__init__(**options)
        self.sigma = check_number("DiscountedThompson.sigma", sigma, 0.0, strict=True)
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def _select(self, arms: list[Arm]) -> Arm:
        counts = np.array([max(self.stats(arm).count, 1.0) for arm in arms])
        means = np.array([max(self._estimate(arm), 0.0) for arm in arms])
        draws = self._rng.normal(means, self.sigma / np.sqrt(counts))
        return arms[int(np.argmax(draws))]
