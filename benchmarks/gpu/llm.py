"""The decoder phase: prefill and decode-step times of a Llama-shaped decoder over a batch x
context grid, random weights, eager mode: a table to calibrate the LLM simulator on.

Per cell: one warm-up prefill, then the median of ``llm_prefill_reps`` prefills of ``ctx``
tokens per sequence; after the last, one warm-up decode step, then the median of
``llm_decode_steps`` decode steps (one token per sequence, the KV cache growing by one each);
every call synchronised. ``peak_mib`` is the peak memory allocated in the cell (weights
included). Cells past the phase's budget are listed as skipped.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.context import Context
from benchmarks.gpu.models import Decoder, DecoderShape, build_decoder, tokens
from benchmarks.gpu.results import PhaseOutcome, Table

__all__ = ["run_llm"]


def _median_ms(call: Callable[[], Any], reps: int, sync: Callable[[], None]) -> tuple[float, Any]:
    """Median wall time of ``reps`` synchronised calls, ms, and the last call's result."""
    spent, result = [], None
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        result = call()
        sync()
        spent.append((time.perf_counter() - start) * 1e3)
    return statistics.median(spent), result


def time_cell(ctx: Context, decoder: Decoder, batch: int, length: int) -> dict[str, Any]:
    """One grid cell's ``llm_steps`` row."""
    config, platform = ctx.config, ctx.platform
    device, sync = platform.device, platform.synchronize
    prompt = tokens(batch, length, decoder.vocab, device)
    step = tokens(batch, 1, decoder.vocab, device)
    platform.reset_peak_memory()
    decoder.prefill(prompt)  # the warm-up; its cache is dropped
    prefill_ms, cache = _median_ms(lambda: decoder.prefill(prompt), config.llm_prefill_reps, sync)
    cache = decoder.decode(step, cache)
    sync()
    state = {"cache": cache}

    def one_step() -> Any:
        state["cache"] = decoder.decode(step, state["cache"])
        return None

    decode_ms, _ = _median_ms(one_step, config.llm_decode_steps, sync)
    return {
        "impl": decoder.impl,
        "batch": batch,
        "ctx": length,
        "prefill_ms": prefill_ms,
        "prefill_tokens_per_s": batch * length / prefill_ms * 1e3,
        "decode_ms": decode_ms,
        "decode_tokens_per_s": batch / decode_ms * 1e3,
        "peak_mib": platform.peak_memory_mib(),
        "status": "ok",
    }


def run_llm(ctx: Context) -> PhaseOutcome:
    outcome = PhaseOutcome("llm")
    table = Table("llm_steps")
    outcome.tables.append(table)
    config, platform = ctx.config, ctx.platform
    end = time.monotonic() + min(config.llm_budget_s, ctx.remaining_s() - ctx.reserve_s)
    shape = DecoderShape(
        hidden=config.llm_hidden,
        layers=config.llm_layers,
        heads=config.llm_heads,
        kv_heads=config.llm_kv_heads,
        intermediate=config.llm_intermediate,
        vocab=config.llm_vocab,
        max_positions=max(config.llm_contexts) + config.llm_decode_steps + 8,
    )
    decoder, note = build_decoder(shape, platform.device, platform.dtype, prefer_transformers=True)
    if note:
        outcome.notes.append(note)
    failed = skipped = 0
    for batch in config.llm_batches:
        for length in config.llm_contexts:
            if time.monotonic() > end:
                skipped += 1
                table.add(impl=decoder.impl, batch=batch, ctx=length, status="skipped: time budget")
                continue
            try:
                table.add(**time_cell(ctx, decoder, batch, length))
            except Exception as exc:
                failed += 1
                outcome.traceback += f"batch {batch} ctx {length}:\n{traceback.format_exc()}"
                status = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                table.add(impl=decoder.impl, batch=batch, ctx=length, status=status)
                if isinstance(exc, torch.OutOfMemoryError) and torch.cuda.is_available():
                    torch.cuda.empty_cache()
    cells = len(config.llm_batches) * len(config.llm_contexts)
    outcome.detail = f"{decoder.impl}: {cells - failed - skipped} of {cells} cells"
    if failed:
        outcome.status = "failed"
    elif skipped:
        outcome.status = "partial"
    return outcome
