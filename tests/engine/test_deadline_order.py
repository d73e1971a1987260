"""Deadlines in any order: every poll expires exactly the queued requests whose deadline has
passed, earliest first (ties in arrival order), and the timer is the earliest deadline left.

The engine keeps deadlines that come in order in a FIFO and the others in a heap; this checks
both against a plain reference (sorting the requests still queued).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_batcher.core.engine import BatchingEngine, EngineLimits, Expire, Request, SetTimer

steps = st.lists(
    st.one_of(
        # an arrival with a deadline this long after the start (any order), or none
        st.tuples(st.just("arrive"), st.one_of(st.none(), st.integers(1, 40))),
        st.tuples(st.just("poll"), st.integers(0, 4)),  # let this much time pass, then poll
        st.tuples(st.just("cancel"), st.integers(0, 1000)),
        # every queued request's deadline brought forward to its arrival + this, where earlier
        st.tuples(st.just("expire_after"), st.integers(0, 40)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(steps=steps, bulk=st.booleans())
def test_polls_expire_the_due_requests_in_deadline_order(
    steps: list[tuple[str, int | None]], bulk: bool
) -> None:
    """``bulk``: arrivals go through ``arrive_many`` (runs of one), else ``arrive``."""
    # one slot kept busy and a cap of 1000: nothing is dispatched, requests only expire
    engine: BatchingEngine[int] = BatchingEngine(EngineLimits(0.0, 1000))
    engine.arrive(Request(-1, 0.0), 0.0)
    engine.poll(0.0)
    now = 0.0
    requests: list[Request[int]] = []
    live: list[Request[int]] = []
    for kind, value in steps:
        if kind == "arrive":
            deadline = None if value is None else float(value)
            request = Request(len(requests), now, 1, deadline)
            requests.append(request)
            live.append(request)
            if bulk:
                assert engine.arrive_many([request])[0] == 1
            else:
                engine.arrive(request, now)
        elif kind == "cancel" and live:
            request = live.pop((value or 0) % len(live))
            assert engine.cancel(request)
        elif kind == "expire_after":
            after = float(value or 0)
            expected = {r.handle: r.deadline_s for r in live}
            engine.expire_after(after)
            for request in live:
                old = expected[request.handle]
                want = request.arrival_s + after
                assert request.deadline_s == (want if old is None else min(old, want))
        elif kind == "poll":
            now += float(value or 0)
            actions = engine.poll(now)
            expired = [a.request for a in actions if isinstance(a, Expire)]
            due = sorted(
                (r for r in live if r.deadline_s is not None and r.deadline_s <= now),
                key=lambda r: (r.deadline_s, r.handle),
            )
            assert [r.handle for r in expired] == [r.handle for r in due]
            live = [r for r in live if r not in due]
            left = [r.deadline_s for r in live if r.deadline_s is not None]
            timer = actions[-1]
            assert isinstance(timer, SetTimer)
            assert timer.at_s == (min(left) if left else None)
    assert engine.queue_depth == len(live)
