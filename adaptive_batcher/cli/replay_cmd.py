"""``adaptive-batcher replay``: replay traffic against policies and baselines, compare, plot.

Runs named scenarios (or your own trace and service profile) through the deterministic
simulator for each contender, prints the comparison table, and writes ``replay.md``,
``replay_goodput.png`` and one ``replay_<scenario>.png`` (p99, window and cap over time) to
``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from adaptive_batcher._optional import INSTALL_CLI
from adaptive_batcher._validate import int_argument, number_argument
from adaptive_batcher.cli._help import plain
from adaptive_batcher.sim.report import (
    BEST_STATIC,
    BEST_STATIC_SHED,
    COST_ORACLE,
    Cell,
    comparison_markdown,
    format_ratio,
    plot_goodput,
    plot_timeseries,
    versus,
)
from adaptive_batcher.sim.scenarios import (
    CONTENDERS,
    SCENARIOS,
    SLO_50,
    STATIC_CAPS,
    STATIC_WINDOWS_MS,
    Scenario,
    best_static,
    cost_oracle,
    make_scenarios,
    run,
    sheds,
    static_grid,
)
from adaptive_batcher.sim.service import TableService
from adaptive_batcher.sim.traces import TIME_UNITS, TIMESTAMP_COLUMN, TRACE_DIR, load_trace
from adaptive_batcher.sim.workloads import Arrivals
from adaptive_batcher.slo import SLO

try:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(f"adaptive-batcher replay needs rich (the cli extra): {INSTALL_CLI}") from exc

__all__ = ["register"]

_GRID_RUNS = len(STATIC_WINDOWS_MS) * len(STATIC_CAPS)
MAX_REPLAY_S = 7 * 86_400.0
"""The longest span a ``--trace`` may have after ``--compress``, s of replay time (a week).
A replay keeps per-second series of its whole span (and plots them): a trace stretched past
this, usually by a ``--compress`` below 1 given by mistake (1e-9 turned 5 s into 158 years
and a 40 GiB array), is refused with exit status 2, not replayed."""
DEFAULT_CONTENDERS = (
    "adaptive_pid_shed",
    "adaptive_pid",
    "triton_like",
    "ray_serve_defaults",
    "bentoml_cork",
    "clipper_aimd",
)


def register(subparsers: Any) -> None:
    """Add the ``replay`` sub-command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="replay traffic against policies and baselines; print and plot the comparison",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"{_epilog()}\n\n{_EXIT_STATUS}",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        metavar="NAME",
        help="a named scenario (repeatable; default: step_3x and bursts)",
    )
    parser.add_argument(
        "--contender",
        action="append",
        choices=sorted(CONTENDERS),
        metavar="NAME",
        help="a policy or baseline (repeatable; default: the main six)",
    )
    parser.add_argument(
        "--no-best-static",
        action="store_true",
        help="skip the static grids searched in hindsight: the best static setting and the "
        f"cost oracle ({_GRID_RUNS} replays a scenario), and the best static setting with "
        f"shedding, the yardstick of a contender that sheds ({_GRID_RUNS} more, only then)",
    )
    _add_trace_options(parser)
    parser.add_argument(
        "--service",
        type=Path,
        help="service-time profile JSON from `adaptive-batcher profile` "
        "(default: resnet50 on an H200); scenario loads rescale to its capacity; batches "
        "beyond its sizes take times extrapolated from its two largest (noted when more than "
        "twice the largest)",
    )
    parser.add_argument(
        "--slo-p99-ms",
        type=number_argument("--slo-p99-ms", 0.0, strict=True),
        help="the SLO p99 target, ms (default 50)",
    )
    parser.add_argument(
        "--seed",
        type=int_argument("--seed", 0),
        default=_REPLAY["seed"],
        help="seed of arrivals and noise",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=_REPLAY["out"],
        help="folder for replay.md and the plots (default ./replay-out)",
    )
    parser.add_argument(
        "--list", action="store_true", help="list scenarios and contenders (give it alone)"
    )
    parser.set_defaults(func=run_command)


# the options that say how to read --trace, with their defaults: meaningless without it
_TRACE_READING = {
    "time_column": TIMESTAMP_COLUMN,
    "time_unit": "datetime",
    "size_column": None,
    "max_units": None,
    "compress": 1000.0,
}


