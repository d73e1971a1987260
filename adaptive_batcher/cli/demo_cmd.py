"""``adaptive-batcher demo``: a small torch model on CPU behind the batcher, under live traffic.

Open-loop arrivals: Poisson at ``--rate`` for the first 40 % of the run, a burst at
``--burst-rate`` for the next 20 %, then Poisson at ``--rate`` again. The controller tunes window
and cap toward ``--slo-p99-ms`` and sheds requests that can no longer meet it (``--static`` keeps
window and cap fixed and sheds nothing). A live table shows queue depth,
batch size, p50/p99 latency, the window and cap in force; a summary table closes the run.

torch runs the model with one intra-op thread unless --torch-threads says otherwise: the example
MLP is small (a batch of 64 is a few milliseconds of work), so splitting each matmul across
threads gains little, while the event loop (arrivals, batching, this display) needs a core of its
own. On a machine with few cores, torch's default (one thread per core) makes the model's threads
and the event loop compete, and intra-op threads that wait for a descheduled peer stretch batch
latencies unpredictably: on a busy 2-core machine, profiling this model with 2 threads gave
batch 4 at 40 ms next to batch 8 at 0.52 ms, and one thread a sane curve.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from adaptive_batcher import SLO, AdaptiveBatcher, BatcherError, stacked
from adaptive_batcher._optional import INSTALL_CLI
from adaptive_batcher._threads import use_torch_threads
from adaptive_batcher._validate import int_argument, number_argument
from adaptive_batcher.cli._help import plain

try:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(f"adaptive-batcher demo needs rich (the cli extra): {INSTALL_CLI}") from exc

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="serve a small torch model on CPU under Poisson-then-burst traffic",
        description=plain(__doc__),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--duration", type=_positive("--duration"), default=20.0, help="run time, seconds"
    )
    parser.add_argument(
        "--rate", type=_positive("--rate"), default=300.0, help="base arrival rate, req/s"
    )
    parser.add_argument(
        "--burst-rate",
        type=_positive("--burst-rate"),
        default=900.0,
        help="arrival rate during the burst, req/s",
    )
    parser.add_argument(
        "--window-ms",
        type=number_argument("--window-ms", 0.0),
        default=2.0,
        help="starting batching window, ms",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int_argument("--max-batch-size", 1),
        default=64,
        help="batch cap, items",
    )
    parser.add_argument(
        "--executor",
        choices=["thread", "inline", "adaptive"],
        default="thread",
        help="where the model runs (see AdaptiveBatcher; adaptive: on the event loop once "
        "warm-up finds its batches within 1 ms, else its thread)",
    )
    parser.add_argument(
        "--slo-p99-ms",
        type=_positive("--slo-p99-ms"),
        default=50.0,
        help="the SLO the controller aims at, ms (with --static: what answers are judged by)",
    )
    parser.add_argument(
        "--static", action="store_true", help="no controller: keep --window-ms and the cap"
    )
    parser.add_argument(
        "--seed", type=int_argument("--seed", 0), default=0, help="arrival process seed"
    )
    parser.add_argument(
        "--torch-threads",
        type=int_argument("--torch-threads", 0),
        default=1,
        help="torch.set_num_threads for the run (restored afterwards); 0 keeps torch's default "
        "(one per core). 1 by default: the model is small and the event loop needs a core",
    )
    parser.set_defaults(func=run)


@dataclass
class _Tally:
    """What the clients saw: answers, answers within the SLO (timed by the client), errors."""

    slo_s: float
    ok: int = 0
    within_slo: int = 0
    errors: int = 0


def _positive(flag: str) -> Callable[[str], float]:
    return number_argument(flag, 0.0, strict=True)


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit status."""
    try:
        from adaptive_batcher.examples.mlp import make_input
    except ImportError:  # pragma: no cover - the torch extra is missing
        Console(stderr=True).print(
            "[red]the demo needs torch: pip install 'adaptive-batcher[torch]'"
        )
        return 2
    threads = None if args.torch_threads == 0 else args.torch_threads
    with use_torch_threads(threads, option="--torch-threads"):
        model = _ThreadReportingModel()
        return asyncio.run(_serve(args, model, make_input))


class _ThreadReportingModel:
    """The example MLP's batch function, stacked; records ``torch.get_num_threads()`` as seen
    from the thread each batch runs on (torch keeps the count per thread)."""

    def __init__(self) -> None:
        import torch

        from adaptive_batcher.examples.mlp import mlp_batch_fn

        self._torch = torch
        self._run = stacked(mlp_batch_fn())
        self.threads_seen: set[int] = set()

    def __call__(self, items: list[Any]) -> Sequence[Any]:
        self.threads_seen.add(int(self._torch.get_num_threads()))
        return self._run(items)


def _rate_at(elapsed_s: float, args: argparse.Namespace) -> float:
    phase = elapsed_s / args.duration
    return float(args.burst_rate if 0.4 <= phase < 0.6 else args.rate)


