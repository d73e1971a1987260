"""BatcherCore on its own: the sans-IO rules the runtime and the simulator share, driven by hand."""

from __future__ import annotations

import re

import pytest

from adaptive_batcher.control.types import Bounds
from adaptive_batcher.core.batcher_core import BatcherCore
from adaptive_batcher.core.engine import Dispatch, EngineLimits, Expire, Request, SetTimer
from adaptive_batcher.core.settings import BatcherSettings
from adaptive_batcher.errors import (
    BatcherClosedError,
    ItemSizeError,
    ItemTooLargeError,
    QueueFullError,
)
from adaptive_batcher.policies import PID, Static
from adaptive_batcher.slo import SLO
from tests.control.factories import observe


def make_core(**settings: object) -> BatcherCore[int]:
    core: BatcherCore[int] = BatcherCore(BatcherSettings(**settings))  # type: ignore[arg-type]
    core.start(0.0)
    return core


def dispatched(actions: list[object]) -> list[list[int]]:
    return [[r.handle for r in a.batch.requests] for a in actions if isinstance(a, Dispatch)]


# -- arrive, poll, complete ---------------------------------------------------------------


def test_arrive_poll_complete_run_a_batch_and_free_its_slot() -> None:
    core = make_core(max_batch_size=4, window_ms=5.0)
    assert core.arrive(Request(0, 0.0), 0.0)  # the first needs a timer: poll next
    assert core.poll(0.0) == [SetTimer(at_s=0.005)]
    assert not core.arrive(Request(1, 0.001), 0.001)  # the timer covers it
    assert (core.queue_depth, core.queued_units, core.in_flight) == (2, 2, 0)
    first, timer = core.poll(0.005)
    assert isinstance(first, Dispatch) and timer == SetTimer(at_s=None)
    assert dispatched([first]) == [[0, 1]]
    assert (core.queue_depth, core.in_flight, core.idle) == (0, 1, False)
    core.arrive(Request(2, 0.006), 0.006)
    assert dispatched(core.poll(0.02)) == []  # the only slot is busy
    core.complete(first.batch, 0.02)
    assert dispatched(core.poll(0.02)) == [[2]]  # waited past its window: goes at once
    assert core.recorder.counts().submitted == 3


def test_the_queries_answer_for_the_engine() -> None:
    core = make_core(max_batch_size=8, window_ms=2.0, max_concurrent_batches=2)
    assert core.limits == EngineLimits(0.002, 8, 2)
    assert core.hard_cap == 8
    assert core.idle and core.in_flight == 0
    core.arrive(Request(0, 0.0, size=3), 0.0)
    assert (core.queue_depth, core.queued_units, core.idle) == (1, 3, False)


def test_a_refused_arrival_is_counted_submitted_and_rejected() -> None:
    core = make_core(max_batch_size=1, window_ms=5.0, max_queue_size=1)
    core.arrive(Request(0, 0.0), 0.0)  # the idle slot takes it next
    core.arrive(Request(1, 0.0), 0.0)  # one waits
    with pytest.raises(QueueFullError):
        core.arrive(Request(2, 0.0), 0.0)
    with pytest.raises(ItemTooLargeError):
        core.arrive(Request(3, 0.0, size=2), 0.0)
    counts = core.recorder.counts()
    assert (counts.submitted, counts.rejected) == (4, 2)


def test_refuse_counts_a_request_that_never_arrived() -> None:
    core = make_core()
    error = ItemSizeError("size_fn raised")
    assert core.refuse(error) is error
    counts = core.recorder.counts()
    assert (counts.submitted, counts.rejected) == (1, 1)


def test_arrive_many_queues_what_single_arrivals_would() -> None:
    core = make_core(max_batch_size=4, window_ms=5.0)
    requests = [Request(i, 0.001 * i) for i in range(3)]
    assert core.arrive_many(requests) == (1, True)  # the first needs a poll
    core.poll(0.0)
    assert core.arrive_many(requests, 1) == (3, False)  # the timer covers the rest
    assert core.recorder.counts().submitted == 3 and core.queue_depth == 3