# every option of a replay, with its default: --list, which only lists, refuses them (an option
# it ignored would say it had been used)
_REPLAY: dict[str, Any] = {
    "scenario": None,
    "contender": None,
    "no_best_static": False,
    "trace": None,
    **_TRACE_READING,
    "traces_dir": None,
    "service": None,
    "slo_p99_ms": None,
    "seed": 0,
    "out": Path("replay-out"),
}


def _given(args: argparse.Namespace, defaults: dict[str, Any]) -> list[str]:
    """The options among ``defaults`` that ``args`` holds another value for, as typed
    (``--time-unit``)."""
    return [
        "--" + name.replace("_", "-")
        for name, default in defaults.items()
        if getattr(args, name) != default
    ]


def _add_trace_options(parser: argparse.ArgumentParser) -> None:
    """``--trace`` and how to read it; ``--traces-dir`` for the named trace scenarios."""
    parser.add_argument(
        "--trace",
        type=Path,
        help="replay this trace: a CSV with a header row, or JSON Lines (.jsonl / .ndjson), one "
        "request per row or record (default columns: the Azure LLM traces')",
    )
    parser.add_argument(
        "--time-column",
        default=_TRACE_READING["time_column"],
        metavar="NAME",
        help=f"the column (JSON: field) with arrival times (default {TIMESTAMP_COLUMN})",
    )
    parser.add_argument(
        "--time-unit",
        choices=TIME_UNITS,
        default=_TRACE_READING["time_unit"],
        help="arrival times as ISO 8601 dates and times (default) or numbers of s or ms",
    )
    parser.add_argument(
        "--size-column",
        metavar="NAME",
        help="the column (JSON: field) with each request's size in units, an integer; a size "
        "below 1 (0 or negative) is replayed as 1 unit, not refused (default: one unit each)",
    )
    parser.add_argument(
        "--max-units",
        type=int_argument("--max-units", 1),
        metavar="N",
        help="clip sizes to at most N units (a request larger than the batch cap is refused)",
    )
    parser.add_argument(
        "--compress",
        type=number_argument("--compress", 0.0, strict=True),
        default=_TRACE_READING["compress"],
        help="time compression of --trace (default 1000)",
    )
    parser.add_argument(
        "--traces-dir",
        type=Path,
        metavar="FOLDER",
        help=f"where the named trace scenarios (azure_code, azure_conv) find their files "
        f"(default {TRACE_DIR})",
    )


def _epilog() -> str:
    scenarios = "\n".join(f"  {name:16s} {s.description}" for name, s in SCENARIOS.items())
    return f"scenarios:\n{scenarios}\n\ncontenders: {', '.join(CONTENDERS)}"


_EXIT_STATUS = (
    "exit status: 0 done, 2 bad arguments (among them a trace, profile or --out that cannot be "
    "read or written, or a --trace longer than 7 days of replay after --compress; the error "
    "is printed)"
)


def run_command(args: argparse.Namespace) -> int:
    """Run the replays, or list the scenarios and contenders for ``--list`` (given alone);
    returns the exit status."""
    # piped or logged output: wide enough that names and figures are never cut
    console = Console() if sys.stdout.isatty() else Console(width=160)
    if args.list:
        given = _given(args, _REPLAY)
        if given:
            _error(
                f"{', '.join(given)}: options for a replay, given with --list (it only lists "
                "the scenarios and contenders): give --list alone"
            )
            return 2
        console.print(_epilog())
        return 0
    try:
        scenarios = _scenarios(args)
        _check_traces(scenarios, args.seed)
    except FileNotFoundError as exc:  # a trace is missing
        hint = "--trace" if args.trace is not None else "--traces-dir at the folder that holds it"
        _error(f"{exc}; point {hint}")
        return 2
    except (OSError, ValueError) as exc:
        _error(str(exc))
        return 2
    if args.trace is not None:
        console.print(_trace_note(scenarios[0].arrivals(args.seed), args.compress))
    contenders = args.contender or list(DEFAULT_CONTENDERS)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _error(f"cannot write {args.out}: {exc}")
        return 2
    try:
        cells = _run_all(scenarios, contenders, not args.no_best_static, args.seed, console)
    except FileNotFoundError as exc:  # a scenario's trace is missing
        _error(str(exc))
        return 2
    console.print(_table(cells))
    if args.service is not None:
        note = _extrapolation_note(cells, TableService.from_profile_json(args.service))
        if note:
            console.print(note)
    _write(cells, scenarios, args.out)
    console.print(f"wrote {args.out / 'replay.md'} and plots in {args.out}")
    return 0