async def _serve(args: argparse.Namespace, model: _ThreadReportingModel, make_input: Any) -> int:
    console = Console()
    batcher = AdaptiveBatcher(
        model,
        max_batch_size=args.max_batch_size,
        window_ms=args.window_ms,
        executor=args.executor,
        slo=None if args.static else SLO(latency_ms=args.slo_p99_ms),
        shed_late=not args.static,
        name="demo",
    )
    inputs = [make_input(seed=i) for i in range(256)]
    await batcher.warmup(lambda: inputs[0])
    tally = _Tally(slo_s=args.slo_p99_ms / 1e3)
    started = time.perf_counter()
    async with batcher:
        with Live(
            _live_table(batcher, tally, 0.0, args), console=console, refresh_per_second=4
        ) as live:
            arrivals = asyncio.create_task(_open_loop(batcher, inputs, tally, args, started))
            while not arrivals.done():
                await asyncio.sleep(0.25)
                elapsed = time.perf_counter() - started
                live.update(_live_table(batcher, tally, elapsed, args))
            await arrivals
    _end_live_line(console)
    wall_s = time.perf_counter() - started
    console.print(_summary_table(batcher, tally, wall_s, model, args.executor))
    return 0


def _end_live_line(console: Console) -> None:
    """End the live table's last line, so that the summary starts on a line of its own.

    rich's ``Live`` ends its last render with a newline only on a terminal; piped or captured
    output was left on the bottom border, and the summary's title was printed after it.
    """
    if not console.is_terminal:
        console.line()


async def _open_loop(
    batcher: AdaptiveBatcher[Any, Any],
    inputs: list[Any],
    tally: _Tally,
    args: argparse.Namespace,
    started: float,
) -> None:
    rng = random.Random(args.seed)
    pending: set[asyncio.Task[None]] = set()
    next_at = 0.0
    while next_at < args.duration:
        delay = started + next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_one_request(batcher, inputs[rng.randrange(len(inputs))], tally))
        pending.add(task)
        task.add_done_callback(pending.discard)
        next_at += rng.expovariate(_rate_at(next_at, args))
    if pending:
        await asyncio.gather(*pending)


async def _one_request(batcher: AdaptiveBatcher[Any, Any], item: Any, tally: _Tally) -> None:
    sent = time.perf_counter()
    try:
        await batcher.submit(item)
    except BatcherError:
        tally.errors += 1
        return
    tally.ok += 1
    if time.perf_counter() - sent <= tally.slo_s:
        tally.within_slo += 1


def _live_table(
    batcher: AdaptiveBatcher[Any, Any], tally: _Tally, elapsed_s: float, args: argparse.Namespace
) -> Table:
    stats = batcher.stats()
    table = Table(title=f"adaptive-batcher demo  {elapsed_s:5.1f}/{args.duration:.0f} s")
    columns = ("offered req/s", "queue", "mean batch", "p50 ms", "p99 ms", "window ms", "cap")
    for column in (*columns, "done"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{_rate_at(min(elapsed_s, args.duration), args):.0f}",
        str(stats.queue_depth),
        f"{stats.counts.mean_batch_size:.1f}",
        f"{stats.latency.p50_ms:.1f}",
        f"{stats.latency.p99_ms:.1f}",
        f"{stats.window_ms:.1f}",
        str(stats.max_batch_size),
        str(tally.ok),
    )
    return table


def _summary_table(
    batcher: AdaptiveBatcher[Any, Any],
    tally: _Tally,
    wall_s: float,
    model: _ThreadReportingModel,
    executor: str,
) -> Table:
    stats = batcher.stats()
    counts = stats.counts
    span_s = min(wall_s, batcher.recorder.latency.window_s)  # the latency histogram's span
    table = Table(title=f"summary (latency: the last {span_s:.0f} s of the run)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests completed", f"{counts.completed}"),
        (f"answered within the SLO ({tally.slo_s * 1e3:g} ms)", f"{tally.within_slo}"),
        ("requests shed, failed or rejected", f"{tally.errors}"),
        ("throughput, req/s", f"{counts.completed / wall_s:.0f}"),
        ("device time per request, ms", f"{counts.device_ms_per_request:.3f}"),
        ("batches", f"{counts.batches}"),
        ("mean batch size", f"{counts.mean_batch_size:.1f}"),
        ("largest batch", f"{max(stats.batch_sizes, default=0)}"),
        ("p50 latency, ms", f"{stats.latency.p50_ms:.2f}"),
        ("p99 latency, ms", f"{stats.latency.p99_ms:.2f}"),
        ("window, ms / batch cap at the end", f"{stats.window_ms:.1f} / {stats.max_batch_size}"),
        ("controller", f"{stats.policy} ({stats.decisions} decisions)" if stats.policy else "off"),
        (
            "SLO p99, ms",
            f"{stats.slo.latency_ms:g}"
            if stats.slo
            else f"{tally.slo_s * 1e3:g}, judged only (--static: no controller aims at it)",
        ),
        ("model runs", f"{stats.executor} (--executor {executor})"),
        ("torch threads where the model ran", _threads_text(model.threads_seen)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _threads_text(seen: set[int]) -> str:
    return ", ".join(str(n) for n in sorted(seen)) if seen else "n/a"
