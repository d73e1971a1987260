"""The unused-window guard: window to 0 when waiting brings no company (MLServer #777)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.guards._clients import (
    CLIENTS_WAIT_S,
    ClientsWindow,
    Stretch,
    beyond_noise,
    rate_rose,
)
from adaptive_batcher.control.guards.base import WINDOW_UNUSED, Guard
from adaptive_batcher.control.policy import Policy
from adaptive_batcher.control.types import Decision, Observation

__all__ = ["UnusedWindowGuard"]

_log = get_logger()

_HELD = (WINDOW_UNUSED, "window_probe")  # the reasons this guard's own windows carry


@dataclass(slots=True)
class _Evidence:
    """What the ticks with an open window showed since the last verdict, batch-weighted."""

    batches: int = 0
    batch_size: float = 0.0  # sum over ticks of batches * mean batch size
    company: float = 0.0  # ... of batches * the company the arrival rate promises
    promised: float = 0.0  # ... of batches * that company, at most the cap's room
    poisson_idle: float = 0.0  # ... of batches * the idle share Poisson arrivals leave
    idle: float = 0.0  # ... of batches * the measured idle share (ticks that measured it)
    idle_batches: int = 0
    largest: int = 0

    def add(self, observation: Observation) -> None:
        batches = observation.batches
        window_ms = observation.current.window_ms
        company = observation.arrival_rate_rps * window_ms / 1e3  # expected, per batch
        # the cap ends a batch before the window when the window would bring more: full
        # batches hold at most cap - 1 companions, however wide the window
        room = observation.current.max_batch_size / max(observation.mean_request_units, 1.0)
        self.batches += batches
        self.batch_size += batches * observation.mean_batch_size
        self.company += batches * company
        self.promised += batches * min(company, max(room - 1.0, 0.0))
        self.poisson_idle += batches * ((1.0 - math.exp(-company)) / company if company > 0 else 1)
        if not math.isnan(observation.window_idle_fraction):
            self.idle += batches * observation.window_idle_fraction
            self.idle_batches += batches
        self.largest = max(self.largest, observation.largest_batch_size)


@dataclass(slots=True)
class _Probe:
    """A probe in progress: the open stretch before it, and its own ticks at window 0."""

    opened: Stretch
    ticks_left: int
    shut: Stretch = field(default_factory=Stretch)


LONG_TICK = 4.0
"""A tick this many controller intervals long is not judged: no poll came for that long (no
request arrived, or the event loop stood still), and its rate says nothing of the window."""


def _same_window(window_ms: float, other_ms: float | None) -> bool:
    """Whether two windows in force are the same one, within 10 % (or 0.05 ms)."""
    return other_ms is not None and math.isclose(window_ms, other_ms, rel_tol=0.1, abs_tol=0.05)


REFERENCE_TICKS = 2
"""Ticks a re-arm's reference holds before a rise is judged against it (their highest)."""


@dataclass(slots=True)
class _RearmReference:
    """The arrival rate a real rise in load must exceed while the window is shut: the highest
    seen at the window in force over at least ``REFERENCE_TICKS`` ticks, from the tick after
    the one that set it (closed-loop clients come at the pace the window sets them: faster
    once it is shut, faster again at their own window; the tick that changed it still answers
    the old one's batches), each tick joining it a tick late (a tick that a step in the load
    straddles reads part of the step, and as the reference at once it hid the step's next full
    tick). One tick alone is no reference: in the README's app a held window's first tick read
    464-476 req/s, its clients then came at 700-800, and a tick at 801 re-armed the policy's
    40 ms window."""

    window_ms: float | None = None  # the window in force it was seen at
    rate_rps: float = 0.0
    ticks: int = 0  # ticks joined
    latest_rps: float | None = None  # the latest tick's, not yet in it

    def risen(self, rate_rps: float, window_ms: float, factor: float) -> bool:
        """Take a tick's rate at the window in force; True when it is ``factor`` times the
        reference."""
        if not _same_window(window_ms, self.window_ms):
            self.window_ms, self.rate_rps, self.ticks, self.latest_rps = window_ms, 0.0, 0, None
            return False
        if self.ticks >= REFERENCE_TICKS and rate_rps > factor * self.rate_rps:
            return True
        if self.latest_rps is not None:
            self.rate_rps = max(self.rate_rps, self.latest_rps)
            self.ticks += 1
        self.latest_rps = rate_rps
        return False