def _error(message: str) -> None:
    """The command's error, on one line of stderr: printed as it is (no markup, no wrapping),
    so a file's text quoted in it (a trace cell like ``[/b]``) shows as written."""
    one_line = " ".join(message.splitlines())
    print(f"adaptive-batcher replay: {one_line}", file=sys.stderr)


def _extrapolation_note(cells: Sequence[Cell], table: TableService) -> str | None:
    """A note when batches ran beyond twice the largest size the profile measured (their
    service times are extrapolated along its last segment, see :class:`TableService`)."""
    measured = int(table.sizes[-1])
    calls = [cell.result.calls for cell in cells if len(cell.result.calls)]
    largest = max((int(units.max()) for units in (c[:, 3] for c in calls)), default=0)
    if largest <= 2 * measured:
        return None
    return (
        f"note: batches of up to {largest} units ran, and the profile measured sizes up to "
        f"{measured}: their service times are extrapolated from its two largest sizes; profile "
        f"larger batch sizes (adaptive-batcher profile --batch-sizes ...) to replay them measured"
    )


def _scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios asked for, on the device and SLO asked for (loads rescale to its capacity).

    Raises:
        ValueError: an option for reading ``--trace`` without ``--trace``, ``--scenario``
            with it, or no file at ``--service``.
    """
    if args.trace is None:
        given = _given(args, _TRACE_READING)
        if given:
            raise ValueError(f"{', '.join(given)}: options for reading --trace, given without it")
    elif args.scenario:
        raise ValueError("--scenario and --trace: give one (a trace replaces the scenarios)")
    if args.service is not None and not Path(args.service).is_file():
        raise ValueError(f"no service profile file at {args.service} (--service)")
    table = (
        TableService.from_profile_json(args.service)
        if args.service is not None
        else TableService.from_h200("resnet50")
    )
    slo = SLO(latency_ms=args.slo_p99_ms) if args.slo_p99_ms is not None else SLO_50
    custom = args.service or args.slo_p99_ms or args.traces_dir
    named = make_scenarios(table, slo, args.traces_dir) if custom else SCENARIOS
    if args.trace is None:
        return [named[name] for name in args.scenario or ("step_3x", "bursts")]
    path = args.trace
    if not path.exists():
        raise FileNotFoundError(f"no trace at {path}")
    options: dict[str, Any] = {
        "compress": args.compress,
        "time_column": args.time_column,
        "time_unit": args.time_unit,
        "size_column": args.size_column,
        "max_units": args.max_units,
    }
    _check_span(load_trace(path, **options), args.compress)  # fail now, with a clear message
    return [
        replace(
            named["bursts"],
            name="trace",
            description=f"{path.name} x{args.compress:g}",
            arrivals=lambda seed: load_trace(path, **options),
        )
    ]


def _check_span(arrivals: Arrivals, compress: float) -> None:
    """Refuse a trace whose span after ``--compress`` is longer than :data:`MAX_REPLAY_S`.

    Raises:
        ValueError: the span is too long; the message gives the ``--compress`` that fits.
    """
    span_s = arrivals.duration_s
    if not span_s > MAX_REPLAY_S:  # (a NaN span, none known, is not refused)
        return
    raise ValueError(
        f"--compress {compress:g}: the trace ({span_s * compress:.3g} s in the file) would span "
        f"{span_s:.3g} s of replay, more than the {MAX_REPLAY_S:.0f} s (7 days) a replay "
        f"allows; give --compress {_round_up(span_s * compress / MAX_REPLAY_S)} or more (a value "
        "below 1 stretches the trace, above 1 compresses it)"
    )


def _round_up(value: float) -> str:
    """``value`` > 0 rounded up to 3 significant digits, as text: a bound a user can give."""
    scale = 10.0 ** (math.floor(math.log10(value)) - 2)
    return f"{math.ceil(value / scale) * scale:.3g}"


def _trace_note(arrivals: Arrivals, compress: float) -> str:
    """What the replay makes of a trace: its requests, span and rate after ``--compress``
    (a user's real-time trace, compressed 1000x by default, is a far heavier load)."""
    span_s = arrivals.duration_s if arrivals.times_s.size else 0.0
    rate = f"{arrivals.rate_rps:,.0f} req/s" if span_s > 0 else "all at once"
    return (
        f"trace: {arrivals.times_s.size:,} requests over {span_s:.3g} s after --compress "
        f"{compress:g} ({span_s * compress:.3g} s in the file): {rate}"
    )


def _check_traces(scenarios: list[Scenario], seed: int) -> None:
    """Build each scenario's arrivals once, so that a missing trace fails before any replay
    (a trace scenario reads its file when its arrivals are built).

    Raises:
        FileNotFoundError: a scenario's trace file is missing.
    """
    for scenario in scenarios:
        scenario.arrivals(seed)


def _run_all(
    scenarios: list[Scenario], contenders: list[str], grid: bool, seed: int, console: Console
) -> list[Cell]:
    """Every contender on every scenario, then (with ``grid``) the static references: the best
    static setting and the cost oracle, and the best static setting with shedding when a
    contender sheds (it is that contender's yardstick)."""
    cells: list[Cell] = []
    total = len(scenarios) * (len(contenders) + (2 if grid else 0))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=total)
        for scenario in scenarios:
            shedding = False
            for name in contenders:
                config = CONTENDERS[name](scenario)
                shedding = shedding or sheds(config)
                result = run(scenario, config, seed)
                cells.append(Cell(scenario.name, name, result, sheds=sheds(config)))
                progress.advance(task)
            if grid:
                cells.extend(_static_cells(scenario, seed))
                progress.advance(task)
                if shedding:
                    cells.append(_best_static_shed(scenario, seed))
                progress.advance(task)
    return cells


