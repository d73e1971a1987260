"""A stall of the shell's event loop, seen by the sans-IO core as a timer that fires late."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from adaptive_batcher.core.batcher_core import LOOP_STALL_S, BatcherCore
from adaptive_batcher.core.engine import Dispatch, Request, SetTimer
from adaptive_batcher.core.settings import BatcherSettings
from adaptive_batcher.slo import SLO


def _core() -> BatcherCore[int]:
    core: BatcherCore[int] = BatcherCore(
        BatcherSettings(max_batch_size=8, window_ms=5.0, slo=SLO(latency_ms=50.0))
    )
    core.start(0.0)
    return core


def test_a_timer_that_fires_late_is_a_loop_stall_the_controller_hears_of() -> None:
    core = _core()
    assert core.arrive(Request(0, 0.0), 0.0)
    assert core.poll(0.0)[-1] == SetTimer(at_s=0.005)
    with capture_logs() as logs:
        actions = core.poll(2.0)  # the loop stood still for 2 s
    assert isinstance(actions[0], Dispatch)
    assert core.loop_stalls == 1
    assert core.controller is not None and core.controller.loop_stall == (0.005, 2.0)
    stalled = [e for e in logs if e["event"] == "batcher.loop_stalled"]
    assert stalled == [
        {
            "event": "batcher.loop_stalled",
            "log_level": "warning",
            "batcher": "batcher",
            "late_ms": 1995.0,
            "queue_depth": 1,
        }
    ]


def test_a_timer_on_time_or_a_little_late_is_no_stall() -> None:
    core = _core()
    core.arrive(Request(0, 0.0), 0.0)
    core.poll(0.0)
    core.poll(0.005 + LOOP_STALL_S / 2)
    core.arrive(Request(1, 0.2), 0.2)
    core.poll(0.2)  # a new timer at 0.205: the old one is no longer due
    core.poll(0.205)
    assert core.loop_stalls == 0


def test_a_heartbeat_short_of_a_stall_is_the_loops_lag() -> None:
    """A late heartbeat below ``LOOP_STALL_S`` is lag, which the controller sets aside from the
    SLO's room; one beyond it is a stall, not lag."""
    core = _core()
    controller = core.controller
    assert controller is not None
    for beat in range(40):
        due = 0.02 * beat
        core.heartbeat_fired(due, due + 0.004)
    assert controller.loop_lag_ms(1.0) == pytest.approx(4.0)
    assert core.loop_stalls == 0
    core.heartbeat_fired(1.0, 1.0 + LOOP_STALL_S)
    assert core.loop_stalls == 1 and controller.loop_stall == (1.0, 1.0 + LOOP_STALL_S)
    assert controller.loop_lag_ms(1.1) == pytest.approx(4.0)


def test_no_timer_no_stall_after_an_idle_spell() -> None:
    core = _core()
    core.arrive(Request(0, 0.0), 0.0)
    (dispatch, timer) = core.poll(0.005)
    # no window timer, and no watchdog: this batcher does not shed
    assert isinstance(dispatch, Dispatch) and timer == SetTimer(at_s=None)
    core.complete(dispatch.batch, 0.01)
    assert core.poll(0.01) == [SetTimer(at_s=None)]  # idle: no timer at all
    core.arrive(Request(1, 60.0), 60.0)  # a minute of nothing: idle, not stalled
    core.poll(60.0)
    assert core.loop_stalls == 0


def test_the_first_poll_with_the_requests_a_stall_held_back_ticks() -> None:
    """Replayed, the batch formed when a 2 s stall ended ran at the cap of the tick before the
    stall (256), not at the overload's (512) that the next tick, 20 ms later, chose for the
    queue the stall had left. The poll that takes in the held-back requests now ticks first."""
    core = _core()
    controller = core.controller
    assert controller is not None
    core.arrive(Request(0, 0.3), 0.3)
    core.poll(0.3)  # the first tick
    core.timer_fired(0.32, 0.4)  # the heartbeat: the loop stood still from 0.32 to 0.4 s
    core.poll(0.4)
    assert controller.decisions == 1  # nothing new queued: no tick (one 0.1 s ago)
    for k in range(1, 9):
        core.arrive(Request(k, 0.4), 0.4)  # what the stall held back comes in
    core.poll(0.4)
    assert controller.decisions == 2
    core.arrive(Request(9, 0.41), 0.41)
    core.poll(0.41)
    assert controller.decisions == 2  # once per stall
