"""Tables and plots of replay results: the comparison table (markdown) and two figures.

* :func:`comparison_markdown`: one row per (scenario, contender) with goodput and its ratio to
  the best static setting in hindsight (with shedding, for a contender that sheds), SLO
  attainment, p99, device cost per request and its ratio to the cost oracle (the cheapest
  static setting that met the SLO, in hindsight), device cost per answer within the SLO, batch
  size, shed and lost requests.
* :func:`versus`: the two ratios alone, for other tables (``adaptive-batcher replay``'s console
  table shows the same figures as its markdown).
* :func:`plot_timeseries`: window, cap and p99 over time for the contenders of one scenario.
* :func:`plot_goodput`: goodput per contender, one group of bars per scenario.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptive_batcher._optional import agg_figure
from adaptive_batcher.sim.result import SimResult

__all__ = [
    "BEST_STATIC",
    "BEST_STATIC_SHED",
    "COST_ORACLE",
    "Cell",
    "Versus",
    "comparison_markdown",
    "format_ratio",
    "plot_goodput",
    "plot_timeseries",
    "versus",
]

BEST_STATIC = "best_static"
"""The contender name of the best static setting in hindsight, without shedding."""
BEST_STATIC_SHED = "best_static_shed"
"""The same with SLO-aware shedding: the reference of a contender that sheds."""
COST_ORACLE = "cost_oracle"
"""The contender name of the cheapest static setting that met the SLO, in hindsight."""


@dataclass(frozen=True)
class Cell:
    """One replay: which scenario, which contender, what came out.

    Attributes:
        scenario, contender: names.
        result: what the replay measured.
        note: free text for the report (e.g. the static setting's label).
        sheds: whether the contender sheds the requests it can no longer answer within the SLO
            (its goodput is then compared with the best static setting *with* shedding).
    """

    scenario: str
    contender: str
    result: SimResult
    note: str = ""
    sheds: bool = False


@dataclass(frozen=True)
class Versus:
    """One cell's figures over its scenario's references; NaN where the scenario has none.

    Attributes:
        best: goodput over the best static setting's (the one with shedding for a cell that
            sheds: shedding alone is a gain a fixed setting can have too).
        oracle: device ms per request over the cost oracle's.
    """

    best: float
    oracle: float


def versus(
    cells: Sequence[Cell],
    reference: str = BEST_STATIC,
    oracle: str = COST_ORACLE,
    shed_reference: str = BEST_STATIC_SHED,
) -> list[Versus]:
    """Each cell's goodput over its reference's and device ms per request over the ``oracle``
    contender's, in the order of ``cells``. The reference is the ``reference`` contender of the
    same scenario, or ``shed_reference`` for a cell that sheds (NaN, never the other one, where
    the scenario has no such cell: a setting without shedding is no yardstick for one with)."""
    goodputs = {c.scenario: c.result.goodput_rps for c in cells if c.contender == reference}
    shed_goodputs = {
        c.scenario: c.result.goodput_rps for c in cells if c.contender == shed_reference
    }
    costs = {c.scenario: c.result.device_ms_per_request for c in cells if c.contender == oracle}
    out: list[Versus] = []
    for cell in cells:
        r = cell.result
        best = (shed_goodputs if cell.sheds else goodputs).get(cell.scenario)
        out.append(
            Versus(
                _over(r.goodput_rps, best),
                _over(r.device_ms_per_request, costs.get(cell.scenario)),
            )
        )
    return out


def comparison_markdown(
    cells: Sequence[Cell],
    reference: str = BEST_STATIC,
    oracle: str = COST_ORACLE,
    shed_reference: str = BEST_STATIC_SHED,
) -> str:
    """A markdown table. ``vs best`` is goodput over the ``reference`` contender's goodput
    (``shed_reference``'s for a cell that sheds); ``vs oracle`` is device ms per request over
    the ``oracle`` contender's (the cheapest static setting that met the SLO); ``-`` where a
    scenario has none (see :func:`versus`)."""
    lines = [
        "| scenario | contender | goodput req/s | vs best | SLO attainment | p99 ms "
        "| device ms/req | vs oracle | ms per good | mean batch | shed | lost | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, ratios in zip(cells, versus(cells, reference, oracle, shed_reference), strict=True):
        r = cell.result
        lines.append(
            f"| {cell.scenario} | {cell.contender} | {r.goodput_rps:,.0f} "
            f"| {format_ratio(ratios.best)} "
            f"| {r.slo_attainment:.4f} | {_ms(r.p99_ms)} | {r.device_ms_per_request:.4f} "
            f"| {format_ratio(ratios.oracle)} "
            f"| {r.device_ms_per_good:.4f} | {r.mean_batch_size:.1f} "
            f"| {r.expired:,} | {r.lost} | {cell.note} |"
        )
    return "\n".join(lines) + "\n"


def format_ratio(value: float) -> str:
    """A ratio with two decimals, ``-`` for NaN (no reference)."""
    return "-" if math.isnan(value) else f"{value:.2f}"


def _over(value: float, reference: float | None) -> float:
    if reference is None or not reference > 0 or math.isnan(reference):
        return math.nan
    return value / reference


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value < 1e5 else f"{value:.2e}"


def plot_timeseries(
    results: Mapping[str, SimResult], path: str | Path, *, slo_ms: float, title: str
) -> Path:
    """Three stacked panels over time: p99 (log scale, SLO line), window, cap. Writes a PNG.

    Raises:
        ImportError: matplotlib is missing (``pip install "adaptive-batcher[cli]"``).
    """
    figure = agg_figure("plot_timeseries", figsize=(10, 8))
    p99_ax, window_ax, cap_ax = figure.subplots(3, 1, sharex=True)
    colours = _colours(len(results))
    for colour, (name, result) in zip(colours, results.items(), strict=True):
        series = result.series
        p99_ax.plot(series.start_s, series.p99_ms, label=name, linewidth=1, color=colour)
        decisions = series.decisions
        if decisions.size:  # only controlled contenders: each keeps its legend colour
            window_ax.step(decisions[:, 0], decisions[:, 1], where="post", color=colour)
            cap_ax.step(decisions[:, 0], decisions[:, 2], where="post", color=colour)
    p99_ax.axhline(slo_ms, color="black", linestyle="--", linewidth=1, label="SLO p99")
    p99_ax.set_yscale("log")
    p99_ax.set_ylabel("p99 latency, ms")
    p99_ax.legend(fontsize=7, ncol=2)
    window_ax.set_ylabel("window, ms")
    cap_ax.set_ylabel("batch cap")
    cap_ax.set_xlabel("time, s")
    p99_ax.set_title(title)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=100)
    return out


def _colours(count: int) -> list[Any]:
    """One colour per contender, the same in every panel (matplotlib's tab10 cycle, then
    tab20 beyond ten)."""
    from matplotlib import colormaps

    palette = colormaps["tab10" if count <= 10 else "tab20"]
    return [palette(i % palette.N) for i in range(count)]


def plot_goodput(cells: Sequence[Cell], path: str | Path) -> Path:
    """Grouped bars: goodput per contender within each scenario. Writes a PNG.

    Raises:
        ImportError: matplotlib is missing (``pip install "adaptive-batcher[cli]"``).
    """
    import numpy as np

    scenarios = list(dict.fromkeys(c.scenario for c in cells))
    contenders = list(dict.fromkeys(c.contender for c in cells))
    values = {(c.scenario, c.contender): c.result.goodput_rps for c in cells}
    figure = agg_figure("plot_goodput", figsize=(max(8, 1.5 * len(scenarios)), 5))
    axes = figure.subplots()
    width = 0.8 / max(1, len(contenders))
    x = np.arange(len(scenarios))
    for i, contender in enumerate(contenders):
        heights = [values.get((s, contender), 0.0) for s in scenarios]
        axes.bar(x + i * width, heights, width, label=contender)
    axes.set_xticks(x + 0.4 - width / 2, scenarios, rotation=20, fontsize=8)
    axes.set_ylabel("goodput, req/s within SLO")
    axes.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=100)
    return out