def _static_cells(scenario: Scenario, seed: int) -> list[Cell]:
    """The best static setting and the cost oracle, from one replay of the static grid."""
    runs = static_grid(scenario, seed=seed)
    best = best_static(runs)
    cells = [Cell(scenario.name, BEST_STATIC, best.result, best.label)]
    oracle = cost_oracle(runs)
    if oracle is not None:
        cells.append(Cell(scenario.name, COST_ORACLE, oracle.result, oracle.label))
    return cells


def _best_static_shed(scenario: Scenario, seed: int) -> Cell:
    """The best static setting of the same grid with SLO-aware shedding."""
    best = best_static(static_grid(scenario, shed=True, seed=seed))
    return Cell(scenario.name, BEST_STATIC_SHED, best.result, best.label, sheds=True)


_COLUMNS = (
    "goodput/s",
    "vs best",
    "in SLO",
    "p99 ms",
    "dev ms/req",
    "vs oracle",
    "ms per good",
    "batch",
    "shed",
    "lost",
)


def _table(cells: list[Cell]) -> Table:
    """The figures of ``replay.md`` (its ``vs best`` and ``vs oracle`` from the same
    :func:`~adaptive_batcher.sim.report.versus`), without its notes."""
    table = Table(
        title="replay (goodput: answers within the SLO per second)",
        caption="vs best: goodput over the best static setting's (with shedding, for a "
        "contender that sheds); vs oracle: device ms per request over the cost oracle's (the "
        "cheapest static setting that met the SLO); both in hindsight; - where there is none",
    )
    table.add_column("scenario", no_wrap=True)
    table.add_column("contender", no_wrap=True)
    for column in _COLUMNS:
        table.add_column(column, justify="right", no_wrap=True)
    for cell, ratios in zip(cells, versus(cells), strict=True):
        r = cell.result
        table.add_row(
            cell.scenario,
            cell.contender,
            f"{r.goodput_rps:,.0f}",
            format_ratio(ratios.best),
            f"{r.slo_attainment:.2%}",
            f"{r.p99_ms:,.1f}",
            f"{r.device_ms_per_request:.4f}",
            format_ratio(ratios.oracle),
            f"{r.device_ms_per_good:.4f}",
            f"{r.mean_batch_size:.1f}",
            f"{r.expired:,}",
            str(r.lost),
        )
    return table


def _write(cells: list[Cell], scenarios: list[Scenario], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.md").write_text(comparison_markdown(cells))
    plot_goodput(cells, out / "replay_goodput.png")
    for scenario in scenarios:
        shown = {c.contender: c.result for c in cells if c.scenario == scenario.name}
        plot_timeseries(
            shown,
            out / f"replay_{scenario.name}.png",
            slo_ms=scenario.slo.latency_ms,
            title=scenario.description,
        )
