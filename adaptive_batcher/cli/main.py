"""Entry point of the ``adaptive-batcher`` command.

Each sub-command lives in its own module with ``register(subparsers)``, which adds its parser and
sets ``func`` (``func(args) -> int`` exit status).

The command needs the ``cli`` extra (rich, matplotlib, kneed); without it, :func:`main` prints
``pip install "adaptive-batcher[cli]"`` and the missing libraries on stderr and returns 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import MutableMapping, Sequence
from typing import Any

import structlog

from adaptive_batcher._optional import CLI_MODULES, INSTALL_CLI, missing

__all__ = ["build_parser", "main"]

_COMMANDS = ("demo", "gateway", "profile", "replay")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="adaptive-batcher",
        description="A dynamic batcher for ML inference whose window and batch cap tune "
        "themselves. Run a sub-command with --help for its options.",
    )
    _add_log_level(parser, "warning")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMANDS:
        module = importlib.import_module(f"adaptive_batcher.cli.{name}_cmd")
        module.register(subparsers)
    for command in subparsers.choices.values():  # also after the command: it wins when given
        _add_log_level(command, argparse.SUPPRESS)
    return parser


def _add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-level",
        default=default,
        choices=["debug", "info", "warning", "error"],
        help="show library log events at this level and above (default: warning)",
    )


REPORTED_BY_THE_COMMANDS = frozenset({"profile.noisy"})
"""Library events a command prints in its own words (``warning: ...``): not logged twice."""


def _drop_reported(logger: object, method: str, event: MutableMapping[str, Any]) -> Any:
    """A structlog processor: drops the events in :data:`REPORTED_BY_THE_COMMANDS`."""
    if event.get("event") in REPORTED_BY_THE_COMMANDS:
        raise structlog.DropEvent
    return event


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 without the ``cli`` extra)."""
    absent = missing(CLI_MODULES)
    if absent:
        print(
            f"adaptive-batcher: the command line needs the cli extra (missing: "
            f"{', '.join(absent)}): {INSTALL_CLI}",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    # the command line is an application: it, not the library, decides what gets logged
    level = logging.getLevelNamesMapping()[args.log_level.upper()]
    processors = [p for p in structlog.get_config()["processors"] if p is not _drop_reported]
    structlog.configure(
        processors=[_drop_reported, *processors],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),  # keep stdout for reports
    )
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT, no traceback
        print(f"adaptive-batcher {args.command}: interrupted", file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":
    raise SystemExit(main())