def test_a_deadline_becomes_an_expire_action_for_the_shell() -> None:
    core = make_core(max_batch_size=1, window_ms=0.0)
    core.arrive(Request(0, 0.0), 0.0)
    (running, _) = core.poll(0.0)
    assert isinstance(running, Dispatch)  # the only slot is busy
    core.arrive(Request(1, 0.001, deadline_s=0.01), 0.001)
    assert core.poll(0.001) == [SetTimer(at_s=0.01)]  # a timer for the deadline
    expired, timer = core.poll(0.01)
    assert isinstance(expired, Expire) and expired.request.handle == 1
    assert timer == SetTimer(at_s=None)
    core.count_expired(1)  # the shell failed it with DeadlineExceededError
    assert core.recorder.counts().expired == 1


def test_cancel_withdraws_a_queued_request() -> None:
    core = make_core(max_batch_size=4, window_ms=5.0)
    request = Request(0, 0.0)
    core.arrive(request, 0.0)
    assert core.cancel(request)
    assert not core.cancel(request)  # once
    core.count_cancelled(1)
    assert dispatched(core.poll(0.005)) == []
    assert core.recorder.counts().cancelled == 1


# -- close -------------------------------------------------------------------------------


def test_close_without_drain_returns_the_queue_for_the_shell_to_fail() -> None:
    core = make_core(max_batch_size=4, window_ms=5.0)
    queued = [Request(i, 0.0) for i in range(2)]
    for request in queued:
        core.arrive(request, 0.0)
    assert core.close(drain=False) == queued
    core.count_rejected(len(queued))
    with pytest.raises(BatcherClosedError):
        core.arrive(Request(2, 0.001), 0.001)
    counts = core.recorder.counts()
    assert (counts.submitted, counts.rejected) == (3, 3)


def test_close_with_drain_dispatches_without_waiting_for_the_window() -> None:
    core = make_core(max_batch_size=4, window_ms=50.0)
    core.arrive(Request(0, 0.0), 0.0)
    assert core.close(drain=True) == []
    assert dispatched(core.poll(0.001)) == [[0]]  # not at 0.05


# -- recording and counting --------------------------------------------------------------


def test_answers_runs_and_device_time_are_recorded() -> None:
    core = make_core(max_batch_size=4, window_ms=0.0, slo=SLO(latency_ms=10.0))
    core.record_answers([0.0, 0.015, 0.016], 1, 0.02)  # 20, 5 and 4 ms; one failed
    core.record_run(0.02, 3, 4, 0.004, window_idle_s=0.001)
    core.record_device_time(0.004)
    counts = core.recorder.counts()
    assert (counts.completed, counts.failed) == (2, 1)
    assert counts.within_slo == 1  # two in time, less the failure (counted as the slowest)
    assert (counts.batches, counts.batch_items, counts.batch_units) == (1, 3, 4)
    assert counts.window_idle_s == pytest.approx(0.001)
    assert counts.device_busy_s == pytest.approx(0.004)


def test_an_answer_is_within_the_slo_when_its_preprocessing_fits_beside_it() -> None:
    """The batcher times a request from its submission; ``preprocess_ms`` came before it, so
    an answer is within the SLO when its latency fits the room, ``latency_ms - preprocess_ms``
    (before: within ``latency_ms`` itself, so a 45 ms answer after 10 ms of preprocessing
    counted as within a 50 ms SLO)."""
    core = make_core(max_batch_size=4, window_ms=0.0, slo=SLO(50.0, preprocess_ms=10.0))
    core.record_answers([0.0, 0.005, 0.011], 0, 0.05)  # 50, 45 and 39 ms
    assert core.recorder.counts().within_slo == 1


def test_a_streams_first_element_is_timed_and_its_end_counted_later() -> None:
    core = make_core(slo=SLO(latency_ms=10.0))
    assert core.record_first_elements([0.0, 0.015], 0.02) == [False, True]
    assert core.recorder.counts().completed == 0  # counted at its end
    core.count_completed(2, 1)
    core.count_failed(1)
    counts = core.recorder.counts()
    assert (counts.completed, counts.within_slo, counts.failed) == (2, 1, 1)


@pytest.mark.parametrize(
    "count", ["count_failed", "count_rejected", "count_expired", "count_cancelled"]
)
def test_counts_only_go_up(count: str) -> None:
    core = make_core()
    with pytest.raises(ValueError, match=re.escape("a count only goes up; got a change of -1")):
        getattr(core, count)(-1)


