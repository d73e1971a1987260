"""``adaptive-batcher gateway``: an OpenAI-compatible proxy that puts the admission gate in front
of an engine (vLLM, SGLang, TGI, llama.cpp's llama-server, transformers serve).

Clients send their ``/v1/completions`` and ``/v1/chat/completions`` requests to the gateway
instead of the engine. It admits as many into the engine as keep the time to first token and
the time per output token within --ttft-ms and --tpot-ms, refuses the rest at once (429 or 503
with Retry-After), streams answers through unchanged, and passes a client's disconnect on to
the engine. /health, /metrics (Prometheus) and /v1/models are served too. The engine's own
/metrics are read every --metrics-interval-s (default: the upstream's /metrics) unless
--no-engine-metrics.

Once it listens, the gateway prints ``adaptive-batcher gateway: serving on http://HOST:PORT``
on stderr (with --port 0, the port the system chose). Ctrl-C or SIGTERM stops it, letting
requests in flight finish for up to --drain-timeout-s.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from adaptive_batcher._validate import (
    argument_type,
    check_int,
    int_argument,
    number_argument,
    parse_int,
    range_argument,
)
from adaptive_batcher.cli._help import plain
from adaptive_batcher.gateway._extra import missing_extra
from adaptive_batcher.llm.slo import TokenSLO

if TYPE_CHECKING:
    from adaptive_batcher.llm.controller import TokenController

__all__ = ["register", "slo_of"]


def _url(name: str, text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name} must be an http:// or https:// URL with a host, got {text!r}")
    try:
        parts.port  # noqa: B018 - it validates the port
    except ValueError as exc:
        raise ValueError(f"{name} has a bad port: {text!r}") from exc
    return text.rstrip("/")


def _server_root(name: str, text: str) -> str:
    url = _url(name, text)
    if urlsplit(url).path.endswith("/v1"):
        raise ValueError(
            f"{name} is the server's root, without /v1 (the gateway adds the OpenAI paths), "
            f"got {text!r}"
        )
    return url


def _port(name: str, text: str) -> int:
    port = check_int(name, parse_int(name, text), 0)
    if port > 65535:
        raise ValueError(f"{name} must be a port in [0, 65535], got {port}")
    return port


def _route(name: str, text: str) -> str:
    if not text.startswith("/"):
        raise ValueError(f"{name} must start with '/', got {text!r}")
    return text


def register(subparsers: Any) -> None:
    """Add the ``gateway`` sub-command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gateway",
        help="serve an OpenAI-compatible proxy that admits requests to an LLM engine by SLO",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--upstream",
        required=True,
        type=argument_type("--upstream", _server_root),
        metavar="URL",
        help="the engine's OpenAI-compatible server, e.g. http://127.0.0.1:8000",
    )
    parser.add_argument(
        "--ttft-ms",
        type=number_argument("--ttft-ms", 0.0, strict=True),
        default=300.0,
        help="time-to-first-token target, ms (default 300)",
    )
    parser.add_argument(
        "--tpot-ms",
        type=number_argument("--tpot-ms", 0.0, strict=True),
        default=50.0,
        help="time-per-output-token target, ms (default 50)",
    )
    parser.add_argument(
        "--percentile",
        type=range_argument("--percentile", 1.0, 100.0, open_high=True),
        default=99.0,
        help="the percentile both targets apply to, in [1, 100) (default 99)",
    )
    parser.add_argument(
        "--slo-margin",
        type=range_argument("--slo-margin", 0.0, 1.0, open_low=True),
        default=0.9,
        help="the share of the TPOT target the controller steers its percentile to, in (0, 1] "
        "(default 0.9; higher admits more, with less headroom for noise; the TTFT target is "
        "applied as it is, by refusing arrivals whose forecast first token misses it)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port",
        type=argument_type("--port", _port),
        default=9000,
        help="port to listen on (default 9000; 0: any free port)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int_argument("--max-in-flight", 1),
        default=256,
        metavar="N",
        help="most requests inside the engine at once, whatever the controller says (default 256)",
    )
    parser.add_argument(
        "--initial-limit",
        type=int_argument("--initial-limit", 1),
        default=None,
        metavar="N",
        help="the controller's in-flight limit before its first decisions (default: "
        "--max-in-flight); lower keeps a burst at start-up from flooding the engine before the "
        "first requests finish",
    )
    parser.add_argument(
        "--fixed-limit",
        type=int_argument("--fixed-limit", 1),
        default=None,
        metavar="N",
        help="hold the in-flight limit at N instead of letting the controller move it (a "
        "hand-tuned setting, or a fallback); the TTFT forecast still refuses early",
    )
    parser.add_argument(
        "--no-prefill-pacing",
        action="store_true",
        help="admit into free slots at once, without pacing the prompt tokens to what the "
        "running streams' TPOT target leaves (docs/llm.md, 'The controller')",
    )
    parser.add_argument(
        "--max-queue",
        type=int_argument("--max-queue", 0),
        default=None,
        metavar="N",
        help="most requests waiting in front of the engine; more get 429 (0: none waits, an "
        "arrival that finds the limit full is refused; default: no bound but the TTFT "
        "forecast's)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int_argument("--max-body-bytes", 1),
        default=1 << 20,
        metavar="N",
        help="largest request body, bytes; larger ones get 413 (default 1 MiB)",
    )
    parser.add_argument(
        "--metrics-url",
        type=argument_type("--metrics-url", _url),
        metavar="URL",
        help="the engine's Prometheus page (default: the upstream's /metrics)",
    )
    parser.add_argument(
        "--no-engine-metrics",
        action="store_true",
        help="do not read the engine's metrics (the gate then uses its own timings only)",
    )
    parser.add_argument(
        "--metrics-interval-s",
        type=number_argument("--metrics-interval-s", 0.1),
        default=1.0,
        help="seconds between reads of the engine's metrics (>= 0.1; default 1)",
    )
    parser.add_argument(
        "--upstream-health-path",
        type=argument_type("--upstream-health-path", _route),
        default="/health",
        metavar="PATH",
        help="the engine's health route, asked by the gateway's /health (at most once a "
        "second): 503 while it does not answer (default /health)",
    )
    parser.add_argument(
        "--no-upstream-health",
        action="store_true",
        help="the gateway's /health reports the gate alone, without asking the engine",
    )
    parser.add_argument(
        "--first-chunk-timeout-s",
        type=number_argument("--first-chunk-timeout-s", 0.0, strict=True),
        default=60.0,
        help="longest wait for an admitted request's first event from the engine (default 60)",
    )
    parser.add_argument(
        "--chunk-timeout-s",
        type=number_argument("--chunk-timeout-s", 0.0, strict=True),
        default=30.0,
        help="longest wait between two events of a stream (default 30)",
    )
    parser.add_argument(
        "--drain-timeout-s",
        type=number_argument("--drain-timeout-s", 0.0),
        default=30.0,
        help="on shutdown, how long requests in flight may take to finish (default 30)",
    )
    parser.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="the event loop: uvloop (where installed, e.g. with uvicorn[standard]), asyncio, "
        "or auto (uvloop where it is installed, as uvicorn does; default)",
    )
    parser.set_defaults(func=run_command)


