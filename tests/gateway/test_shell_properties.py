"""Seeded random interleavings of arrivals, chunks, ends, engine failures, caller closes, time
passing and a final close.

Invariants, after every step: the shell and the core agree on every request's ending, an
ending never changes, the counts add up and match the streams, the engine never holds more
than the limit. At the end: every request has ended exactly once, its caller sees exactly
that ending (its chunks then the end, or one error of the ending's type), and the engine's
abort was called exactly for the requests the gate ended while the engine still ran them.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from adaptive_batcher.errors import BatcherClosedError, DeadlineExceededError
from adaptive_batcher.gateway import Chunk, GateStream, LLMGate
from adaptive_batcher.gateway.shell import _OUTCOME_OF_STATE
from adaptive_batcher.llm import GateQueueFullError, RequestFailedError
from tests.gateway.fakes import END, Clock, FakeEngine, make_gate, request

LIMIT = 3
ERRORS = {
    "rejected": (GateQueueFullError, BatcherClosedError),
    "expired": (DeadlineExceededError,),
    "failed": (RequestFailedError, BatcherClosedError),
}


class Run:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.fake = FakeEngine()
        self.gate: LLMGate = make_gate(self.fake, LIMIT, clock=self.clock, max_queue=4)
        self.streams: list[GateStream] = []
        self.seen: dict[int, str] = {}  # the first ending seen of each stream
        self.engine_failed: set[int] = set()

    def live_in_engine(self) -> list[int]:
        return [
            i
            for i, s in enumerate(self.streams)
            if s.outcome is None and self.fake.is_started(i) and i not in self.engine_failed
        ]

    async def step(self) -> None:
        rng, fake = self.rng, self.fake
        op = rng.choice(["submit"] * 3 + ["chunk"] * 4 + ["end", "fail", "close", "time"])
        running = self.live_in_engine()
        if op == "submit":
            timeout = rng.choice([None, None, rng.uniform(0.5, 5.0)])
            self.streams.append(self.gate.submit(request(len(self.streams), timeout_s=timeout)))
        elif op == "chunk" and running:
            tokens = rng.choice([0, 1, 1, 1, 4])
            fake.feed(rng.choice(running), Chunk("t", tokens=tokens))
        elif op == "end" and running:
            fake.feed(rng.choice(running), END)
        elif op == "fail" and running:
            key = rng.choice(running)
            self.engine_failed.add(key)
            fake.feed(key, RuntimeError("engine fault"))
        elif op == "close" and self.streams:
            await rng.choice(self.streams).aclose()
        elif op == "time":
            self.clock.advance(rng.uniform(0.0, 2.0))
            self.gate.poll()
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)  # let the engine streams move, or not yet

    def check(self) -> None:
        counts = self.gate.stats().counts
        assert counts.submitted == len(self.streams)
        assert counts.submitted == counts.waiting + counts.running + counts.ended
        by_outcome: dict[str | None, int] = {}
        for i, stream in enumerate(self.streams):
            handle = stream._handle
            assert handle is not None
            assert _OUTCOME_OF_STATE.get(handle.state) == stream.outcome
            if stream.outcome is not None:
                assert self.seen.setdefault(i, stream.outcome) == stream.outcome
            by_outcome[stream.outcome] = by_outcome.get(stream.outcome, 0) + 1
        assert by_outcome.get(None, 0) == counts.waiting + counts.running
        for outcome in ("completed", "rejected", "expired", "failed", "cancelled"):
            assert by_outcome.get(outcome, 0) == getattr(counts, outcome)
        assert self.fake.peak <= LIMIT


async def drain_reads(stream: GateStream) -> tuple[int, list[BaseException]]:
    chunks, errors = 0, []
    while True:
        try:
            await stream.__anext__()
            chunks += 1
        except StopAsyncIteration:
            return chunks, errors
        except Exception as exc:
            errors.append(exc)


@pytest.mark.parametrize("seed", range(12))
async def test_every_request_ends_exactly_once(seed: int) -> None:
    run = Run(seed)
    for _ in range(150):
        await run.step()
        run.check()
    await asyncio.wait_for(run.gate.aclose(drain=False), 10.0)
    run.check()
    counts = run.gate.stats().counts
    assert counts.waiting == counts.running == 0
    assert counts.ended == counts.submitted == len(run.streams)
    fake = run.fake
    assert fake.inside == 0
    for i, stream in enumerate(run.streams):
        outcome = stream.outcome
        assert outcome is not None
        closed_by_caller = stream._closed
        _, errors = await drain_reads(stream)
        if outcome in ("completed", "cancelled") or closed_by_caller:
            assert errors == []
        else:
            assert len(errors) == 1 and isinstance(errors[0], ERRORS[outcome]), (outcome, errors)
        aborts = fake.aborted.count(i)
        ended_by_gate = outcome in ("cancelled", "expired") or (
            outcome == "failed" and isinstance(stream._error, BatcherClosedError)
        )
        expected = 1 if ended_by_gate and fake.is_started(i) else 0
        assert aborts == expected, (i, outcome, aborts)


def test_the_outcome_table_covers_every_ending() -> None:
    from adaptive_batcher.gateway.stream import OUTCOMES
    from adaptive_batcher.llm.gate import RequestState

    assert sorted(_OUTCOME_OF_STATE) == sorted(RequestState.ENDED)
    assert sorted(_OUTCOME_OF_STATE.values()) == sorted(OUTCOMES)
