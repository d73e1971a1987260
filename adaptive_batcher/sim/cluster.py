"""Several replicas behind a router: what per-replica controllers do together.

Each replica is a whole batcher (its own engine, controller and device) driven on one virtual
clock, exactly as :class:`~adaptive_batcher.sim.simulator.Simulator` drives one; a router sends
each arrival to one replica. Two routers:

* :class:`RoundRobin`: replica ``i mod N`` for the ``i``-th request, blind to load (Ray Serve's
  and most proxies' default spreading).
* :class:`PowerOfTwoChoices`: two distinct replicas drawn at random, the one with fewer units
  queued or running wins (Mitzenmacher, "The Power of Two Choices in Randomized Load
  Balancing", IEEE TPDS 2001; Ray Serve's request router does the same with queue lengths).

:func:`replicas_for_slo` answers the capacity question for a trace: the fewest replicas whose
combined SLO attainment reaches a target, with each count's device cost beside it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from adaptive_batcher._validate import check_in_range, check_int
from adaptive_batcher.metrics.recorder import Counts
from adaptive_batcher.sim.result import SimResult
from adaptive_batcher.sim.service import MemoryLimit, ServiceModel
from adaptive_batcher.sim.simulator import SimConfig, Simulator, _Replay
from adaptive_batcher.sim.workloads import Arrivals
from adaptive_batcher.slo import SLO

__all__ = [
    "ClusterResult",
    "ClusterSimulator",
    "PowerOfTwoChoices",
    "RoundRobin",
    "Router",
    "replicas_for_slo",
]


class Router(Protocol):
    """Chooses the replica of each arrival."""

    name: str

    def choose(self, outstanding_units: Sequence[int], rng: np.random.Generator) -> int:
        """The index of the replica for the next request, given each replica's units queued or
        running (length N >= 1)."""
        ...


class RoundRobin:
    """Replicas in turn, whatever their load."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, outstanding_units: Sequence[int], rng: np.random.Generator) -> int:
        del rng
        chosen = self._next % len(outstanding_units)
        self._next = chosen + 1
        return chosen


class PowerOfTwoChoices:
    """The less loaded of two distinct replicas drawn at random (the first drawn on a tie)."""

    name = "power_of_two"

    def choose(self, outstanding_units: Sequence[int], rng: np.random.Generator) -> int:
        count = len(outstanding_units)
        if count == 1:
            return 0
        first = int(rng.integers(count))
        second = int(rng.integers(count - 1))
        second += second >= first  # uniform over the others
        return second if outstanding_units[second] < outstanding_units[first] else first


@dataclass(frozen=True)
class ClusterResult:
    """A replay of N replicas.

    Attributes:
        router: the router's name.
        replicas: each replica's own result (its requests, batches, decisions and cost).
        total: all requests together (``requests``, latencies, SLO attainment, goodput;
            ``device_busy_s`` summed over the replicas; ``busy_fraction`` of all their slots).
        assigned: the replica of each request, in arrival order, shape ``(requests,)``.
    """

    router: str
    replicas: tuple[SimResult, ...]
    total: SimResult
    assigned: np.ndarray

    @property
    def replica_count(self) -> int:
        """N."""
        return len(self.replicas)


