"""A fixed set of closed-loop clients in front of a shut window: the window held for them
(a share of their round trip, judged by the rate they come at, then tried narrower), and the
arrival counts the unused-window guard judges by. The law: docs/policies.md,
"UnusedWindowGuard"."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from adaptive_batcher._log import get_logger
from adaptive_batcher.control.types import Observation

__all__ = ["CLIENTS_WAIT_S", "ClientsWindow", "Settled", "Stretch", "beyond_noise", "rate_rose"]

_log = get_logger()

NOISE_Z = 3.0  # a count beyond Poisson noise: this many standard deviations from its mean


@dataclass(slots=True)
class Stretch:
    """Arrivals over a run of ticks (the window open without a break, or shut)."""

    arrivals: float = 0.0
    seconds: float = 0.0

    @classmethod
    def of(cls, observation: Observation) -> Stretch:
        """The tick's own arrivals and length."""
        return cls(observation.arrival_rate_rps * observation.interval_s, observation.interval_s)

    @classmethod
    def pooled(cls, ticks: deque[Stretch]) -> Stretch:
        """The arrivals and seconds of ``ticks`` together."""
        return cls(sum(t.arrivals for t in ticks), sum(t.seconds for t in ticks))

    def add(self, observation: Observation) -> None:
        tick = Stretch.of(observation)
        self.arrivals += tick.arrivals
        self.seconds += tick.seconds

    @property
    def rate_rps(self) -> float:
        return self.arrivals / self.seconds if self.seconds > 0 else math.nan


@dataclass(slots=True)
class Settled(Stretch):
    """Arrivals at a window just set, from its second tick (the first still answers the
    batches of the window before it)."""

    ticks: int = 0  # ticks seen, the first included

    def add(self, observation: Observation) -> None:
        self.ticks += 1
        if self.ticks >= 2:
            Stretch.add(self, observation)


CLIENTS_JUDGE_S = 1.0
"""How long a fixed set of clients' window is held before its cost to them is judged, s."""

CLIENTS_ZERO_TICKS = 3
"""Ticks at window 0 that measure a fixed set of clients' rate, after the shut's first."""

CLIENTS_WAIT_S = 2.0
"""The longest a shut's retry waits past its time for the clients' window's judgement, s."""

CLIENTS_STEP = 0.7
"""A kept clients' window is tried at this share of itself, to see whether they come faster."""

CLIENTS_STEPS = 2
"""The most steps down a kept clients' window takes (to ``CLIENTS_STEP ** 2`` of itself)."""

CLIENTS_THINNED_S = 2.0
"""How long clients must come slower than at their kept window before it is tried again, s
(over one second, the README app's clients' own swings of 1.3x ended it twice in a run)."""