def test_within_slo_is_part_of_completed() -> None:
    core = make_core()
    with pytest.raises(ValueError, match=re.escape("within_slo must be in 0..1, got 2")):
        core.count_completed(1, 2)
    with pytest.raises(ValueError, match=re.escape("a count only goes up; got a change of -1")):
        core.count_completed(-1, 0)


# -- out of memory and splitting ---------------------------------------------------------


def test_an_oom_call_is_counted_and_split_in_halves() -> None:
    core = make_core(max_batch_size=8, slo=SLO(latency_ms=50.0))
    halves = core.split_failed_call([1, 2, 3, 4, 5], oom=True)
    assert halves == ([1, 2], [3, 4, 5])
    assert core.recorder.counts().oom_errors == 1
    assert core.split_failed_call(range(4, 10), oom=True) == (range(4, 7), range(7, 10))
    assert core.split_failed_call([7], oom=True) is None  # a single item cannot be split
    assert core.recorder.counts().oom_errors == 3  # every OOM counts, a single item's too


def test_other_failures_split_only_when_bisecting() -> None:
    core = make_core()
    assert core.split_failed_call([1, 2, 3], oom=False) is None
    assert core.split_failed_call([1, 2, 3], oom=False, bisect=True) == ([1], [2, 3])
    assert core.recorder.counts().oom_errors == 0


def test_an_oom_forces_a_controller_tick_at_the_next_poll() -> None:
    core = make_core(max_batch_size=8, slo=SLO(latency_ms=50.0), control_interval_ms=1000.0)
    assert core.controller is not None
    core.poll(0.0)  # the first tick
    ticks = core.controller.decisions
    core.poll(0.01)
    assert core.controller.decisions == ticks  # not due for a second
    core.note_oom()
    core.poll(0.02)
    assert core.controller.decisions == ticks + 1


# -- changes at run time -----------------------------------------------------------------


def test_set_limits_applies_within_the_hard_cap_and_the_controller_follows() -> None:
    core = make_core(max_batch_size=8, window_ms=5.0, policy=Static())
    core.set_limits(EngineLimits(0.002, 4, 1))
    assert core.limits == EngineLimits(0.002, 4, 1)
    assert core.controller is not None and core.controller.decision is not None
    assert (core.controller.decision.window_ms, core.controller.decision.max_batch_size) == (
        2.0,
        4,
    )
    with pytest.raises(ValueError, match="exceeds"):
        core.set_limits(EngineLimits(0.002, 9, 1))


def test_set_hard_cap_moves_the_cap_and_its_default_bound() -> None:
    core = make_core(max_batch_size=8, policy=Static())
    core.set_hard_cap(16)
    assert core.hard_cap == 16 and core.bounds.max_batch_size == 16
    core.arrive(Request(0, 0.0, size=12), 0.0)  # larger than 8: accepted now
    core.set_hard_cap(4)
    assert core.limits.max_batch_size == 4 and core.bounds.max_batch_size == 4
    with pytest.raises(ItemTooLargeError):
        core.arrive(Request(1, 0.0, size=5), 0.0)


def test_set_hard_cap_is_refused_with_buckets() -> None:
    core = make_core(max_batch_size=8, batch_sizes=(4, 8))
    message = "max_batch_size: the hard cap of a batcher with batch_sizes is its largest bucket"
    with pytest.raises(ValueError, match=re.escape(message)):
        core.set_hard_cap(16)


def test_set_slo_starts_the_default_controller_unless_stopped() -> None:
    core = make_core()
    assert core.controller is None
    core.set_slo(SLO(latency_ms=50.0), 0.0)
    assert core.controller is not None and isinstance(core.controller.policy, PID)
    assert core.controller.decision is not None  # started at once
    core.set_policy(None)
    core.set_slo(SLO(latency_ms=80.0), 1.0)
    assert core.controller is None  # stopped on purpose: an SLO does not restart it
    assert core.slo == SLO(latency_ms=80.0)
    assert core.recorder.slo_latency_s == pytest.approx(0.08)


