"""The libraries of the ``cli`` extra (rich, matplotlib, kneed), imported only where used.

The core (batcher, controller, simulator, profile files) needs none of them; the command line,
the profiler's progress bar, knee and plot, and the simulator's plots do. Those import them
through :func:`require`, which turns a missing library into an ``ImportError`` that names the
extra: ``plot_profile needs matplotlib (the cli extra): pip install "adaptive-batcher[cli]"``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from types import ModuleType
from typing import Any, Final

__all__ = ["CLI_MODULES", "INSTALL_CLI", "agg_figure", "missing", "require"]

CLI_MODULES: Final = ("rich", "matplotlib", "kneed")
"""The top-level modules the ``cli`` extra installs."""

INSTALL_CLI: Final = 'pip install "adaptive-batcher[cli]"'
"""The command that installs them."""


def require(module: str, needed_by: str) -> ModuleType:
    """``importlib.import_module(module)``.

    Args:
        module: a module of the ``cli`` extra, e.g. ``"kneed"`` or ``"matplotlib.figure"``.
        needed_by: what needs it, for the message (``"find_knee (Kneedle)"``).

    Raises:
        ImportError: the library is missing (or fails to import; the original error is the
            cause): ``<needed_by> needs <library> (the cli extra): pip install
            "adaptive-batcher[cli]"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        library = module.partition(".")[0]
        raise ImportError(
            f"{needed_by} needs {library} (the cli extra): {INSTALL_CLI}", name=library
        ) from exc


def missing(modules: Iterable[str] = CLI_MODULES) -> list[str]:
    """The ``modules`` that cannot be found (``importlib.util.find_spec``), in order; nothing is
    imported, so the check is cheap."""
    absent: list[str] = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a blocking finder, or a None entry in sys.modules
            found = False
        if not found:
            absent.append(module)
    return absent


def agg_figure(needed_by: str, **figure_kwargs: Any) -> Any:
    """A ``matplotlib.figure.Figure(**figure_kwargs)`` on its own ``FigureCanvasAgg``: no pyplot,
    so no global backend or figure state (safe in servers, threads and tests); PNGs need no
    screen.

    Raises:
        ImportError: matplotlib is missing (message as :func:`require`).
    """
    figure_module = require("matplotlib.figure", needed_by)
    backend = require("matplotlib.backends.backend_agg", needed_by)
    figure = figure_module.Figure(**figure_kwargs)
    backend.FigureCanvasAgg(figure)
    return figure