def slo_of(args: argparse.Namespace) -> TokenSLO:
    """The objective the parsed arguments set."""
    return TokenSLO(
        ttft_ms=args.ttft_ms,
        tpot_ms=args.tpot_ms,
        percentile=args.percentile,
        margin=args.slo_margin,
    )


def run_command(args: argparse.Namespace) -> int:
    """Serve until interrupted; 0 after a clean stop, 2 without the gateway extra or when the
    address cannot be bound."""
    for flag, limit in (
        ("--fixed-limit", args.fixed_limit),
        ("--initial-limit", args.initial_limit),
    ):
        if limit is not None and limit > args.max_in_flight:
            print(
                f"adaptive-batcher gateway: {flag} {limit} is above --max-in-flight "
                f"{args.max_in_flight} (the most inside the engine whatever the limit); raise "
                "--max-in-flight",
                file=sys.stderr,
            )
            return 2
    if args.initial_limit is not None and args.fixed_limit is not None:
        print(
            "adaptive-batcher gateway: --initial-limit and --fixed-limit exclude each other (a "
            "fixed limit starts where it stays)",
            file=sys.stderr,
        )
        return 2
    if args.no_engine_metrics and args.metrics_url is not None:
        print(
            "adaptive-batcher gateway: --metrics-url and --no-engine-metrics exclude each other",
            file=sys.stderr,
        )
        return 2
    try:
        import uvicorn  # noqa: F401 - only to fail early, naming the extra

        from adaptive_batcher.gateway import app  # noqa: F401
    except ImportError as exc:
        print(missing_extra("adaptive-batcher gateway", exc), file=sys.stderr)
        return 2
    try:
        loop_factory = _loop_factory(args.loop)
    except ImportError:
        print("adaptive-batcher gateway: --loop uvloop needs uvloop installed", file=sys.stderr)
        return 2
    try:
        listener = _listen(args.host, args.port)
    except OSError as exc:
        print(
            f"adaptive-batcher gateway: cannot listen on {args.host}:{args.port}: {exc}",
            file=sys.stderr,
        )
        return 2
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_serve(args, listener))
    except _TerminatedError:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    return 0


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop's factory for ``--loop`` (None: asyncio's own).

    Raises:
        ImportError: ``uvloop`` asked for and not installed.
    """
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def gateway_controller(args: argparse.Namespace, slo: TokenSLO) -> TokenController | None:
    """The fixed-limit controller ``args`` ask for, or None (the gate's default, ours, with
    prefill pacing as ``args`` say)."""
    from adaptive_batcher.llm import StaticLimit, TokenController

    if args.fixed_limit is None:
        return None
    limit = args.fixed_limit
    return TokenController(
        slo,
        StaticLimit(limit),
        initial_limit=limit,
        max_limit=limit,
        max_queue=args.max_queue,
        pace_prefill=not args.no_prefill_pacing,
    )


class _TerminatedError(Exception):
    """SIGTERM arrived: uvicorn stops serving, then re-raises the signal, which this ends."""


def _stop(signum: int, frame: object) -> None:
    raise _TerminatedError


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (bound here, so the port is known before
    serving and a busy port is a clear error), with Nagle off on its connections."""
    from adaptive_batcher.gateway.listener import tcp_listener

    return tcp_listener(host, port)


