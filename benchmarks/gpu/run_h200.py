"""The GPU check of issue 26, in one command (about 7 minutes on an H200).

    python -m benchmarks.gpu.run_h200 --out DIR            # on the GPU machine
    python -m benchmarks.gpu.run_h200 --out DIR --dry-run --quick   # on a CPU, with fakes

Phases, in order: environment, telemetry, serving, squeeze, llm (see ``benchmarks/gpu/README.md``
for what each measures and the files it writes). It first checks that its imports are there
and names, in one line, the packages missing (exit status 2). Exit status 1: a phase failed
(its traceback is in ``summary.md``); 0 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repo root, not this folder, leads sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[2])

REQUIRED = {"numpy": "numpy", "structlog": "structlog", "torch": "torch"}
"""Module -> package the script cannot run without."""
REQUIRED_ON_GPU = {"pynvml": "nvidia-ml-py"}
OPTIONAL = {
    "torchvision": "torchvision (else the torch.nn ResNet-50)",
    "transformers": "transformers (else the torch.nn decoder)",
}


def missing_modules(modules: dict[str, str]) -> list[str]:
    """The packages of ``modules`` (module -> package) that do not import."""
    return [
        package for module, package in modules.items() if importlib.util.find_spec(module) is None
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from benchmarks.gpu.config import PHASES

    parser = argparse.ArgumentParser(prog="run_h200", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the results")
    parser.add_argument(
        "--dry-run", action="store_true", help="the CPU, with fakes for CUDA and NVML"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes and durations")
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (default: all, in that order)",
    )
    parser.add_argument("--budget-s", type=float, help="the whole run's budget, seconds")
    parser.add_argument("--run-s", type=float, help="seconds of arrivals per serving run")
    parser.add_argument("--rates", help="comma-separated Poisson rates of the serving runs, req/s")
    parser.add_argument("--buckets", help="comma-separated batch sizes (the largest is the cap)")
    parser.add_argument(
        "--no-graphs", action="store_true", help="without the CUDA-graph contenders"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_modules(REQUIRED | ({} if args.dry_run else REQUIRED_ON_GPU))
    if missing:
        print(
            f"missing: {', '.join(missing)} (carry them as wheels: benchmarks/gpu/README.md)",
            flush=True,
        )
        return 2
    optional = missing_modules(OPTIONAL)
    if optional:
        print(f"optional, not installed: {', '.join(optional)}", flush=True)

    from dataclasses import replace

    from benchmarks.gpu.config import FULL, PHASES, QUICK
    from benchmarks.gpu.runner import run

    config = QUICK if args.quick else FULL
    if args.budget_s is not None:
        config = replace(config, budget_s=args.budget_s)
    if args.run_s is not None:
        config = replace(config, run_s=args.run_s)
    if args.rates:
        config = replace(config, rates_rps=tuple(float(r) for r in args.rates.split(",")))
    if args.buckets:
        config = replace(config, buckets=tuple(int(b) for b in args.buckets.split(",")))
    if args.no_graphs:
        config = replace(config, graphs=False)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        print(f"unknown phases: {', '.join(unknown)}; known: {', '.join(PHASES)}", flush=True)
        return 2
    return run(config, phases, args.out, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
