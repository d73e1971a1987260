"""The replay's time-series plot: each contender keeps one colour in every panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adaptive_batcher.sim import report
from adaptive_batcher.sim.scenarios import CONTENDERS, SCENARIOS, run


def test_window_and_cap_lines_take_their_contenders_legend_colours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Static contenders draw no window or cap line; a controlled one drawn after them must
    not take the colour the legend gives the first static one."""
    scenario = SCENARIOS["poisson_30"]
    names = ("triton_like", "torchserve_like", "adaptive_pid")
    results = {name: run(scenario, CONTENDERS[name](scenario)) for name in names}
    figures: list[Any] = []
    make = report.agg_figure

    def keep(*args: Any, **kwargs: Any) -> Any:
        figures.append(make(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(report, "agg_figure", keep)
    report.plot_timeseries(results, tmp_path / "t.png", slo_ms=50.0, title="t")
    p99_ax, window_ax, cap_ax = figures[0].axes
    legend = {line.get_label(): line.get_color() for line in p99_ax.lines}
    assert len({legend[name] for name in names}) == len(names)
    assert [line.get_color() for line in window_ax.lines] == [legend["adaptive_pid"]]
    assert [line.get_color() for line in cap_ax.lines] == [legend["adaptive_pid"]]
