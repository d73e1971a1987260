"""The continuous-batching engine: vLLM V1's scheduling, step by step."""

from __future__ import annotations

import pytest

from adaptive_batcher.sim.llm.engine import ContinuousBatchingEngine, EngineConfig, StepOutcome
from adaptive_batcher.sim.llm.step_time import h200_llama_8b


class Recorder:
    """One millisecond a step; keeps each step's four sums."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, float, float]] = []

    def step_s(self, decodes: int, context: float, prefill: float, attention: float) -> float:
        self.steps.append((decodes, context, prefill, attention))
        return 0.001


def engine(
    blocks: int = 1000, seqs: int = 8, budget: int = 64, block: int = 4, capacity: int = 10
) -> tuple[ContinuousBatchingEngine, Recorder]:
    model = Recorder()
    config = EngineConfig(
        kv_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=budget, block_size=block
    )
    return ContinuousBatchingEngine(config, model, capacity), model


def step(e: ContinuousBatchingEngine) -> StepOutcome:
    outcome = e.step()
    assert outcome is not None
    return outcome


def test_chunked_prefill_shares_the_budget_with_running_requests_first() -> None:
    e, model = engine(budget=64)
    e.add(0, 100, 3)
    e.add(1, 20, 2)
    first = step(e)  # request 0 takes the whole budget; request 1 waits
    assert (e.running, e.waiting, first.tokens) == (1, 1, 0)
    assert model.steps[-1] == (0, 0.0, 64.0, 64 * 32.0)
    second = step(e)  # 0 finishes its prefill (36), then 1 is admitted into the rest (28)
    assert sorted(second.first.tolist()) == [0, 1] and e.running == 2
    assert model.steps[-1][2] == 36 + 20
    third = step(e)  # two decodes; 1 ends (two tokens)
    assert third.finished.tolist() == [1] and third.decode_tokens == 2
    assert model.steps[-1][:2] == (2, float(101 + 21))  # each attends its prompt and token


def test_the_running_cap_bounds_admission() -> None:
    e, _ = engine(seqs=2, budget=1000)
    for rid in range(4):
        e.add(rid, 5, 10)
    step(e)
    assert (e.running, e.waiting) == (2, 2)


def test_kv_blocks_bound_admission_and_preempt_the_newest_running_request() -> None:
    e, _ = engine(blocks=6, budget=64, block=4)
    for rid in range(3):
        e.add(rid, 4, 8)
    step(e)  # three prompts of one block each
    assert (e.running, e.free_blocks) == (3, 3)
    preempted_at = None
    for index in range(10):
        outcome = step(e)
        if outcome.preempted:
            preempted_at = index
            break
    assert preempted_at is not None
    # the newest (request 2) went back to the front of the queue, its blocks freed
    assert e.running == 2 and e.waiting == 1 and e.preempted_count.tolist()[:3] == [0, 0, 1]
    metrics = e.metrics()
    assert metrics.preemptions == 1 and metrics.waiting == 1 and 0 < metrics.kv_usage <= 1


def test_no_admission_in_a_step_that_preempted() -> None:
    e, _ = engine(blocks=3, budget=64, block=4, seqs=8)
    e.add(0, 4, 6)
    e.add(1, 4, 6)
    step(e)
    e.add(2, 1, 1)  # a one-token request
    outcome = step(e)  # request 0 takes the last free block, request 1 must go
    assert outcome.preempted == 1
    # the freed block could take request 2, but a step that preempted admits nothing
    assert e.running == 1 and e.waiting == 2 and e.free_blocks == 1
    step(e)  # the victim heads the queue (FCFS) and needs two blocks: still nothing admitted
    assert e.running == 1 and e.waiting == 2
    finished: list[int] = []
    while (outcome := e.step()) is not None:
        finished += outcome.finished.tolist()
    assert sorted(finished) == [0, 1, 2]


def test_a_preempted_request_recomputes_its_prompt_and_output_then_goes_on() -> None:
    e, model = engine(blocks=6, budget=64, block=4)
    for rid in range(3):
        e.add(rid, 4, 8)
    finished: list[int] = []
    tokens = 0
    for _ in range(40):
        outcome = e.step()
        if outcome is None:
            break
        finished += outcome.finished.tolist()
        tokens += outcome.tokens
    assert sorted(finished) == [0, 1, 2] and tokens == 24  # every token once, none lost
    recompute = [s for s in model.steps if s[2] > 4]  # a prefill longer than any prompt
    assert recompute and e.idle


def test_abort_frees_a_running_request_and_skips_a_waiting_one() -> None:
    e, _ = engine(seqs=1, budget=100)
    e.add(0, 10, 50)
    e.add(1, 10, 50)
    step(e)
    free = e.free_blocks
    e.abort(0)
    e.abort(1)
    assert e.waiting == 0
    assert e.step() is None and e.free_blocks > free and e.idle
    e.abort(1)  # twice: nothing more


def test_the_same_seed_gives_the_same_steps() -> None:
    def run(seed: int) -> list[float]:
        config = EngineConfig.for_deployment(h200_llama_8b(), max_num_seqs=64)
        e = ContinuousBatchingEngine(config, h200_llama_8b().step, 20, noise_sigma=0.1, seed=seed)
        for rid in range(20):
            e.add(rid, 100 + rid, 5)
        durations = []
        while (outcome := e.step()) is not None:
            durations.append(outcome.duration_s)
        return durations

    assert run(1) == run(1) != run(2)


def test_bad_requests_and_settings_are_refused() -> None:
    e, _ = engine(blocks=2, block=4)
    with pytest.raises(
        ValueError, match=r"^request 0: prompt_tokens and output_tokens must be >= 1, got 0 and 5$"
    ):
        e.add(0, 0, 5)
    with pytest.raises(
        ValueError, match=r"^request 1: 9 tokens cannot fit in the KV cache \(8 tokens\)$"
    ):
        e.add(1, 5, 4)
    with pytest.raises(ValueError, match=r"^EngineConfig.kv_blocks must be >= 1, got 0$"):
        EngineConfig(kv_blocks=0)
    e.set_caps(4, 32)
    with pytest.raises(ValueError, match=r"^max_num_seqs must be >= 1, got 0$"):
        e.set_caps(0, 32)
