"""Compare the simulator's speed across checkouts, interleaved, on a noisy machine.

``test_sim_speed.py`` times one replay per contender; on a shared 2-vCPU machine one run can
take twice as long as the next. This script runs the same replay (Poisson at 1000 req/s, the
``poisson_30`` device and SLO, ``--minutes`` of simulated time) in a fresh process per run, for
each checkout in turn, ``--runs`` times, and reports CPU seconds per simulated hour: every run,
the median, and the minimum (the run least disturbed by the machine's other load, the figure
``timeit`` reports) with its ratio to the first checkout's. Usage::

    python benchmarks/compare_sim_speed.py --runs 20 --minutes 2 before=../old-checkout now=.

Each checkout is imported through ``PYTHONPATH`` (a path whose ``adaptive_batcher`` package is
the one to time); the script checks that the intended one was imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CONTENDERS = ("triton_like", "adaptive_pid_shed")

_ONE_RUN = """
import json, sys, time
from dataclasses import replace
import numpy as np
import adaptive_batcher
from adaptive_batcher.sim.scenarios import CONTENDERS, SCENARIOS, run
from adaptive_batcher.sim.workloads import Poisson
minutes = float(sys.argv[1])
arrivals = Poisson(1000.0).generate(60.0 * minutes, np.random.default_rng(0))
scenario = replace(SCENARIOS["poisson_30"], name="speed", arrivals=lambda seed: arrivals)
seconds = {}
for contender in sys.argv[2:]:
    start = time.process_time()
    run(scenario, CONTENDERS[contender](scenario))
    seconds[contender] = (time.process_time() - start) * 60.0 / minutes
print(json.dumps({"package": adaptive_batcher.__file__, "s_per_hour": seconds}))
"""


def one_run(checkout: Path, minutes: float) -> dict[str, float]:
    """CPU seconds per simulated hour of each contender, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    output = subprocess.run(
        [sys.executable, "-c", _ONE_RUN, str(minutes), *CONTENDERS],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",  # so the working directory's package cannot shadow the checkout's
        check=True,
    ).stdout
    reply = json.loads(output)
    expected = (checkout / "adaptive_batcher" / "__init__.py").resolve()
    if Path(reply["package"]).resolve() != expected:
        raise SystemExit(f"{checkout}: imported {reply['package']}, not {expected}")
    return dict(reply["s_per_hour"])


def checkout_argument(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` of a checkout whose ``adaptive_batcher`` package is to be timed."""
    name, equals, path = text.partition("=")
    if not equals or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    if not (Path(path) / "adaptive_batcher" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{path} holds no adaptive_batcher package")
    return name, Path(path)


def positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` > 0."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
        return value

    return convert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkouts", nargs="+", type=checkout_argument, help="NAME=PATH of each checkout to time"
    )
    parser.add_argument("--runs", type=positive(int), default=20, help="runs per checkout")
    parser.add_argument(
        "--minutes", type=positive(float), default=2.0, help="simulated minutes per run"
    )
    args = parser.parse_args()
    checkouts = dict(args.checkouts)
    if len(checkouts) < len(args.checkouts):
        parser.error("each checkout needs a name of its own")
    times: dict[str, dict[str, list[float]]] = {
        name: {c: [] for c in CONTENDERS} for name in checkouts
    }
    for run_index in range(args.runs):
        for name, path in checkouts.items():
            for contender, seconds in one_run(path, args.minutes).items():
                times[name][contender].append(seconds)
        print(f"run {run_index + 1} of {args.runs} done", file=sys.stderr)
    first = next(iter(checkouts))
    print("| contender | checkout | median s/h | min s/h | min ratio to " + first + " | runs |")
    print("|---|---|---|---|---|---|")
    for contender in CONTENDERS:
        reference = min(times[first][contender])
        for name in checkouts:
            runs = times[name][contender]
            print(
                f"| {contender} | {name} | {statistics.median(runs):.1f} | {min(runs):.1f} "
                f"| {min(runs) / reference:.3f} | {', '.join(f'{r:.1f}' for r in runs)} |"
            )


if __name__ == "__main__":
    main()