@pytest.mark.parametrize("start", ["set_slo", "set_policy"])
def test_a_controller_started_mid_run_holds_its_slack_as_after_a_new_slo(start: str) -> None:
    """The latencies recorded before it started are of settings it did not plan (no SLO, or
    no controller): its measured slack may not rise on them for settle_s (2 s)."""
    core = make_core(slo=SLO(latency_ms=50.0) if start == "set_policy" else None)
    if start == "set_policy":
        core.set_policy(None)
        core.set_policy(PID(), 0.0)
    else:
        core.set_slo(SLO(latency_ms=50.0), 0.0)
    assert core.controller is not None
    slack = core.controller.tail_slack
    roomy = {"latency_ms": 20.0, "latency_samples": 1000}  # half the 40 ms target to spare
    assert slack.update(observe(now_s=5.0, **roomy)) == 1.0
    assert slack.update(observe(now_s=6.9, **roomy)) == 1.0
    assert slack.update(observe(now_s=7.0, **roomy)) > 1.0


def test_set_slo_none_is_refused_while_shedding_late() -> None:
    core = make_core(slo=SLO(latency_ms=50.0), shed_late=True)
    with pytest.raises(ValueError, match="shed_late=True needs an slo"):
        core.set_slo(None)
    assert core.slo == SLO(latency_ms=50.0)


def test_set_policy_switches_or_stops_the_controller() -> None:
    core = make_core(slo=SLO(latency_ms=50.0))
    assert core.controller is not None
    controller = core.controller
    static = Static(window_ms=1.0)
    core.set_policy(static)
    assert core.controller is controller and controller.policy is static  # bumpless switch
    core.shed_after_s = 0.01
    core.set_policy(None)
    assert core.controller is None and core.shed_after_s is None
    with pytest.raises(TypeError, match="policy must be a Policy"):
        core.set_policy(object())  # type: ignore[arg-type]
    core.set_policy(Static(), 2.0)
    assert core.controller is not None and core.controller.decision is not None


def test_shedding_deadlines_follow_the_queue() -> None:
    core = make_core(max_batch_size=2, window_ms=5.0)
    core.shed_after_s, core.shed_after_short_s = 0.01, 0.03
    short = Request(0, 0.0)
    core.arrive(short, 0.0)  # the queue held less than a full batch: the short deadline
    core.arrive(Request(1, 0.0), 0.0)
    full = Request(2, 0.0, deadline_s=0.5)
    core.arrive(full, 0.0)  # a full batch queued already: the (earlier) full-batch one
    own = Request(3, 0.0, deadline_s=0.001)
    core.arrive(own, 0.0)  # its own deadline is earlier: kept
    assert (short.deadline_s, full.deadline_s, own.deadline_s) == (0.03, 0.01, 0.001)


# -- seeding the service-time model ------------------------------------------------------


def test_seed_service_times_is_taken_once_by_a_controller_with_an_slo() -> None:
    assert not make_core().wants_service_times  # no controller
    assert not make_core(policy=Static()).wants_service_times  # no SLO
    seeded = make_core(slo=SLO(latency_ms=50.0), service_profile=[(1, 2.0)])
    assert not seeded.wants_service_times  # a profile came first
    core = make_core(slo=SLO(latency_ms=50.0))
    assert core.wants_service_times
    assert not core.seed_service_times([])  # nothing measured
    assert core.seed_service_times([(1, 2.0), (8, 4.0)])
    assert core.controller is not None
    assert core.controller.service_estimator.median_ms(8) == pytest.approx(4.0)
    assert not core.wants_service_times and not core.seed_service_times([(1, 9.0)])


def test_a_seed_makes_the_next_poll_tick_and_shed_however_soon() -> None:
    core = make_core(slo=SLO(latency_ms=50.0), shed_late=True, max_batch_size=8)
    assert core.controller is not None
    core.poll(0.3)  # a tick (due at once after the start) with nothing to plan from
    assert core.shed_after_s == 0.05  # no batch time known: one that waited the SLO is late
    assert core.seed_service_times([(1, 2.0), (8, 4.0)])
    core.arrive(Request(0, 0.31), 0.31)  # 10 ms after the last tick: not due by itself
    core.poll(0.31)
    assert core.shed_after_s is not None and core.shed_after_s < 0.05  # the plan's deadline
    assert core.controller.decisions == 2


