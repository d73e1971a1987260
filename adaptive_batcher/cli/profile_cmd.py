"""``adaptive-batcher profile``: sweep batch sizes, find the knee, recommend a cap and a window.

Exit status: 0 on success (also when the SLO cannot be met: the report says so), 1 when the very
first batch size already runs out of memory (nothing to report), 2 on a bad argument, 3 when the
model, its factory (MODEL) or --input raises (one line on stderr, no traceback).

Logging is left to the entry point (``adaptive-batcher --log-level ...``); the progress bar and
warnings go to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptive_batcher._validate import (
    argument_type,
    check_ints,
    int_argument,
    number_argument,
    parse_ints,
    range_argument,
)
from adaptive_batcher.profile.recommend import DEFAULT_WINDOW_FRACTION

if TYPE_CHECKING:
    from adaptive_batcher.profile import ProfileResult, Recommendation
    from adaptive_batcher.slo import SLO

__all__ = ["register"]

_DESCRIPTION = """\
Measure a model's latency and throughput at a range of batch sizes (the practitioners'
three-step method): 1. sweep batch sizes on the real model and hardware, 2. find the knee of
the throughput curve, 3. keep a safety margin (--window-fraction of the window that would fit)
and check the latency budget against an SLO. It prints
a markdown table and a recommended batch cap (max_batch_size) and batching window (window_ms).

