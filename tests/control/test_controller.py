"""The sans-IO controller: ticks, observations from counters, fallback, logging, switching."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from adaptive_batcher.control.controller import AFTER_STALL_S, Controller
from adaptive_batcher.control.guards.unused_window import UnusedWindowGuard
from adaptive_batcher.control.types import Bounds, Decision, Observation
from adaptive_batcher.metrics.recorder import Recorder
from adaptive_batcher.policies import PID, Static
from adaptive_batcher.slo import SLO
from adaptive_batcher.telemetry.base import TelemetrySample

UNKNOWN = TelemetrySample()


class Spy:
    """Records observations; proposes a fixed decision or raises."""

    name = "spy"

    def __init__(self, decision: Decision | None = None, fail: bool = False) -> None:
        self.decision = decision
        self.fail = fail
        self.seen: list[Observation] = []
        self.resets: list[Decision] = []

    def reset(self, current: Decision) -> None:
        self.resets.append(current)

    def decide(self, observation: Observation) -> Decision:
        self.seen.append(observation)
        if self.fail:
            raise RuntimeError("policy bug")
        return self.decision or observation.current


def started(policy: Spy, **kwargs: object) -> tuple[Controller, Recorder]:
    recorder = Recorder()
    controller = Controller(policy, Bounds(0.0, 50.0, 1, 128), guards=[], **kwargs)  # type: ignore[arg-type]
    controller.start(Decision(5.0, 32), 0.0, recorder.counts())
    return controller, recorder


def test_observation_rates_come_from_counter_deltas() -> None:
    spy = Spy()
    controller, recorder = started(spy, slo=SLO(latency_ms=100))
    recorder.slo_latency_s = 0.1
    recorder.submitted += 500
    recorder.record_latencies([0.01] * 400 + [0.2] * 50, 0, now=0.4)
    recorder.record_batch(0.4, 10, 10, 0.004)
    recorder.record_batch(0.45, 30, 30, 0.006)
    controller.tick(0.5, recorder, queue_depth=7, queued_units=7, telemetry=UNKNOWN)
    obs = spy.seen[-1]
    assert obs.interval_s == pytest.approx(0.5)
    assert obs.arrival_rate_rps == pytest.approx(1000.0)
    assert obs.throughput_rps == pytest.approx(900.0)
    assert obs.goodput_rps == pytest.approx(800.0)
    assert obs.batches == 2
    assert obs.mean_batch_size == pytest.approx(20.0)
    assert obs.fill_ratio == pytest.approx(20 / 32)
    assert obs.queue_depth == 7
    assert obs.latency_samples == 450
    assert obs.latency_ms == pytest.approx(200, rel=0.01)  # p99 of 450 with 50 at 200 ms
    assert obs.largest_batch_size == 30
    recorder.record_batch(0.6, 12, 12, 0.004)  # the next tick sees only its own batches
    controller.tick(1.0, recorder, queue_depth=0, queued_units=0, telemetry=UNKNOWN)
    assert spy.seen[-1].largest_batch_size == 12


def test_decision_is_returned_only_when_it_changes_and_is_clamped() -> None:
    spy = Spy(Decision(500.0, 1000, "big"))
    controller, recorder = started(spy)
    decision = controller.tick(1.0, recorder, 0, 0, UNKNOWN)
    assert decision == Decision(50.0, 128, "big")  # clamped into the bounds
    assert controller.tick(2.0, recorder, 0, 0, UNKNOWN) is None  # same again: no change


def test_failing_policy_keeps_the_last_safe_decision_and_logs() -> None:
    spy = Spy(fail=True)
    controller, recorder = started(spy)
    with capture_logs() as logs:
        assert controller.tick(1.0, recorder, 0, 0, UNKNOWN) is None
        assert controller.tick(2.0, recorder, 0, 0, UNKNOWN) is None
    assert controller.decision == Decision(5.0, 32)
    assert controller.failures == 2
    failed = [e for e in logs if e["event"] == "controller.policy_failed"]
    assert len(failed) == 2
    assert failed[0]["error"] == "RuntimeError('policy bug')"


def test_every_decision_is_logged_with_its_inputs() -> None:
    controller, recorder = started(Spy(Decision(3.0, 16, "why")))
    with capture_logs() as logs:
        controller.tick(1.0, recorder, 4, 4, UNKNOWN)
    event = next(e for e in logs if e["event"] == "controller.decision")
    for key in (
        "window_ms",
        "max_batch_size",
        "reason",
        "latency_ms",
        "queue_depth",
        "arrival_rate_rps",
        "previous_window_ms",
        "service_ms_at_cap",
    ):
        assert key in event
    assert event["reason"] == "why"
    assert event["queue_depth"] == 4


def test_tick_interval() -> None:
    controller, _ = started(Spy(), interval_s=0.25)
    assert not controller.due(0.1)
    assert controller.due(0.25)


def test_a_tick_comes_once_a_loop_stall_has_passed() -> None:
    """The tick due when a 2 s stall ends sees none of the requests it held back; one more
    comes ``AFTER_STALL_S`` later, when the shell has taken them in, and only one."""
    controller, recorder = started(Spy(), interval_s=0.25)
    controller.note_loop_stall(1.0, 3.0)
    assert controller.due(3.0)
    controller.tick(3.0, recorder, 0, 0, UNKNOWN)
    assert not controller.due(3.0 + AFTER_STALL_S / 2)
    assert controller.due(3.0 + AFTER_STALL_S)
    controller.tick(3.0 + AFTER_STALL_S, recorder, 18000, 18000, UNKNOWN)
    assert not controller.due(3.1)


def test_switching_policy_is_bumpless() -> None:
    controller, recorder = started(Spy(Decision(8.0, 64, "first")))
    controller.tick(1.0, recorder, 0, 0, UNKNOWN)
    second = Spy()
    controller.set_policy(second)
    assert second.resets == [Decision(8.0, 64, "first")]
    controller.tick(2.0, recorder, 0, 0, UNKNOWN)
    assert second.seen[-1].current.window_ms == 8.0


def test_a_new_policy_takes_over_the_window_the_old_one_chose_not_a_guards_zero() -> None:
    """A fresh user's trial: ``set_policy(Static())`` while the unused-window guard held the
    window at 0 (a probe) kept 0 for good, since ``Static()`` keeps the settings in force."""
    recorder = Recorder()
    controller = Controller(
        Spy(Decision(8.0, 64, "first")), Bounds(0.0, 50.0, 1, 128), guards=[UnusedWindowGuard]
    )
    controller.start(Decision(5.0, 32), 0.0, recorder.counts())
    guard = controller.chain
    assert isinstance(guard, UnusedWindowGuard)
    guard.closed, guard._shut_at_s, guard._shut_for_s = True, 0.0, 60.0  # shut, as by a probe
    controller.tick(1.0, recorder, 0, 0, UNKNOWN)
    assert controller.decision is not None and controller.decision.window_ms == 0.0
    second = Spy()
    controller.set_policy(second)
    assert second.resets[-1].window_ms == 8.0


def test_slo_change_reaches_the_next_observation() -> None:
    spy = Spy()
    controller, recorder = started(spy, slo=SLO(latency_ms=100))
    controller.set_slo(SLO(latency_ms=20))
    controller.tick(1.0, recorder, 0, 0, UNKNOWN)
    assert spy.seen[-1].target_ms == pytest.approx(16.0)


def test_tick_before_start_is_an_error() -> None:
    controller = Controller(Static(), Bounds())
    with pytest.raises(RuntimeError, match=r"start\(\) must be called"):
        controller.tick(0.0, Recorder(), 0, 0, UNKNOWN)


def test_default_guard_chain_wraps_the_policy() -> None:
    controller = Controller(PID(), Bounds(), slo=SLO(latency_ms=50))
    assert controller.chain.name == (
        "CapProbeGuard(MemoryGuard(StallGuard(StepGuard(PowerGuard(BudgetGuard("
        "UnusedWindowGuard(pid)))))))"
    )
    assert controller.slo_unreachable is False


def test_batch_count_ticks() -> None:
    recorder = Recorder()
    controller = Controller(Spy(), Bounds(), guards=[], interval_s=10.0, interval_batches=3)
    controller.start(Decision(1.0, 8), 0.0, recorder.counts())
    for _ in range(2):
        recorder.record_batch(0.1, 4, 4, 0.001)
    assert not controller.due(0.1, recorder.batch_count)
    recorder.record_batch(0.1, 4, 4, 0.001)
    assert controller.due(0.1, recorder.batch_count)
    with pytest.raises(ValueError, match="interval_batches must be >= 1 or None, got 0"):
        Controller(Spy(), Bounds(), interval_batches=0)


def test_co_tenants_are_what_the_gpu_did_beyond_the_batcher() -> None:
    from adaptive_batcher.control.types import Observation
    from adaptive_batcher.telemetry.base import TelemetrySample

    def seen(util: float | None, busy: float) -> Observation:
        return Observation(
            now_s=1.0,
            interval_s=0.25,
            current=Decision(0.0, 8),
            bounds=Bounds(),
            device_busy_fraction=busy,
            telemetry=TelemetrySample(gpu_util_pct=util),
        )

    assert seen(90.0, 0.3).co_tenant_fraction == pytest.approx(0.6)
    assert seen(20.0, 0.3).co_tenant_fraction == 0.0  # NVML samples lag: never below 0
    assert seen(None, 0.3).co_tenant_fraction is None


def test_the_stall_rate_needs_stalls_that_recur_and_fades() -> None:
    controller, _ = started(Spy())
    controller.note_loop_stall(1.0, 1.1)
    assert controller.loop_stall_rate_hz(2.0) == 0.0  # one stall is an outlier, not a rate
    controller.note_loop_stall(2.0, 2.1)
    controller.note_loop_stall(3.0, 3.1)
    assert controller.loop_stall_rate_hz(3.0) == pytest.approx(1.0)  # 2 gaps in 2 s
    assert controller.loop_stall_rate_hz(3.95) == pytest.approx(1.0)  # the next is not due yet
    assert controller.loop_stall_rate_hz(11.0) == pytest.approx(2 / 9)  # 7 s overdue: fades
    assert controller.loop_stall_durations_s(11.0) == pytest.approx((0.1, 0.1, 0.1))
    assert controller.loop_stall_rate_hz(32.5) == 0.0  # the first two left the memory
    assert controller.loop_stall_durations_s(32.5) == ()


def test_the_policy_sees_the_measured_slack_and_a_new_slo_starts_without_it() -> None:
    spy = Spy()
    controller, recorder = started(spy, slo=SLO(latency_ms=100))  # target 80 ms
    now = 0.0
    for _ in range(4):  # p99 40 ms on 1000 samples a tick: half the target to spare
        now += 0.5
        recorder.record_latencies([0.04] * 1000, 0, now=now)
        controller.tick(now, recorder, 0, 0, UNKNOWN)
    scales = [obs.window_budget_scale for obs in spy.seen]
    assert scales[0] > 1.0 and scales == sorted(scales)
    assert controller.tail_slack.scale == scales[-1]
    controller.set_slo(SLO(latency_ms=60))
    assert controller.tail_slack.scale == 1.0
    with capture_logs() as logs:
        for _ in range(5):
            now += 0.5
            recorder.record_latencies([0.04] * 1000, 0, now=now)
            controller.tick(now, recorder, 0, 0, UNKNOWN)
    events = [e for e in logs if e["event"] == "controller.decision"]
    # 40 ms against the new 48 ms target: room, but only once the span is the new SLO's
    assert [e["window_budget_scale"] for e in events[:4]] == [1.0] * 4
    assert events[4]["window_budget_scale"] > 1.0


@pytest.mark.parametrize("wrong", [1.0, 0, False, "1.25"])
def test_tail_slack_must_be_a_tail_slack(wrong: object) -> None:
    """A scale given for the object (1.0 meaning max_scale=1) is refused at construction,
    not at the first tick; False or 0 do not quietly give the default."""
    with pytest.raises(TypeError, match="tail_slack must be a TailSlack or None"):
        Controller(Spy(), Bounds(0.0, 50.0, 1, 128), tail_slack=wrong)  # type: ignore[arg-type]


def test_a_streams_answer_share_is_a_high_quantile_of_its_recent_batches() -> None:
    """Each streaming batch records when its first element came; the observation carries the
    90th percentile of those shares of its time (1 without streams: answers at the end)."""
    spy = Spy()
    controller, recorder = started(spy, slo=SLO(latency_ms=100))
    recorder.record_batch(0.1, 4, 4, 0.040)  # not a stream
    controller.tick(0.25, recorder, queue_depth=0, queued_units=0, telemetry=UNKNOWN)
    assert spy.seen[-1].answer_share == 1.0
    for k in range(20):  # first elements after 1-20 % of each stream's time
        recorder.record_batch(0.3 + 0.01 * k, 4, 4, 0.040, answer_s=0.0004 * (k + 1))
    controller.tick(0.5, recorder, queue_depth=0, queued_units=0, telemetry=UNKNOWN)
    assert spy.seen[-1].answer_share == pytest.approx(0.19)  # the 18th of 20, sorted
