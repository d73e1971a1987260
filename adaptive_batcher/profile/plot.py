"""The latency/throughput plot of a sweep, as a PNG (matplotlib's Agg canvas: no screen needed).

The figure is built on ``matplotlib.figure.Figure`` with an explicit ``FigureCanvasAgg`` rather
than through ``pyplot``, so it touches no global backend or figure state and is safe in servers,
threads and tests. matplotlib comes with the ``cli`` extra and is imported when a plot is made.
"""

from __future__ import annotations

import os
from pathlib import Path

from adaptive_batcher._optional import agg_figure
from adaptive_batcher.profile.knee import Knee
from adaptive_batcher.profile.recommend import Recommendation
from adaptive_batcher.profile.result import ProfileResult
from adaptive_batcher.slo import SLO

__all__ = ["plot_profile"]


def plot_profile(
    result: ProfileResult,
    path: str | os.PathLike[str],
    *,
    knee: Knee | None = None,
    recommendation: Recommendation | None = None,
    slo: SLO | None = None,
) -> Path:
    """Plot batch latency (ms, y) against throughput (items/s, x) and save it as a PNG.

    One point per batch size at its median latency, labelled with the batch size, with a bar up to
    its p99. The knee is marked with a star, the recommended cap with a ring (its label gives the
    window), and the SLO's latency target as a horizontal dashed line (with the latency budget
    ``latency_ms - preprocess_ms`` as a dotted line when preprocessing is non-zero). The target is
    taken from ``slo`` when given, else from ``recommendation.slo_latency_ms``. The x axis is
    logarithmic when throughput spans more than a factor of 20.

    Returns:
        The path written.

    Raises:
        ValueError: ``result`` has no rows.
        ImportError: matplotlib is missing (``pip install "adaptive-batcher[cli]"``).
        OSError: the file cannot be written.
    """
    if not result.rows:
        raise ValueError("cannot plot a profile with no rows")
    fig = agg_figure("plot_profile", figsize=(8.0, 5.0), dpi=100)
    ax = fig.add_subplot()
    xs = [row.items_per_s for row in result.rows]
    medians = [row.median_ms for row in result.rows]
    tails = [row.p99_ms - row.median_ms for row in result.rows]
    ax.errorbar(
        xs,
        medians,
        yerr=[[0.0] * len(tails), tails],
        fmt="o-",
        color="tab:blue",
        ecolor="tab:gray",
        capsize=3,
        label="median batch latency (bar: p99)",
    )
    for row in result.rows:
        ax.annotate(
            str(row.batch_size),
            (row.items_per_s, row.median_ms),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=8,
        )
    if knee is not None:
        ax.scatter(
            [knee.items_per_s],
            [knee.median_ms],
            marker="*",
            s=260,
            color="tab:orange",
            zorder=5,
            label=f"knee: batch {knee.batch_size}",
        )
    if recommendation is not None and recommendation.max_batch_size in result.batch_sizes:
        cap = result.row(recommendation.max_batch_size)
        ax.scatter(
            [cap.items_per_s],
            [cap.median_ms],
            s=300,
            facecolors="none",
            edgecolors="tab:green",
            linewidths=2,
            zorder=6,
            label=(
                f"recommended: cap {recommendation.max_batch_size}, "
                f"window {recommendation.window_ms:.2f} ms"
            ),
        )
    target_ms = slo.latency_ms if slo is not None else None
    if target_ms is None and recommendation is not None:
        target_ms = recommendation.slo_latency_ms
    if target_ms is not None:
        ax.axhline(target_ms, color="tab:red", linestyle="--", label=f"SLO {target_ms:g} ms")
        if slo is not None and slo.preprocess_ms > 0:
            budget = slo.room_ms
            ax.axhline(
                budget,
                color="tab:red",
                linestyle=":",
                label=f"budget after preprocess {budget:g} ms",
            )
    if max(xs) > 20 * min(xs):
        ax.set_xscale("log")
    ax.set_xlabel("throughput (items/s)")
    ax.set_ylabel("batch latency (ms)")
    ax.set_title(f"{result.model_name} on {result.device}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target, format="png")
    return target
