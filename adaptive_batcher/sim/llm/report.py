"""Tables and plots of LLM replays: the comparison table (markdown) and time-series figures.

* :func:`comparison_markdown`: one row per (scenario, contender): goodput and its ratios to the
  scenario's best static gate in hindsight and to ``vllm_defaults``, attainment, TTFT and TPOT
  p50/p99 of admitted requests, output tokens/s, preemptions, rejected share, and decode
  tokens/s over the device's limit.
* :func:`plot_timeseries`: per contender, TTFT and TPOT p99 by arrival time (10 s bins), the
  gate's in-flight limit and its queue over time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_batcher._optional import agg_figure
from adaptive_batcher.sim.llm.result import LLMSimResult

__all__ = ["LLMCell", "binned_p99_ms", "comparison_markdown", "plot_timeseries"]

BEST_STATIC = "static_gate_best"
VLLM = "vllm_defaults"


@dataclass(frozen=True)
class LLMCell:
    """One replay in a report: which scenario, which contender, the result, a note."""

    scenario: str
    contender: str
    result: LLMSimResult
    note: str = ""


def _ratio(value: float, reference: float | None) -> str:
    if reference is None or not reference > 0:
        return "-"
    return f"{value / reference:.2f}"


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def comparison_markdown(cells: Sequence[LLMCell]) -> str:
    """The table: goodput ratios to the scenario's ``static_gate_best`` and ``vllm_defaults``
    cells (``-`` where the scenario has none)."""
    best = {c.scenario: c.result.goodput_rps for c in cells if c.contender == BEST_STATIC}
    vllm = {c.scenario: c.result.goodput_rps for c in cells if c.contender == VLLM}
    lines = [
        "| scenario | contender | goodput req/s | vs static best | vs vllm | attainment "
        "| TTFT p50/p99 ms | TPOT p50/p99 ms | out tok/s | preempted (req %) | rejected % "
        "| decode/limit | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        r = cell.result
        lines.append(
            f"| {cell.scenario} | {cell.contender} | {r.goodput_rps:.2f} "
            f"| {_ratio(r.goodput_rps, best.get(cell.scenario))} "
            f"| {_ratio(r.goodput_rps, vllm.get(cell.scenario))} | {r.attainment:.3f} "
            f"| {_ms(r.ttft_ms(0.5))} / {_ms(r.ttft_ms(0.99))} "
            f"| {r.tpot_ms(0.5):.1f} / {r.tpot_ms(0.99):.1f} | {r.output_tokens_s:,.0f} "
            f"| {r.engine_preemptions:,} ({100 * r.preempted_fraction:.2f}) "
            f"| {100 * r.rejected_fraction:.2f} | {r.decode_vs_limit:.2f} | {cell.note} |"
        )
    return "\n".join(lines) + "\n"


def binned_p99_ms(
    result: LLMSimResult, values_s: np.ndarray[Any, Any], bin_s: float
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Bin starts (s) and the p99 (ms) of ``values_s`` over the completed requests that
    arrived in each bin (NaN for a bin without any)."""
    edges = np.arange(0.0, result.duration_s + bin_s, bin_s)
    starts = edges[:-1]
    out = np.full(starts.size, np.nan)
    done = result.completed_mask & np.isfinite(values_s)
    index = np.searchsorted(edges, result.arrival_s[done], side="right") - 1
    chosen = values_s[done]
    for i in range(starts.size):
        inside = chosen[index == i]
        if inside.size:
            out[i] = float(np.quantile(inside, 0.99)) * 1e3
    return starts, out


def plot_timeseries(
    results: Mapping[str, LLMSimResult],
    path: str | Path,
    *,
    ttft_ms: float,
    tpot_ms: float,
    title: str,
    bin_s: float = 10.0,
) -> Path:
    """Four stacked panels over time: TTFT p99, TPOT p99 (log scales, SLO lines), the gate's
    in-flight limit (or the engine's running count without a gate), and the gate's queue (or
    the engine's waiting count). Writes a PNG.

    Raises:
        ImportError: matplotlib is missing (``pip install "adaptive-batcher[cli]"``).
    """
    figure = agg_figure("plot_timeseries", figsize=(10, 10))
    ttft_ax, tpot_ax, limit_ax, queue_ax = figure.subplots(4, 1, sharex=True)
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    for i, (name, result) in enumerate(results.items()):
        colour = palette(i % palette.N)
        starts, ttft = binned_p99_ms(result, result.ttft_s, bin_s)
        ttft_ax.plot(starts, ttft, label=name, color=colour, linewidth=1)
        starts, tpot = binned_p99_ms(result, result.tpot_s, bin_s)
        tpot_ax.plot(starts, tpot, color=colour, linewidth=1)
        series = result.series
        if series.size:
            gated = not np.all(np.isnan(series[:, 1]))
            limit = series[:, 1] if gated else series[:, 4]
            queue = series[:, 2] if gated else series[:, 5]
            style = "-" if gated else ":"
            limit_ax.plot(series[:, 0], limit, style, color=colour, linewidth=1)
            queue_ax.plot(series[:, 0], queue, style, color=colour, linewidth=1)
    ttft_ax.axhline(ttft_ms, color="black", linestyle="--", linewidth=1, label="SLO")
    tpot_ax.axhline(tpot_ms, color="black", linestyle="--", linewidth=1)
    for ax in (ttft_ax, tpot_ax):
        ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT p99, ms")
    tpot_ax.set_ylabel("TPOT p99, ms")
    limit_ax.set_ylabel("in-flight limit\n(dotted: running)")
    queue_ax.set_ylabel("gate queue\n(dotted: engine's)")
    queue_ax.set_xlabel("time, s")
    ttft_ax.legend(fontsize=7, ncol=3)
    ttft_ax.set_title(title)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=100)
    return out