def test_a_hung_batch_lets_the_controller_tick_and_shed_the_queue_behind_it() -> None:
    """Before: a model call that never returned, before the first tick, left every later
    arrival queued for good with ``shed_late=True``: arrivals into busy slots ask for no poll,
    and nothing else polled, so the controller never ticked nor set a shedding deadline (a
    fresh user's finding, 2026-12-06). The core's timer now comes by the time a tick is
    overdue while requests wait or run, and with no batch time known yet a request that has
    waited the SLO's room is shed."""
    core = make_core(slo=SLO(latency_ms=50.0), shed_late=True, max_batch_size=8, window_ms=0.0)
    controller = core.controller
    assert controller is not None
    core.arrive(Request(0, 0.01), 0.01)
    actions = core.poll(0.01)  # the batch that will hang
    assert dispatched(actions) == [[0]] and controller.decisions == 0
    assert actions[-1] == SetTimer(at_s=controller.overdue_at()) == SetTimer(at_s=0.5)
    for k in range(1, 6):  # arrivals into a busy slot: no poll asked
        assert not core.arrive(Request(k, 0.05 * k), 0.05 * k)
    actions = core.poll(0.5)  # the watchdog: a tick, then the shedding deadline on the queue
    assert controller.decisions == 1 and core.shed_after_s == 0.05
    expired = [a.request.handle for a in actions if isinstance(a, Expire)]
    assert expired == [1, 2, 3, 4, 5]  # each has waited 0.25-0.45 s, past the 50 ms room


def test_a_controller_that_fails_to_tick_does_not_turn_the_watchdog_into_a_busy_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tick that raises leaves the last tick's time behind (the core logs and serves on);
    the watchdog's timer then comes an interval from now, not at the overdue time already
    past, which a shell would fire at once, poll after poll."""
    core = make_core(slo=SLO(latency_ms=50.0), shed_late=True, max_batch_size=8, window_ms=0.0)
    controller = core.controller
    assert controller is not None

    def broken(*args: object) -> None:
        raise RuntimeError("broken estimator")

    monkeypatch.setattr(controller.service_estimator, "update", broken)
    core.arrive(Request(0, 0.01), 0.01)
    assert core.poll(0.01)[-1] == SetTimer(at_s=0.5)  # in flight: the watchdog
    assert core.poll(0.6)[-1] == SetTimer(at_s=0.85)  # the tick failed: not 0.5, long past
    assert controller.decisions == 0


def test_only_a_shedding_batcher_without_a_deadline_in_force_has_the_watchdog() -> None:
    """A tick in the middle of a long batch sees no answers: with a deadline in force it would
    shed requests that meet the SLO (a fresh user's finding: 2 s batches under a 5 s SLO, 13
    of 159 shed), and without shedding it serves nothing. So the watchdog arms only to set a
    shedding batcher's first deadline."""
    plain = make_core(slo=SLO(latency_ms=50.0), max_batch_size=8, window_ms=0.0)
    plain.arrive(Request(0, 0.01), 0.01)
    assert plain.poll(0.01)[-1] == SetTimer(at_s=None)
    shedding = make_core(slo=SLO(latency_ms=50.0), shed_late=True, max_batch_size=8, window_ms=0.0)
    shedding.arrive(Request(0, 0.01), 0.01)
    assert shedding.poll(0.01)[-1] == SetTimer(at_s=0.5)
    assert shedding.seed_service_times([(1, 2.0), (8, 4.0)])
    shedding.arrive(Request(1, 0.02), 0.02)
    actions = shedding.poll(0.02)  # the seed's tick sets a deadline: the engine's timer now
    assert shedding.shed_after_s is not None
    assert actions[-1] != SetTimer(at_s=0.5)


def test_a_batch_run_makes_the_seed_unwanted() -> None:
    core = make_core(slo=SLO(latency_ms=50.0))
    core.record_run(0.01, 1, 1, 0.002)
    assert not core.wants_service_times


def test_bounds_come_from_the_settings() -> None:
    core = make_core(max_batch_size=16, bounds=Bounds(0.0, 20.0, 1, 8))
    assert core.bounds == Bounds(0.0, 20.0, 1, 8)
