"""A sweep of device slowdowns in replay: ours with shedding against the best static setting with
shedding, side by side on the same traces.

resnet50 (SLO 50 ms) and bert base at 128 tokens (SLO 30 ms) from the H200 tables, Poisson at
30 / 60 / 80 % of the capacity under the SLO for 20 s, the device 2x / 4x / 6x slower from 6 s to
14 s; the static grid is windows 0 and 10 ms x caps 64-512, each shedding what has not begun by
``SLO - 1.1 x its batch's warm-up time``. Prints one line per case (about 4 minutes on one
core). Not a test: it measures (docs/benchmarks.md, "Held-out replays").

Run: ``python -m benchmarks.slowdown_sweep``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from adaptive_batcher.sim.faults import Faults, Slowdown
from adaptive_batcher.sim.scenarios import (
    CONTENDERS,
    best_static,
    capacity_rps,
    make_scenarios,
    run,
    static_grid,
)
from adaptive_batcher.sim.service import TableService
from adaptive_batcher.sim.workloads import Arrivals, Poisson
from adaptive_batcher.slo import SLO

DEVICES = (("resnet50", 50.0), ("bert_base_seq128", 30.0))
FACTORS = (2.0, 4.0, 6.0)
LOADS = (0.3, 0.6, 0.8)


def main() -> None:
    for model, slo_ms in DEVICES:
        table = TableService.from_h200(model)
        slo = SLO(latency_ms=slo_ms)
        base = make_scenarios(table, slo)["poisson_30"]
        capacity = capacity_rps(table, slo)
        for factor in FACTORS:
            for load in LOADS:
                rate = load * capacity

                def arrivals(seed: int, rate: float = rate) -> Arrivals:
                    return Poisson(rate).generate(20.0, np.random.default_rng(seed))

                scenario = replace(
                    base,
                    name=f"{model}_slo{slo_ms:g}_x{factor:g}_{load:g}",
                    arrivals=arrivals,
                    stationary=False,
                    rate_rps=rate,
                    faults=Faults((Slowdown(6.0, 8.0, factor),)),
                )
                ours = run(scenario, CONTENDERS["adaptive_pid_shed"](scenario))
                grid = static_grid(scenario, shed=True, windows_ms=(0.0, 10.0))
                best = best_static(grid)
                print(
                    f"{scenario.name:32s} ours {ours.slo_attainment:.4f}"
                    f"  best static with shedding {best.result.slo_attainment:.4f} ({best.label})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