class UnusedWindowGuard(Guard):
    """Window to 0 when waiting brings no company (MLServer #777), or when the window throttles
    its clients instead of batching them.

    It fires when the batches bring much less company than the arrival rate promises (a
    closed-loop client with one request in flight), when the batches the window releases
    waited most of it after their last arrival, far more than Poisson arrivals would leave
    (closed-loop clients fewer than the cap), or when the arrival rate answers the window
    (closed-loop clients whose round trips the window lengthens: open-loop traffic comes at its
    own rate, whatever the window). The last is tested by a probe: once the window has been open
    for ``probe_s`` (doubled after each probe that finds the rate unmoved, up to
    ``max_retry_s``) while its batches look like a fixed set of clients (alike within one
    request, below the cap), ``probe_ticks`` ticks run at window 0 (reason ``window_probe``);
    arrivals ``throttle_factor`` times the open window's rate over its latest second, beyond
    Poisson noise, shut it.
    The window then stays shut until the arrival rate rises by ``rearm_factor`` over the
    highest seen at the window in force (over two ticks at least, from its second, each tick
    joining it a tick late) or, at most, for ``retry_s``; either opening is a try (the wait
    doubled after each try that shuts it again, and at
    least the try's length over ``try_share``; a try whose arrivals fall by
    ``throttle_factor`` below the shut's latest second shuts again; one that a guard outside
    holds at 0 is put off). A verdict waits for
    ``min_batches`` batches, pooled over consecutive ticks with the window open (a wide window
    releases few batches a tick, and a try must not last longer for it), and a shortfall of
    company beyond Poisson noise. Shut is window 0, except in front of a fixed set of clients
    (the latest verdict's batches alike, two or more, below the cap) whose batches at window 0
    hold fewer than half of them (their requests come spread out): after the shut's first
    four ticks at window 0 (the first still answers the open window's batches), the window is
    ``clients_share`` of their round trip, ``clients / arrival rate`` at window 0, which
    gathers about that share of them into each batch and should lengthen their round trip by
    about half that share; after ``CLIENTS_JUDGE_S`` it goes back to 0 if they came slower by
    more than that, and the next shut measures and judges it afresh (one judgement can be
    spoilt by the clients' own hiccup); a window kept is then tried narrower
    (``CLIENTS_STEP`` of itself, at most ``CLIENTS_STEPS`` times), the narrower kept while the
    clients come faster at it than its shorter wait explains; clients that come
    ``throttle_factor`` times slower than at the window kept (over its latest
    ``CLIENTS_THINNED_S``, beyond Poisson noise) end the shut, so the policy's window is tried
    on the set as it now is; a window kept is held again at once when a later try shuts for
    the same set. The shut's retry waits for those judgements and counts its time from the
    last (each is a verdict on the traffic as it is); its clock stops while the loop
    stalls (and for ``stall_hold_s`` after) and over a tick ``LONG_TICK`` intervals long (no
    poll came: it is judged by nothing), and a try's verdict needs ``trial_min_batches``. A
    window held again after a try is judged against the clients' rate at window 0 measured
    before; found costly, it is measured and judged afresh (the machine's pace drifts). While
    the guard holds the window, the policy inside sees the window it chose in force
    (:meth:`chosen` gives it to a new policy). The law and its figures: docs/policies.md,
    "UnusedWindowGuard".

    Args:
        min_company: the least share of the expected company that counts as company.
        max_idle_fraction: a window whose released batches waited more than this share of it
            after their last arrival (and ``idle_excess`` times the Poisson share) is unused.
        idle_excess: how far beyond what Poisson arrivals leave the idle share must be.
        min_batches: batches a verdict needs (pooled over ticks with the window open).
        trial_min_batches: the same for a window tried again after a shut (a try costs the
            clients its window's latency until the verdict).
        rearm_factor: arrival-rate growth that lets the policy open the window again.
        alike_factor: batches whose largest holds at most this many times their mean (plus
            one) are alike.
        retry_s: how long the window stays shut before it is tried again, s (doubled after
            each try that shuts it again, up to ``max_retry_s``).
        try_share: the most share of the time that tries of a window that shuts again may
            take: a try that lasted ``T`` s keeps it shut at least ``T / try_share`` s after.
        max_retry_s: the longest the window stays shut without a try, and the longest between
            probes, s.
        stall_hold_s: ticks this soon after a stall of the event loop are not judged and do
            not re-arm, s.
        probe_s: how long the window stays open before the first probe, s.
        probe_ticks: how many ticks a probe runs at window 0.
        throttle_factor: how much faster clients must come at window 0 than with the window
            open for the window to count as a throttle.
        clients_share: the window while shut in front of a fixed set of clients, as a share
            of their round trip (0: window 0).
    """

    def __init__(
        self,
        inner: Policy,
        min_company: float = 0.5,
        max_idle_fraction: float = 0.5,
        idle_excess: float = 2.0,
        min_batches: int = 5,
        trial_min_batches: int = 3,
        rearm_factor: float = 1.5,
        alike_factor: float = 1.5,
        retry_s: float = 2.0,
        try_share: float = 0.05,
        max_retry_s: float = 64.0,
        stall_hold_s: float = 1.0,
        probe_s: float = 0.5,
        probe_ticks: int = 2,
        throttle_factor: float = 1.3,
        clients_share: float = 0.2,
    ) -> None:
        super().__init__(inner)
        self.alike_factor = alike_factor
        self.retry_s = retry_s
        self.try_share = try_share
        self.max_retry_s = max_retry_s
        self.stall_hold_s = stall_hold_s
        self.min_company = min_company
        self.max_idle_fraction = max_idle_fraction
        self.idle_excess = idle_excess
        self.min_batches = min_batches
        self.trial_min_batches = trial_min_batches
        self.rearm_factor = rearm_factor
        self.probe_s = probe_s
        self.probe_ticks = probe_ticks
        self.throttle_factor = throttle_factor
        self.clients_share = clients_share
        self._clients: float | None = None  # the fixed set of clients' size, as last seen
        self._clients_window = ClientsWindow(clients_share, None)
        self._kept_window: ClientsWindow | None = None  # the last kept, until the load changes
        self._holding = False  # the window in force is this guard's, not the policy's
        self._shut_for_s = retry_s  # how long the window stays shut now
        self._shut_at_s = -math.inf
        self._retry_now = False  # the clients thinned out: the retry is due at once
        self._on_trial = False  # the window was tried again and has had no verdict since
        self._tried = False  # the latest decision released the policy's window for a try
        self._trial_s = 0.0  # how long the try has run, stalls excepted, s
        self._probe_every_s = probe_s
        self._probe: _Probe | None = None
        self._fired = ""  # the test behind the latest verdict (the window_shut event says it)
        self._displaced_ms: float | None = None  # the policy's window while this guard holds 0
        self._fixed_set = False  # the latest verdict's batches looked like a fixed set of clients
        self._largest = 0  # the largest of the latest verdict's batches
        self._evidence = _Evidence()
        self._stretch = Stretch()
        self._open_ticks: deque[Stretch] = deque(maxlen=4)  # the open stretch's latest
        self.closed = False
        self._reference = _RearmReference()  # measured afresh at each shut
        self._recent_shut: deque[Stretch] = deque(maxlen=4)  # the shut's latest ticks

    def decide(self, observation: Observation) -> Decision:
        """The inner policy's decision, corrected; while this guard holds the window at 0, the
        policy sees the window it chose in force, not the guard's 0 (a policy that keeps the
        settings in force, as ``PID`` without an SLO or ``Static()``, would keep the 0 for good)."""
        seen = observation
        if self._displaced_ms is not None:
            current = observation.current.with_(window_ms=self._displaced_ms)
            seen = replace(observation, current=current)
        chosen = self.inner.decide(seen)
        decision = self.correct(observation, chosen)
        held = decision.reason in _HELD  # the guard's window, even where it equals the policy's
        self._displaced_ms = chosen.window_ms if held else None
        self._holding = held
        self._tried = self._on_trial and not held and decision.window_ms > 0
        return decision

    def chosen(self, in_force: Decision) -> Decision:
        chosen = super().chosen(in_force)
        if self._displaced_ms is not None:
            return chosen.with_(window_ms=self._displaced_ms)
        return chosen

    def correct(self, observation: Observation, decision: Decision) -> Decision:
        now = observation.now_s
        if self._tried and observation.current.window_ms <= 0.0:
            self._postpone_try(now)  # a guard outside held the try's window at 0
        long_tick = observation.interval_s >= LONG_TICK * observation.tick_interval_s
        judged = now - observation.loop_stall_s >= self.stall_hold_s and not long_tick
        if self._policy_window_open(observation) and judged:
            self._stretch.add(observation)
            self._open_ticks.append(Stretch.of(observation))
        else:
            self._stretch = Stretch()
            self._open_ticks.clear()
            self._fixed_set = False
        if self.closed and judged:
            self._recent_shut.append(Stretch.of(observation))
            self._observe_clients_window(observation)
            if self._clients_window.thinned(self.throttle_factor):
                self._end_shut_for_thinned_clients()
            elif self._clients_window.kept:
                self._kept_window = self._clients_window
            elif self._clients_window.costly:
                self._kept_window = None  # the next shut measures at window 0 afresh
        elif self.closed:
            # the shut's clock stops while the loop stalls (and for the hold after it): a try
            # must show the traffic, and a stall shows none
            self._shut_at_s += observation.interval_s
        if not judged:
            self._evidence = _Evidence()  # the batches waited out the stall, not for company
        elif self._on_trial:
            self._trial_s += observation.interval_s
        verdict = self._verdict(observation) if judged else None
        probe = self._probe
        if probe is not None:
            probe.ticks_left -= 1
            if not judged:
                self._probe = None  # a stall spoils the probe: no verdict
            else:
                probe.shut.add(observation)
                if probe.ticks_left > 0:
                    return decision.with_(window_ms=0.0, reason="window_probe")
                self._probe = None
                verdict = self._throttled_at_probe(probe)
                self._fired = "probe"
        if verdict:
            self._shut(now)
        elif verdict is False:
            self._on_trial = False
        elif self.closed and judged:
            self._rearm_on_load(observation.arrival_rate_rps, observation.current.window_ms)
        if self._retry_due(now):
            self._try_window()
        if self.closed and decision.window_ms > 0:
            window_ms = min(decision.window_ms, self._clients_window.holding_ms or 0.0)
            return decision.with_(window_ms=window_ms, reason=WINDOW_UNUSED)
        if decision.window_ms > 0 and self._probe_due():
            self._probe = _Probe(opened=self._recent_open(), ticks_left=self.probe_ticks)
            self._stretch = Stretch()
            return decision.with_(window_ms=0.0, reason="window_probe")
        return decision

    def _observe_clients_window(self, observation: Observation) -> None:
        """Give the tick to the clients' window; each of its judgements restarts the shut's
        clock: a try tests whether the traffic changed since the latest verdict, and
        the judgement is one (in the README's app a try came on the tick the window was kept,
        2 s into the shut, and cost its 16 clients a tick of answers past the SLO)."""
        verdicts = self._clients_window.verdicts
        self._clients_window.observe(observation)
        if self._clients_window.verdicts > verdicts:
            self._shut_at_s = observation.now_s

    def _verdict(self, observation: Observation) -> bool | None:
        """True: the window is unused; False: it brings company; None: too few batches yet."""
        if not self._policy_window_open(observation):
            self._evidence = _Evidence()
            return None
        if observation.batches > 0:
            self._evidence.add(observation)
        pool = self._evidence
        if pool.batches < (self.trial_min_batches if self._on_trial else self.min_batches):
            return None
        mean_batch = pool.batch_size / pool.batches
        idle = pool.idle / pool.idle_batches if pool.idle_batches else math.nan
        idle_limit = max(
            self.max_idle_fraction, self.idle_excess * pool.poisson_idle / pool.batches
        )
        alike = pool.largest <= self.alike_factor * mean_batch + 1
        idle_test = alike and idle > idle_limit  # NaN: False
        trial_test = self._throttled_on_trial()
        unused = idle_test or trial_test
        lonely = self._lonely(pool)
        if lonely is None and not unused and pool.batches < 4 * self.min_batches:
            return None  # too few companions promised yet to tell chance from clients
        self._evidence = _Evidence()
        room = observation.current.max_batch_size / max(observation.mean_request_units, 1.0)
        self._fixed_set = mean_batch >= 2.0 and pool.largest <= min(mean_batch + 1.0, room - 1.0)
        self._clients = mean_batch if self._fixed_set else None
        self._largest = pool.largest
        self._fired = "idle" if idle_test else "try_rate" if trial_test else "lonely"
        return unused or bool(lonely)

    def _retry_due(self, now: float) -> bool:
        """Whether the shut has lasted its time, and a clients' window held in it is settled
        (a try before its judgement would leave it unjudged, with long ticks for good), or
        ``CLIENTS_WAIT_S`` more have passed (ticks without batches measure nothing); or the
        clients thinned out (:meth:`_end_shut_for_thinned_clients`)."""
        if self.closed and self._retry_now:
            return True
        late_s = now - self._shut_at_s - self._shut_for_s
        settled = self._clients_window.settled or late_s >= CLIENTS_WAIT_S
        return self.closed and late_s >= 0 and settled

    def _policy_window_open(self, observation: Observation) -> bool:
        """Whether the tick ran the policy's window, > 0 (not one this guard held)."""
        return observation.current.window_ms > 0 and not self._holding

    def _lonely(self, pool: _Evidence) -> bool | None:
        """Whether the batches brought under ``min_company`` of the companions the arrival rate
        promises, beyond Poisson noise (3 standard deviations; a pool of five thin batches,
        c = 0.9 each, falls under half by chance one time in six). None: under half, but
        within the noise."""
        seen, promised = pool.batch_size - pool.batches, pool.promised
        if not (pool.company / pool.batches >= 0.5 and seen < self.min_company * promised):
            return False  # NaN: False
        return True if beyond_noise(promised, seen) else None

    def _throttled_on_trial(self) -> bool:
        """Whether a window tried again brought fewer arrivals than the shut's latest ticks
        (at most four; over the whole shut, up to 64 s, a load that fell before the try read
        as a throttle)."""
        shut, stretch = Stretch.pooled(self._recent_shut), self._stretch
        if not self._on_trial or shut.seconds <= 0 or stretch.seconds <= 0:
            return False
        return rate_rose(stretch.rate_rps, stretch.seconds, shut.rate_rps * stretch.seconds,
                         self.throttle_factor)  # fmt: skip

    def _recent_open(self) -> Stretch:
        """Arrivals over the open stretch's latest ticks (at most four): what the probe is
        compared with (over the whole stretch, up to 64 s, a growing load read as a throttle)."""
        return Stretch.pooled(self._open_ticks)

    def _throttled_at_probe(self, probe: _Probe) -> bool:
        """Whether the probe's ticks (window 0) brought arrivals faster than the open window's;
        a probe that did not doubles the time to the next."""
        shut = probe.shut
        if rate_rose(probe.opened.rate_rps, shut.seconds, shut.arrivals, self.throttle_factor):
            self._probe_every_s = self.probe_s
            return True
        self._probe_every_s = min(self.max_retry_s, 2.0 * self._probe_every_s)
        return False

    def _probe_due(self) -> bool:
        """Whether the window has been open long enough, with the batches of its latest verdict
        like a fixed set of clients' (alike within one request, at least two, below the cap),
        to probe it."""
        return self._fixed_set and self._stretch.seconds >= self._probe_every_s

    def _rearm_on_load(self, rate_rps: float, window_ms: float) -> None:
        """Open the window when the arrival rate has grown ``rearm_factor`` times over the
        reference (:class:`_RearmReference`)."""
        if self._reference.risen(rate_rps, window_ms, self.rearm_factor):
            self._try_window()

    def _try_window(self) -> None:
        """Open the policy's window again, on trial: shut again at its first verdict, the shut
        lasts twice as long (a re-arm by load too: in the README's app re-arms by chance reset
        the wait to 2 s, and its closed-loop clients paid a try every 2 s)."""
        self.closed, self._retry_now = False, False
        self._clients_window.cancel_trial()
        self._on_trial = True
        self._trial_s = 0.0

    def _end_shut_for_thinned_clients(self) -> None:
        """The clients came slower than at their kept window, beyond noise: try the policy's
        window now, whose verdict sees the set as it is (a shut then measures it afresh)."""
        _log.info("controller.clients_thinned", window_ms=self._clients_window.holding_ms)
        self._kept_window = None
        self._retry_now = True

    def _postpone_try(self, now: float) -> None:
        """A guard outside held a try's window at 0 (``StallGuard``, while loop stalls
        recur): no verdict can come, and the clients' window is lost meanwhile. Shut again as
        before, for as long as before."""
        self.closed, self._on_trial = True, False
        self._shut_at_s = now
        self._recent_shut.clear()

    def _shut(self, now: float) -> None:
        """Shut the window at ``now``: if it was on trial (tried again after a shut and shut
        again at its first verdict), for twice as long as before and at least the try's length
        over ``try_share``."""
        _log.info("controller.window_shut", test=self._fired, on_trial=self._on_trial)
        kept = self._kept_window
        if kept is not None and self._on_trial and kept.same_clients(float(self._largest)):
            # a try of the wide window gathers the whole set into its batches; the first may
            # hold the kept window's last few, so their mean is no measure of the set
            self._clients = kept.clients
        if self._on_trial:
            longer_s = max(2.0 * self._shut_for_s, self._trial_s / self.try_share)
            self._shut_for_s = min(self.max_retry_s, longer_s)
        elif not self.closed:
            self._shut_for_s = self.retry_s
        self._on_trial = False
        self.closed, self._retry_now = True, False
        self._shut_at_s = now
        self._recent_shut.clear()
        clients = self._clients
        if kept is not None and kept.same_clients(clients):
            self._clients_window = ClientsWindow.kept_from(kept)  # measured and judged before
        else:
            self._clients_window = ClientsWindow(self.clients_share, clients)
        self._reference = _RearmReference()
