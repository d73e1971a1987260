"""Profiles as markdown: the sweep's table, and a report with the recommendation's reasons.

The JSON file format (schema, reader, writer) is :mod:`adaptive_batcher.profile.format`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from adaptive_batcher.profile.knee import Knee
from adaptive_batcher.profile.recommend import Recommendation
from adaptive_batcher.profile.result import ProfileResult

__all__ = ["markdown_report", "markdown_table"]

_MIB: Final = 1024 * 1024


def markdown_table(
    result: ProfileResult,
    *,
    knee: Knee | None = None,
    recommendation: Recommendation | None = None,
) -> str:
    """A markdown table of the sweep: one line per batch size, the knee and the cap marked.

    Columns: batch, median ms, p99 ms, items/s, peak memory MiB, CV % and robust CV % of the
    timed calls, the number of timed calls, note ("n/a" where a value was not recorded). A line
    after the table records the out-of-memory batch size, if any.
    """
    header = (
        "| batch | median ms | p99 ms | items/s | peak mem MiB | CV % | robust CV % | calls "
        "| note |"
    )
    lines = [header, "|---:|---:|---:|---:|---:|---:|---:|---:|:---|"]
    for row in result.rows:
        notes = []
        if knee is not None and row.batch_size == knee.batch_size:
            notes.append("knee")
        if recommendation is not None and row.batch_size == recommendation.max_batch_size:
            notes.append("recommended cap")
        mem = "n/a" if row.peak_mem_bytes is None else f"{row.peak_mem_bytes / _MIB:,.1f}"
        lines.append(
            f"| {row.batch_size} | {row.median_ms:.3f} | {row.p99_ms:.3f} | "
            f"{row.items_per_s:,.0f} | {mem} | {_percent(row.cv)} | {_percent(row.robust_cv)} | "
            f"{'n/a' if row.repeats is None else row.repeats} | {', '.join(notes)} |"
        )
    if result.oom_batch_size is not None:
        lines.append("")
        lines.append(f"Batch {result.oom_batch_size}: out of memory (the sweep stopped there).")
    return "\n".join(lines) + "\n"


def _percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.1f}"


def _timing_sentence(result: ProfileResult) -> str:
    if result.max_repeats is None or result.cv_threshold is None:
        return (
            f"Latency of one batch call: median and p99 of {result.repeats} timed calls per "
            "batch size."
        )
    return (
        "Latency of one batch call: median and p99 of the timed calls per batch size (column "
        f"calls), timed in rounds of {result.repeats} until the robust CV (1.4826 x MAD / "
        f"median) was at most {100 * result.cv_threshold:g} %, or {result.max_repeats} calls."
    )


def _threads_sentence(result: ProfileResult) -> str | None:
    cores = (
        ""
        if result.available_cores is None
        else f"; {result.available_cores} CPU cores available to the process"
    )
    if result.torch_threads is not None:
        interop = (
            ""
            if result.torch_interop_threads is None
            else f", inter-op {result.torch_interop_threads}"
        )
        return f"Threads: torch intra-op {result.torch_threads}{interop}{cores}."
    if cores:
        return f"Threads: torch not in use{cores}."
    return None


def _warnings_section(warnings: Sequence[str]) -> list[str]:
    if not warnings:
        return []
    return ["## Warnings", "", *(f"- {warning}" for warning in warnings), ""]


def _recommendation_section(recommendation: Recommendation) -> list[str]:
    if recommendation.slo_latency_ms is None:
        slo = "none given"
    else:
        verdict = "can be met" if recommendation.meets_slo else "**cannot be met**"
        slo = f"p99 <= {recommendation.slo_latency_ms:g} ms, {verdict}"
    noise = recommendation.noise_message
    return [
        "## Recommendation",
        "",
        *([f"**{noise}**", ""] if noise is not None else []),
        f"- batch cap (max_batch_size): **{recommendation.max_batch_size}**",
        f"- batching window (window_ms): **{recommendation.window_ms:.2f} ms**",
        f"- SLO: {slo}",
        "",
        "Why:",
        "",
        *(f"{i}. {reason}" for i, reason in enumerate(recommendation.reasons, start=1)),
        "",
    ]


def markdown_report(
    result: ProfileResult,
    *,
    knee: Knee | None = None,
    recommendation: Recommendation | None = None,
    more_warnings: Sequence[str] = (),
) -> str:
    """A markdown report: title, how the calls were timed and with how many threads,
    :func:`markdown_table`, the sweep's warnings and then ``more_warnings`` (e.g. the command
    line's about the online controller; section "Warnings", when there are any), then the
    recommendation and its reasons, headed by a bold NOT RELIABLE line when it comes from a
    noisy sweep."""
    threads = _threads_sentence(result)
    lines = [
        f"# Profile of `{result.model_name}`",
        "",
        f"Device: {result.device}. {_timing_sentence(result)}",
        "",
        *([threads, ""] if threads is not None else []),
        markdown_table(result, knee=knee, recommendation=recommendation),
        *_warnings_section([*result.warnings, *more_warnings]),
    ]
    if recommendation is not None:
        lines += _recommendation_section(recommendation)
    return "\n".join(lines)