@dataclass(slots=True)
class ClientsWindow:
    """The window held while shut in front of a fixed set of ``clients`` (None: no such set
    seen): measured at window 0, then judged once by the rate the clients come at; once kept,
    tried narrower (``CLIENTS_STEP`` of itself, at most ``CLIENTS_STEPS`` times) while the
    clients come faster at the narrower one than its shorter wait explains."""

    share: float
    clients: float | None
    window_ms: float | None = None  # None: still measuring at window 0
    at_zero: Settled = field(default_factory=Settled)  # ticks at window 0 with batches
    held: Stretch = field(default_factory=Stretch)  # ticks at the window
    judged: bool = False
    costly: bool = False  # judged: the clients came slower by more than the window should cost
    steps_left: int = CLIENTS_STEPS  # steps down still to try once kept
    trial_ms: float | None = None  # a narrower window on trial
    trial: Settled = field(default_factory=Settled)  # its ticks
    steady: deque[Stretch] = field(default_factory=lambda: deque(maxlen=8))  # at the kept one
    reused_zero: bool = False  # at_zero was measured for an earlier shut
    verdicts: int = 0  # judgements made, of the window and of its steps

    def __post_init__(self) -> None:
        if self.clients is None:
            self.window_ms = 0.0  # no set of clients: window 0, nothing to measure

    @classmethod
    def kept_from(cls, earlier: ClientsWindow) -> ClientsWindow:
        """A window judged and kept for the same set of clients, held again at once and
        judged again against the rate they came at at window 0 then (one judgement that
        kept a costly window by chance must not hold it for good)."""
        window = cls(earlier.share, earlier.clients, earlier.window_ms, at_zero=earlier.at_zero)
        window.steps_left = earlier.steps_left
        window.reused_zero = True
        return window

    @property
    def holding_ms(self) -> float | None:
        """The window to hold now: the one on trial, else the measured one (None: measuring)."""
        return self.trial_ms if self.trial_ms is not None else self.window_ms

    @property
    def kept(self) -> bool:
        """Whether a window above 0 was judged and kept."""
        return self.judged and not self.costly and (self.window_ms or 0.0) > 0

    def same_clients(self, clients: float | None) -> bool:
        """Whether ``clients`` is this window's set, within one request."""
        return clients is not None and self.clients is not None and abs(clients - self.clients) <= 1

    def observe(self, observation: Observation) -> None:
        """Take a tick with the window shut: measure, then judge the window held."""
        if self.window_ms is None:
            self._measure(observation)
        elif self.window_ms > 0 and not self.judged and observation.current.window_ms > 0:
            self.held.add(observation)
            if self.held.seconds >= CLIENTS_JUDGE_S:
                self._judge()
                self._step_down()
        elif self.trial_ms is not None and observation.current.window_ms > 0:
            self.trial.add(observation)
            if self.trial.seconds >= CLIENTS_JUDGE_S:
                self._judge_step()
        elif self.kept and observation.current.window_ms > 0:
            self.steady.append(Stretch.of(observation))

    def thinned(self, factor: float) -> bool:
        """Whether the clients have come ``factor`` times slower than at the window kept, over
        its latest ``CLIENTS_THINNED_S`` (at most eight ticks), beyond Poisson noise: fewer
        clients, or slower ones, whom the window no longer fits (the README's app: 16 clients
        down to 4 got half the answers of window 0 at the 16's window)."""
        recent = Stretch.pooled(self.steady)
        if not self.kept or self.trial_ms is not None or recent.seconds < CLIENTS_THINNED_S:
            return False
        expected = self.held.rate_rps * recent.seconds  # at the rate the window was kept at
        return rate_rose(recent.rate_rps, recent.seconds, expected, factor)

    @property
    def settled(self) -> bool:
        """Whether no judgement is pending: no window held yet, window 0, or judged, with no
        narrower window on trial."""
        judged = self.window_ms is None or self.window_ms == 0 or self.judged
        return judged and self.trial_ms is None

    def _measure(self, observation: Observation) -> None:
        """``CLIENTS_ZERO_TICKS`` ticks at window 0 after the first (which still answers the
        open window's batches); the window is then ``share`` of the clients' round trip,
        ``clients / rate``, if their batches hold fewer than half of them, else 0."""
        if observation.current.window_ms > 0 or observation.batches <= 0:
            return
        self.at_zero.add(observation)
        if self.at_zero.ticks < 1 + CLIENTS_ZERO_TICKS:
            return
        clients, rate_rps = self.clients, self.at_zero.rate_rps
        if clients is None or not rate_rps > 0 or not observation.mean_batch_size < clients / 2:
            self.window_ms = 0.0  # no set, or at window 0 its batches hold it already
            return
        self.window_ms = 1e3 * self.share * clients / rate_rps

    def _judge(self) -> None:
        """Back to window 0 if the clients came slower than at window 0 by more than the
        ``1 + share / 2`` the window should cost them (the device time it saves did not speed
        them up). A choice between two windows, not an alarm: the rates as measured, without
        a noise bound (one at 75-150 req/s let 1.2-1.3x slowdowns pass)."""
        self.judged, self.verdicts = True, self.verdicts + 1
        held, at_zero = self.held, self.at_zero
        costly = at_zero.rate_rps > (1.0 + self.share / 2) * held.rate_rps
        remeasure = costly and self.reused_zero
        _log.info(
            "controller.clients_window",
            window_ms=round(self.window_ms or 0.0, 3),
            kept=not costly,
            rate_rps=round(held.rate_rps, 1),
            rate_at_zero_rps=round(at_zero.rate_rps, 1),
            remeasure=remeasure,
        )
        if remeasure:
            self._measure_again()
        elif costly:
            self.window_ms = 0.0
            self.costly = True

    def _measure_again(self) -> None:
        """Measure the clients at window 0 afresh, then hold and judge the window again: a
        window held again after a try was judged against their rate at window 0 from an earlier
        shut, and the machine's pace drifts (the README's app after its 20 s stall: 481 req/s
        at the kept window against 552 at window 0 25 s before read as costly, and window 0
        cost the clients a quarter of their answers for the rest of the run)."""
        self.window_ms, self.judged, self.reused_zero = None, False, False
        self.at_zero, self.held = Settled(), Stretch()

    def cancel_trial(self) -> None:
        """Drop the narrower window on trial, unjudged (the shut ends); its step is kept for
        the next time this window is kept."""
        if self.trial_ms is not None:
            self.trial_ms = None
            self.steps_left += 1

    def _step_down(self) -> None:
        """Put a narrower window on trial, if the window is kept and steps are left."""
        if self.kept and self.steps_left > 0 and self.window_ms is not None:
            self.steps_left -= 1
            self.trial_ms = CLIENTS_STEP * self.window_ms
            self.trial = Settled()

    def _judge_step(self) -> None:
        """Keep the narrower window if the clients came faster at it than the wait it saves
        them explains (half the difference of the two windows, as a share of their round
        trip at the wider one): the model calls it adds then cost them less than the company
        it loses (the README's app on two cores, where the device is the CPU the HTTP stack
        needs). Else the wider window stays, and the climb ends."""
        self.verdicts += 1
        wider_ms, narrower_ms = self.window_ms or 0.0, self.trial_ms or 0.0
        held_rps, trial_rps = self.held.rate_rps, self.trial.rate_rps
        round_trip_ms = 1e3 * (self.clients or 0.0) / held_rps
        explained = 1.0 + 0.5 * (wider_ms - narrower_ms) / round_trip_ms
        faster = trial_rps > explained * held_rps  # NaN: False
        _log.info(
            "controller.clients_window_step",
            window_ms=round(wider_ms, 3),
            trial_ms=round(narrower_ms, 3),
            kept_trial=faster,
            rate_rps=round(held_rps, 1),
            trial_rate_rps=round(trial_rps, 1),
        )
        self.trial_ms = None
        if not faster:
            self.steps_left = 0
            return
        self.window_ms, self.held = narrower_ms, self.trial
        self.steady.clear()
        self._step_down()


def beyond_noise(expected: float, seen: float) -> bool:
    """Whether a Poisson count ``seen`` is ``NOISE_Z`` standard deviations from ``expected``."""
    return abs(seen - expected) >= NOISE_Z * math.sqrt(expected)


def rate_rose(base_rps: float, seconds: float, arrivals: float, factor: float) -> bool:
    """Whether ``arrivals`` in ``seconds`` are ``factor`` times what a rate of ``base_rps`` brings,
    beyond Poisson noise."""
    expected = base_rps * seconds
    return arrivals >= factor * expected and beyond_noise(expected, arrivals)
