"""A continuous-batching engine with vLLM V1's scheduling semantics: the simulator's ground truth.

One :meth:`ContinuousBatchingEngine.step` is one engine iteration, as vLLM V1's scheduler
(``vllm/v1/core/sched/scheduler.py``) forms it:

1. **Running requests first**, in the order they were admitted, each taking up to the remaining
   **token budget** (``max_num_batched_tokens``, shared by decodes and chunked prefills): a
   decode takes one token, a prefill (or the recompute of a preempted request) as many of its
   remaining tokens as the budget holds, the rest in later steps.
2. **Paged KV blocks** (``block_size`` tokens each, ``kv_blocks`` in all) are allocated for the
   tokens each request computes. When a request's blocks do not fit, the **newest running
   request is preempted** (FCFS): its blocks are freed, it returns to the front of the waiting
   queue, and it later recomputes its prompt and the tokens it had generated (preemption by
   recompute); if the newest is the request itself, scheduling of running requests stops.
3. **Only if nothing was preempted** in this step are waiting requests admitted, in order,
   while the running cap (``max_num_seqs``), the token budget and the free blocks allow.

After the step, a request whose tokens are all computed samples one token; one that has
produced its output length finishes and frees its blocks. The step takes what a
:class:`~adaptive_batcher.sim.llm.step_time.StepTimeModel` says, times an optional lognormal
jitter drawn from the engine's own generator: same seed, same steps.

State is kept in numpy arrays in running order, so a step costs a few dozen vector operations
whatever the batch; only a step that preempts walks the running requests one by one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from adaptive_batcher._validate import check_int, check_number
from adaptive_batcher.llm.signals import EngineMetrics
from adaptive_batcher.sim.llm.step_time import Deployment, StepTimeModel

__all__ = ["ContinuousBatchingEngine", "EngineConfig", "StepOutcome"]

IntArray = npt.NDArray[np.int64]
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class EngineConfig:
    """The engine's startup settings (vLLM's flags of the same names).

    Attributes:
        kv_blocks: KV-cache blocks (>= 1).
        max_num_seqs: most running requests (>= 1); vLLM's default on an H200 is 1024.
        max_num_batched_tokens: the token budget of one step (>= 1); 8192 for vLLM's API
            server on an H200.
        block_size: tokens per KV block (>= 1); vLLM's default is 16.
    """

    kv_blocks: int
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("kv_blocks", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            object.__setattr__(
                self, name, check_int(f"EngineConfig.{name}", getattr(self, name), 1)
            )

    @classmethod
    def for_deployment(cls, deployment: Deployment, **settings: int) -> EngineConfig:
        """The config whose KV cache is the deployment's (``kv_capacity_tokens //
        block_size`` blocks); ``settings`` override the other fields."""
        block_size = settings.pop("block_size", 16)
        blocks = deployment.kv_capacity_tokens // block_size
        return cls(kv_blocks=blocks, block_size=block_size, **settings)


@dataclass(frozen=True)
class StepOutcome:
    """What one step produced; it ends ``duration_s`` after it started.

    Attributes:
        duration_s: the step's length, seconds (> 0).
        tokens: tokens sampled (one per request whose tokens were all computed).
        decode_tokens: those that were not a request's first token.
        first: request ids that produced their first token.
        finished: request ids that produced their last token.
        preempted: requests preempted in this step.
    """

    duration_s: float
    tokens: int
    decode_tokens: int
    first: IntArray
    finished: IntArray
    preempted: int


class ContinuousBatchingEngine:
    """vLLM V1-style continuous batching on a step-time model (see the module docstring).

    Requests are numbered ``0 .. capacity - 1`` by the caller; each has a prompt length and an
    output length (the tokens it will produce, as with ``ignore_eos``).

    Args:
        config: the engine's settings.
        step_model: seconds per step.
        capacity: how many request ids the run uses (>= 0).
        noise_sigma: lognormal jitter of each step's time (>= 0; 0: none).
        seed: seed of the jitter.
    """

    def __init__(
        self,
        config: EngineConfig,
        step_model: StepTimeModel,
        capacity: int,
        *,
        noise_sigma: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.config = config
        self._model = step_model
        self._sigma = check_number("noise_sigma", noise_sigma, 0.0)
        self._rng = np.random.default_rng(check_int("seed", seed, 0))
        capacity = check_int("capacity", capacity, 0)
        self._prompt = np.zeros(capacity, dtype=np.int64)
        self._target = np.zeros(capacity, dtype=np.int64)
        self._gen = np.zeros(capacity, dtype=np.int64)  # tokens generated (kept when preempted)
        self._aborted = np.zeros(capacity, dtype=np.bool_)
        self.preempted_count = np.zeros(capacity, dtype=np.int64)  # per request
        self._waiting: deque[int] = deque()
        self._waiting_aborted = 0
        self._aborts_running = 0
        # running requests, in running order
        self._id = _EMPTY
        self._p = _EMPTY
        self._t = _EMPTY
        self._c = _EMPTY  # tokens computed (in the KV cache)
        self._g = _EMPTY
        self._b = _EMPTY  # blocks held
        self._free = config.kv_blocks
        self._max_seqs = config.max_num_seqs
        self._budget = config.max_num_batched_tokens
        self.preemptions = 0
        self.steps = 0

    # -- state -----------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Requests scheduled in the engine."""
        return int(self._id.size)

    @property
    def waiting(self) -> int:
        """Requests in the engine's queue (aborted ones not counted)."""
        return len(self._waiting) - self._waiting_aborted

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting."""
        return self._id.size == 0 and self.waiting == 0

    def running_lengths(self) -> tuple[IntArray, IntArray]:
        """Prompt and output lengths of the running requests, in running order."""
        return self._p, self._t

    @property
    def free_blocks(self) -> int:
        """KV blocks not in use."""
        return self._free

    def metrics(self) -> EngineMetrics:
        """The engine's metrics now."""
        used = 1.0 - self._free / self.config.kv_blocks
        return EngineMetrics(self.running, self.waiting, used, self.preemptions)

    def set_caps(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """Change the running cap and the token budget from the next step (what TensorRT-LLM's
        dynamic batch tuner does between iterations; vLLM fixes both at start)."""
        self._max_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        self._budget = check_int("max_num_batched_tokens", max_num_batched_tokens, 1)

    # -- events ----------------------------------------------------------------------------

    def add(self, rid: int, prompt_tokens: int, output_tokens: int) -> None:
        """Queue request ``rid`` (prompt >= 1 token, output >= 1 token).

        Raises:
            ValueError: a length below 1, or a prompt and output that cannot fit in the
                whole KV cache.
        """
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError(
                f"request {rid}: prompt_tokens and output_tokens must be >= 1, "
                f"got {prompt_tokens} and {output_tokens}"
            )
        if prompt_tokens + output_tokens > self.config.kv_blocks * self.config.block_size:
            raise ValueError(
                f"request {rid}: {prompt_tokens + output_tokens} tokens cannot fit in the KV "
                f"cache ({self.config.kv_blocks * self.config.block_size} tokens)"
            )
        self._prompt[rid] = prompt_tokens
        self._target[rid] = output_tokens
        self._waiting.append(rid)

    def abort(self, rid: int) -> None:
        """Drop request ``rid`` (its client went away); it frees its blocks before the next
        step. Ignored for a request that already finished or was aborted."""
        if self._aborted[rid]:
            return
        self._aborted[rid] = True
        if np.any(self._id == rid):
            self._aborts_running += 1
        elif self._gen[rid] < self._target[rid]:
            self._waiting_aborted += 1

    def step(self) -> StepOutcome | None:
        """Schedule and run one step; None when there is nothing to run."""
        if self._aborts_running:
            self._drop_aborted_running()
        budget = self._budget
        n = self._id.size
        block = self.config.block_size
        preempted = 0
        take = _EMPTY
        if n:
            want = self._p + self._g - self._c
            before = np.cumsum(want) - want
            take = np.minimum(np.maximum(budget - before, 0), want)
            need = np.maximum(-((self._c + take) // -block) - self._b, 0)
            total = int(need.sum())
            if total <= self._free:
                self._b = self._b + need
                self._free -= total
                budget -= int(take.sum())
            else:
                take, budget, preempted = self._schedule_with_preemption(want, budget)
        if not preempted:
            take = self._admit(take, budget)
        if self._id.size == 0:
            return None
        return self._run(take, preempted)

    # -- internals -------------------------------------------------------------------------

    def _run(self, take: IntArray, preempted: int) -> StepOutcome:
        computed = self._c
        total = self._p + self._g
        scheduled = take > 0
        decode = scheduled & (total - computed == 1)
        prefill = scheduled & ~decode
        q = take[prefill]
        c = computed[prefill]
        duration = self._model.step_s(
            int(np.count_nonzero(decode)),
            float(computed[decode].sum()) + float(np.count_nonzero(decode)),
            float(q.sum()),
            float((q * (c + 0.5 * q)).sum()),
        )
        if self._sigma > 0:
            duration *= float(self._rng.lognormal(0.0, self._sigma))
        duration = max(duration, 1e-6)
        self._c = computed + take
        produced = scheduled & (self._c == total)
        self._g = self._g + produced
        first_mask = produced & (self._g == 1)
        done = produced & (self._g >= self._t)
        tokens = int(np.count_nonzero(produced))
        first = self._id[first_mask]
        finished = self._id[done]
        if finished.size:
            self._gen[finished] = self._g[done]
            self._free += int(self._b[done].sum())
            self._keep(~done)
        self.steps += 1
        return StepOutcome(duration, tokens, tokens - int(first.size), first, finished, preempted)

    def _schedule_with_preemption(self, want: IntArray, budget: int) -> tuple[IntArray, int, int]:
        """The running phase one request at a time, preempting the newest when blocks run out
        (the slow path: only when the step's blocks do not fit)."""
        block = self.config.block_size
        wants = want.tolist()
        computed = self._c.tolist()
        blocks = self._b.tolist()
        take = [0] * len(wants)
        free = self._free
        end = len(wants)
        victims: list[int] = []
        i = 0
        while i < end and budget > 0:
            chunk = min(wants[i], budget)
            need = max(-((computed[i] + chunk) // -block) - blocks[i], 0)
            scheduled = True
            while need > free:
                end -= 1
                free += blocks[end]
                blocks[end] = 0
                victims.append(end)
                if end == i:
                    scheduled = False
                    break
            if not scheduled:
                break
            blocks[i] += need
            free -= need
            take[i] = chunk
            budget -= chunk
            i += 1
        self._free = free
        self._b = np.asarray(blocks, dtype=np.int64)
        for position in victims:  # newest first; each goes to the front of the queue
            rid = int(self._id[position])
            self._gen[rid] = int(self._g[position])
            self.preempted_count[rid] += 1
            self._waiting.appendleft(rid)
        self.preemptions += len(victims)
        keep = np.zeros(self._id.size, dtype=np.bool_)
        keep[:end] = True
        self._keep(keep)
        return np.asarray(take[:end], dtype=np.int64), budget, len(victims)

    def _admit(self, take: IntArray, budget: int) -> IntArray:
        """Waiting requests into the running set, in order, while caps and blocks allow."""
        waiting = self._waiting
        room = self._max_seqs - self._id.size
        if not waiting or room <= 0 or budget <= 0:
            return take
        block = self.config.block_size
        ids: list[int] = []
        chunks: list[int] = []
        needs: list[int] = []
        free = self._free
        while waiting and room > 0 and budget > 0:
            rid = waiting[0]
            if self._aborted[rid]:
                waiting.popleft()
                self._waiting_aborted -= 1
                continue
            tokens = int(self._prompt[rid] + self._gen[rid])
            chunk = min(tokens, budget)
            need = -(chunk // -block)
            if need > free:
                break
            waiting.popleft()
            ids.append(rid)
            chunks.append(chunk)
            needs.append(need)
            free -= need
            budget -= chunk
            room -= 1
        if not ids:
            return take
        self._free = free
        new = np.asarray(ids, dtype=np.int64)
        self._id = np.concatenate((self._id, new))
        self._p = np.concatenate((self._p, self._prompt[new]))
        self._t = np.concatenate((self._t, self._target[new]))
        self._c = np.concatenate((self._c, np.zeros(new.size, dtype=np.int64)))
        self._g = np.concatenate((self._g, self._gen[new]))
        self._b = np.concatenate((self._b, np.asarray(needs, dtype=np.int64)))
        return np.concatenate((take, np.asarray(chunks, dtype=np.int64)))

    def _drop_aborted_running(self) -> None:
        gone = self._aborted[self._id]
        self._free += int(self._b[gone].sum())
        self._keep(~gone)
        self._aborts_running = 0

    def _keep(self, mask: npt.NDArray[np.bool_]) -> None:
        self._id = self._id[mask]
        self._p = self._p[mask]
        self._t = self._t[mask]
        self._c = self._c[mask]
        self._g = self._g[mask]
        self._b = self._b[mask]