class ClusterSimulator:
    """Replays arrivals against N replicas of one batcher configuration behind a router.

    Args:
        service: every replica's device (service-time and memory model).
        config: every replica's batcher configuration (each has its own controller).
        replicas: N, an integer >= 1.
        router: a :class:`Router` (default :class:`PowerOfTwoChoices`); each run starts from a
            copy of it, so a stateful router (:class:`RoundRobin`) replays the same every time.
        memory: each replica's device memory over time (None: unlimited).
        seed: seeds replica ``i``'s service noise with ``seed + i`` and the router with
            ``seed``; with one replica the replay equals ``Simulator(..., seed=seed)``'s.
        judge_slo: the SLO results are judged by (default ``config.slo``).

    Raises:
        TypeError: ``replicas`` not an integer; ``service``, ``config``, ``memory`` or
            ``judge_slo`` of the wrong type (as :class:`Simulator`); a ``router`` without a
            ``choose`` method or a ``name``, or a router class instead of an instance.
        ValueError: ``replicas`` < 1, a negative ``seed``.
    """

    def __init__(
        self,
        service: ServiceModel,
        config: SimConfig,
        replicas: int,
        router: Router | None = None,
        *,
        memory: MemoryLimit | None = None,
        seed: int = 0,
        judge_slo: SLO | None = None,
    ) -> None:
        self.replicas = check_int("replicas", replicas, 1)
        check_int("seed", seed, 0)  # before seed + i below
        # each replica's Simulator checks service, config, memory and judge_slo
        self._simulators = [
            Simulator(service, config, memory=memory, seed=seed + i, judge_slo=judge_slo)
            for i in range(self.replicas)
        ]
        if isinstance(router, type):
            raise TypeError(f"router must be an instance ({router.__name__}()), got the class")
        chooses = callable(getattr(router, "choose", None))
        if router is not None and not (chooses and isinstance(getattr(router, "name", None), str)):
            raise TypeError(
                f"router must have a choose(outstanding_units, rng) method and a name (str), "
                f"got {type(router).__name__}"
            )
        self.router = router if router is not None else PowerOfTwoChoices()
        self.config = config
        self.seed = seed
        self.judge_slo = self._simulators[0].judge_slo

    def run(self, arrivals: Arrivals) -> ClusterResult:
        """Replay open-loop ``arrivals``: each goes to the router's replica at its time.

        Raises:
            TypeError: ``arrivals`` is not :class:`Arrivals`; the service model returned a
                time that is not a number (as :meth:`Simulator.run`).
            ValueError: the router chose something that is not a replica's index; the service
                model returned a NaN, infinite or negative time (as :meth:`Simulator.run`).
        """
        if not isinstance(arrivals, Arrivals):
            raise TypeError(f"arrivals must be Arrivals, got {type(arrivals).__name__}")
        replays = [_Replay(simulator, None) for simulator in self._simulators]
        router = copy.deepcopy(self.router)  # a run starts from the router as given
        rng = np.random.default_rng(self.seed)
        count = len(arrivals)
        assigned = np.empty(count, dtype=np.int64)
        local = np.empty(count, dtype=np.int64)
        sizes = np.asarray(arrivals.sizes, dtype=np.int64).tolist()
        for index, at_s in enumerate(np.asarray(arrivals.times_s, dtype=float).tolist()):
            for replay in replays:
                replay.advance_to(at_s)
            chosen = router.choose([r.outstanding_units for r in replays], rng)
            if isinstance(chosen, bool) or not (
                isinstance(chosen, int | np.integer) and 0 <= chosen < self.replicas
            ):
                raise ValueError(
                    f"router {type(router).__name__} chose {chosen!r}: not a replica index in "
                    f"0..{self.replicas - 1}"
                )
            assigned[index] = chosen
            local[index] = replays[chosen].offer(at_s, sizes[index])
        results = tuple(replay.finish() for replay in replays)
        counts = _sum_counts([replay.recorder.counts() for replay in replays])
        total = _combine(results, counts, assigned, local, arrivals, self)
        return ClusterResult(self.router.name, results, total, assigned)


def _combine(
    results: tuple[SimResult, ...],
    counts: Counts,
    assigned: np.ndarray,
    local: np.ndarray,
    arrivals: Arrivals,
    cluster: ClusterSimulator,
) -> SimResult:
    """All requests in arrival order, as one result."""
    done_s = np.empty(len(assigned))
    outcome = np.empty(len(assigned), dtype=np.int8)
    for replica, result in enumerate(results):
        mine = assigned == replica
        done_s[mine] = result.done_s[local[mine]]
        outcome[mine] = result.outcome[local[mine]]
    calls = np.concatenate([r.calls for r in results]) if results else np.empty((0, 4))
    return SimResult.build(
        name=f"{cluster.config.name or arrivals.name} x{len(results)} ({cluster.router.name})",
        arrival_s=np.asarray(arrivals.times_s, dtype=float),
        done_s=done_s,
        outcome=outcome,
        sizes=np.asarray(arrivals.sizes, dtype=np.int64),
        slo=cluster.judge_slo,
        counts=counts,
        busy_s=sum(r.device_busy_s for r in results),
        decisions=[],
        slots=cluster.config.max_concurrent_batches * len(results),
        calls=calls[np.argsort(calls[:, 0], kind="stable")],
    )


def _sum_counts(counts: Sequence[Counts]) -> Counts:
    """Field by field."""
    return Counts(**{f.name: sum(getattr(c, f.name) for c in counts) for f in fields(Counts)})


def replicas_for_slo(
    run_with: Callable[[int], ClusterResult],
    *,
    attainment: float = 0.99,
    max_replicas: int = 16,
) -> tuple[int | None, list[ClusterResult]]:
    """The fewest replicas whose combined SLO attainment reaches ``attainment``.

    Args:
        run_with: replays the trace with N replicas (e.g. a lambda building a
            :class:`ClusterSimulator` with ``replicas=n`` and running it).
        attainment: the target share of requests answered within the SLO, in (0, 1].
        max_replicas: the largest N tried.

    Returns:
        ``(n, results)``: the smallest N that reaches the target (None if none up to
        ``max_replicas`` does) and the result of every N tried, from 1 (cost beside
        attainment, so the price of each replica is visible).

    Raises:
        ValueError: ``attainment`` outside (0, 1], ``max_replicas`` < 1, or a replay with
            no SLO attainment (no SLO, or no request).
    """
    check_in_range("attainment", attainment, 0.0, 1.0, open_low=True)
    check_int("max_replicas", max_replicas, 1)
    tried: list[ClusterResult] = []
    for n in range(1, max_replicas + 1):
        result = run_with(n)
        tried.append(result)
        reached = result.total.slo_attainment
        if math.isnan(reached):
            raise ValueError(
                "replicas_for_slo needs an SLO attainment: judge the replays by an SLO "
                "(ClusterSimulator's judge_slo or the config's slo) on a trace with requests"
            )
        if reached >= attainment:
            return n, tried
    return None, tried
