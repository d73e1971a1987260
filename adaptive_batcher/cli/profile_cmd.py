"""``adaptive-batcher profile``: placeholder until its issue lands."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``profile`` sub-command."""
    parser: argparse.ArgumentParser = subparsers.add_parser("profile", help="(not yet available)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    del args
    print("adaptive-batcher profile: not available in this version yet")
    return 2