Each batch size is timed in rounds until its timings settle (robust coefficient of variation
at most --cv-threshold) or --max-repeats calls were made; the table shows the CV and the calls.
When a batch size did not settle, or a larger batch ran measurably faster than a smaller one
(beyond both rows' spread), the timings describe the machine's load as much as the model: the
command prints warnings and marks the recommendation NOT RELIABLE. torch's thread counts and
the CPU cores available are reported; --threads sets torch's count for the sweep.

With no MODEL it profiles the built-in example: a small torch MLP (256 -> 1024 -> 1024 -> 64)
fed batches of torch.randn(n, 256), so you can try it straight away.
"""

_EPILOG = """\
examples:
  adaptive-batcher profile --batch-sizes 1,2,4,8 --repeats 5
  adaptive-batcher profile --threads 1 --max-repeats 200      # a busy or small CPU
  adaptive-batcher profile --slo-p99-ms 50 --preprocess-ms 2 --out results/
  adaptive-batcher profile mypkg.serving:build_model --input mypkg.serving:make_batch

your own model:
  MODEL is 'module:function' where function() takes no arguments and returns the batch
  callable model(batch). --input is 'module:function' where function(n) returns a batch of n
  items (e.g. a tensor of shape (n, ...)), already on the model's device. The current directory
  is importable, so 'mymodel:build' finds ./mymodel.py.

exit status: 0 done, 1 the smallest batch size ran out of memory, 2 bad arguments, 3 the model,
  its factory (MODEL) or --input raised (the error is printed).
"""

_BUILTIN_NAME = "adaptive_batcher.examples.mlp:mlp_batch_fn"


class _UsageError(Exception):
    """A bad argument found after parsing (e.g. a module that cannot be imported)."""


class _UserCodeError(Exception):
    """The user's MODEL factory (or, in the sweep, the model or --input) raised: exit 3."""

    def __init__(self, exc: Exception, who: str = "the model or --input") -> None:
        super().__init__(f"{who} raised {type(exc).__name__}: {exc}")


def register(subparsers: Any) -> None:
    """Add the ``profile`` sub-command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "profile",
        help="sweep batch sizes on a model; recommend a batch cap and window",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(parser)
    parser.set_defaults(func=_run)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        type=argument_type("MODEL", _target),
        help="'module:function' returning the batch callable (default: the built-in example MLP)",
    )
    parser.add_argument(
        "--input",
        metavar="MODULE:FUNCTION",
        type=argument_type("--input", _target),
        help="'module:function' with function(n) -> a batch of n items (needed with MODEL)",
    )
    sizes = parser.add_argument_group("batch sizes")
    sizes.add_argument(
        "--batch-sizes",
        metavar="LIST",
        type=argument_type("--batch-sizes", _batch_sizes),
        help="comma-separated batch sizes, e.g. 1,2,4,8 (default: powers of two up to "
        "--max-batch-size)",
    )
    sizes.add_argument(
        "--max-batch-size",
        metavar="N",
        type=int_argument("--max-batch-size", 1),
        default=512,
        help="largest power of two to try when --batch-sizes is not given (default: 512)",
    )
    timing = parser.add_argument_group("timing")
    timing.add_argument(
        "--repeats",
        metavar="N",
        type=int_argument("--repeats", 1),
        default=20,
        help="timed calls per round at each batch size; median, p99 and CV are taken over all "
        "the rounds' calls (default: 20)",
    )
    timing.add_argument(
        "--max-repeats",
        metavar="N",
        type=int_argument("--max-repeats", 1),
        help="most timed calls per batch size: rounds of --repeats are added while the robust "
        "CV of the timings is above --cv-threshold (default: 5 x --repeats; equal to --repeats "
        "for a single round)",
    )
    timing.add_argument(
        "--cv-threshold",
        metavar="F",
        type=number_argument("--cv-threshold", 0.0, strict=True),
        default=0.1,
        help="a batch size is settled once the robust coefficient of variation of its timings "
        "(1.4826 x MAD / median) is at most F (default: 0.1, i.e. 10 %%)",
    )
    timing.add_argument(
        "--threads",
        metavar="N",
        type=int_argument("--threads", 1),
        help="torch.set_num_threads(N) for the sweep (default: leave torch's count as it is; "
        "the count used is reported either way). On a small or busy CPU, more threads than free "
        "cores make timings noisy: try 1",
    )
    timing.add_argument(
        "--warmup",
        metavar="N",
        type=int_argument("--warmup", 0),
        default=3,
        help="untimed calls per batch size before timing (default: 3)",
    )
    timing.add_argument(
        "--device",
        default="auto",
        help="'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N' (default: auto)",
    )
    slo = parser.add_argument_group("latency objective")
    slo.add_argument(
        "--slo-p99-ms",
        metavar="MS",
        type=number_argument("--slo-p99-ms", 0.0, strict=True),
        help="end-to-end p99 latency target in ms; the cap and window are checked against it",
    )
    slo.add_argument(
        "--preprocess-ms",
        metavar="MS",
        type=number_argument("--preprocess-ms", 0.0),
        default=0.0,
        help="time per request spent outside the batcher (decode, tokenise), ms (default: 0)",
    )
    slo.add_argument(
        "--window-fraction",
        metavar="F",
        type=range_argument("--window-fraction", 0.0, 1.0, open_low=True),
        default=DEFAULT_WINDOW_FRACTION,
        help="share of the window that would fit (the budget left after the cap's p99 compute; "
        "without an SLO, the knee's median latency) that the recommended window takes, in "
        "(0, 1] (default: 0.8). Not the SLO's margin, which the online controller applies to "
        "the latency target",
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        help="write profile.json, profile.md and profile.png into DIR (created if needed)",
    )
    output.add_argument(
        "--no-progress", action="store_true", help="do not show the progress bar (on stderr)"
    )


# --- argument types: adaptive_batcher._validate's checks, through argument_type (argparse turns
# their ArgumentTypeError into "error: argument <flag>: <message>" and exit status 2) ---


def _batch_sizes(name: str, text: str) -> list[int]:
    return sorted(set(check_ints(name, parse_ints(name, text), 1)))


def _target(name: str, text: str) -> str:
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr or ":" in attr:
        raise ValueError(
            f"{name} must be 'module:function' (e.g. mypkg.serving:build_model), got {text!r}"
        )
    return text


# --- loading the model and its inputs ---


def _load(spec: str, option: str) -> Callable[..., Any]:
    """Import ``module:attr.path`` and return the callable; _UsageError with a clear message."""
    module_name, _, attr_path = spec.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m` and uvicorn: ./mymodel.py is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _UsageError(
            f"{option} {spec!r}: cannot import module {module_name!r}: {exc}"
        ) from None
    target: Any = module
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise _UsageError(
                f"{option} {spec!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if not callable(target):
        raise _UsageError(
            f"{option} {spec!r}: {attr_path!r} is not callable, got {type(target).__name__}"
        )
    return target  # type: ignore[no-any-return]


def _builtin_model(device: str) -> tuple[Callable[[Any], Any], Callable[[int], Any]]:
    """The example MLP on ``device`` and ``make_batch(n) = torch.randn(n, 256)`` there."""
    try:
        import torch
    except ImportError:
        raise _UsageError(
            "the built-in example model needs torch: pip install 'adaptive-batcher[torch]', "
            "or pass your own MODEL and --input"
        ) from None
    from adaptive_batcher.examples.mlp import IN_FEATURES, make_mlp, mlp_batch_fn

    net = make_mlp().to(device)
    generator = torch.Generator().manual_seed(0)

    def make_batch(n: int) -> Any:
        return torch.randn(n, IN_FEATURES, generator=generator).to(device)

    return mlp_batch_fn(net), make_batch


def _run(args: argparse.Namespace) -> int:
    try:
        return _profile(args)
    except _UsageError as exc:
        print(f"adaptive-batcher profile: error: {exc}", file=sys.stderr)
        return 2
    except _UserCodeError as exc:  # the user's code failed: say so in one line, no traceback
        print(f"adaptive-batcher profile: {exc}", file=sys.stderr)
        return 3


def _online_margin_warning(slo: SLO | None) -> str | None:
    """The warning when the preprocessing leaves the online controller no time at the SLO's
    default margin (it aims at ``margin * latency_ms``; the recommendation budgets the whole
    SLO); None otherwise or without an SLO."""
    from adaptive_batcher.slo import SLO

    margin = SLO(latency_ms=1.0).margin  # the default
    if slo is None or slo.preprocess_ms < margin * slo.latency_ms:
        return None
    needed = slo.preprocess_ms / slo.latency_ms
    return (
        f"online, the controller aims at SLO.margin x the SLO ({margin:g} x "
        f"{slo.latency_ms:g} ms by default), which {slo.preprocess_ms:g} ms of preprocessing "
        f"leaves no time: give the batcher SLO(..., margin=...) above {needed:.3g}"
    )


def _print_warnings(rec: Recommendation) -> None:
    """The sweep's warnings, the SLO's, then NOT RELIABLE when the sweep was noisy; on stderr."""
    messages = [*rec.warnings, rec.message, rec.noise_message]
    for message in messages:
        if message is not None:
            print(f"warning: {message}", file=sys.stderr)


def _sweep(
    args: argparse.Namespace, model: Any, make_batch: Any, device: Any, name: str
) -> ProfileResult:
    """The batch-size sweep the arguments ask for."""
    from adaptive_batcher.profile import profile_model

    return profile_model(
        model,
        make_batch,
        batch_sizes=args.batch_sizes,
        max_batch_size=args.max_batch_size,
        repeats=args.repeats,
        max_repeats=args.max_repeats,
        cv_threshold=args.cv_threshold,
        warmup=args.warmup,
        device=device,
        torch_threads=args.threads,
        progress=not args.no_progress,
        model_name=name,
    )


def _profile(args: argparse.Namespace) -> int:
    from adaptive_batcher.profile import (
        find_knee,
        markdown_report,
        plot_profile,
        recommend,
        resolve_device,
        write_profile,
    )
    from adaptive_batcher.slo import SLO

    slo: SLO | None = None
    if args.slo_p99_ms is not None:
        try:
            # margin 1: the offline recommendation budgets the whole SLO (see
            # adaptive_batcher.profile.recommend); the controller's margin is not applied here
            slo = SLO(latency_ms=args.slo_p99_ms, preprocess_ms=args.preprocess_ms, margin=1.0)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    elif args.preprocess_ms:
        raise _UsageError("--preprocess-ms needs --slo-p99-ms (it is subtracted from the SLO)")
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as exc:
        raise _UsageError(f"--device: {exc}") from None
    if args.out is not None:  # before the sweep: a folder that cannot be written fails now
        if args.out.exists() and not args.out.is_dir():
            raise _UsageError(f"--out {str(args.out)!r} exists and is not a directory")
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _UsageError(f"cannot write --out {str(args.out)!r}: {exc}") from None
    if args.max_repeats is not None and args.max_repeats < args.repeats:
        raise _UsageError(
            f"--max-repeats must be >= --repeats ({args.repeats}), got {args.max_repeats}"
        )
    if args.threads is not None and importlib.util.find_spec("torch") is None:
        raise _UsageError("--threads sets torch's thread count, but torch is not installed")

    if args.model is None:
        model, make_batch = _builtin_model(device)
        name = _BUILTIN_NAME
        if args.input is not None:
            make_batch = _load(args.input, "--input")
    else:
        if args.input is None:
            raise _UsageError(
                "--input MODULE:FUNCTION is required with MODEL (function(n) returns a batch of n)"
            )
        factory = _load(args.model, "MODEL")
        make_batch = _load(args.input, "--input")
        if not _takes_arguments(make_batch, 1):
            raise _UsageError(
                f"--input {args.input!r} must be a function of one argument n that returns a "
                f"batch of n; it takes {inspect.signature(make_batch)}"
            )
        if not _takes_arguments(factory, 0):
            raise _UsageError(
                f"MODEL {args.model!r} must be a function with no arguments that returns the "
                f"model; it takes {inspect.signature(factory)}"
            )
        model = _build(factory, args.model)
        if not callable(model):
            raise _UsageError(
                f"MODEL {args.model!r} returned {type(model).__name__}, which is not callable; "
                "it must return the batch callable model(batch)"
            )
        name = args.model

    try:
        result = _sweep(args, model, make_batch, device, name)
    except Exception as exc:  # the user's model or input function failed
        raise _UserCodeError(exc) from exc
    if not result.rows:
        print(
            f"adaptive-batcher profile: the smallest batch size ({result.oom_batch_size}) ran out "
            "of memory; nothing to report",
            file=sys.stderr,
        )
        return 1
    knee = find_knee(result)
    rec = recommend(result, slo, args.window_fraction, knee=knee)
    margin_warning = _online_margin_warning(slo)
    more = () if margin_warning is None else (margin_warning,)
    report = markdown_report(result, knee=knee, recommendation=rec, more_warnings=more)
    print(report)
    _print_warnings(rec)
    if margin_warning is not None:
        print(f"warning: {margin_warning}", file=sys.stderr)
    if args.out is not None:
        out: Path = args.out
        written = [
            write_profile(out / "profile.json", result, knee=knee, recommendation=rec),
            out / "profile.md",
            plot_profile(result, out / "profile.png", knee=knee, recommendation=rec, slo=slo),
        ]
        (out / "profile.md").write_text(report, encoding="utf-8")
        for path in written:
            print(f"wrote {path}")
    return 0


def _build(factory: Callable[..., Any], spec: str) -> Any:
    """``factory()``, the user's MODEL factory (``spec``, as given).

    Raises:
        _UserCodeError: the factory raised (exit status 3, as when the model itself raises).
    """
    try:
        return factory()
    except Exception as exc:
        raise _UserCodeError(exc, f"MODEL {spec!r}") from exc


def _takes_arguments(function: Any, count: int) -> bool:
    """True if ``function`` can be called with ``count`` positional arguments (or there is no
    signature to read, and the call itself will tell)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True