async def _serve(args: argparse.Namespace, listener: socket.socket) -> None:
    import uvicorn

    from adaptive_batcher.gateway.app import gateway_app, gateway_lifespan
    from adaptive_batcher.gateway.openai import OpenAIEngine
    from adaptive_batcher.gateway.server import WRITE_GRACE_S, DrainingServer
    from adaptive_batcher.gateway.shell import LLMGate
    from adaptive_batcher.gateway.telemetry import PrometheusEngineTelemetry

    engine = OpenAIEngine(
        args.upstream,
        first_chunk_timeout_s=args.first_chunk_timeout_s,
        chunk_timeout_s=args.chunk_timeout_s,
    )
    telemetry = None
    if not args.no_engine_metrics:
        metrics_url = args.metrics_url or f"{args.upstream}/metrics"
        telemetry = PrometheusEngineTelemetry(metrics_url, interval_s=args.metrics_interval_s)
    slo = slo_of(args)
    controller = gateway_controller(args, slo)
    gate = LLMGate(
        engine,
        slo,
        controller=controller,
        telemetry=telemetry,
        max_in_flight=args.max_in_flight,
        initial_limit=args.initial_limit,
        pace_prefill=controller is not None or not args.no_prefill_pacing,
        max_queue=args.max_queue,
        name="gateway",
    )
    app = gateway_app(
        gate,
        max_body_bytes=args.max_body_bytes,
        engine=engine,
        process_metrics=True,
        upstream_health_path=None if args.no_upstream_health else args.upstream_health_path,
    )
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        # the gate's drain ends every stream first; this bounds a client too slow to take the
        # last event
        timeout_graceful_shutdown=math.ceil(args.drain_timeout_s) + WRITE_GRACE_S,
    )
    server = DrainingServer(config, gate, drain_timeout_s=args.drain_timeout_s)
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    try:
        async with gateway_lifespan(gate, drain_timeout_s=args.drain_timeout_s):
            print(
                f"adaptive-batcher gateway: serving on http://{shown}:{port}",
                file=sys.stderr,
                flush=True,
            )
            await server.serve(sockets=[listener])
    finally:
        await engine.aclose()
        if telemetry is not None:
            await telemetry.aclose()
        listener.close()
