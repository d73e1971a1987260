"""Deprecated: moved to :mod:`adaptive_batcher.control.guards.unused_window` (the guards are a
package, one module a guard). Importing this module warns; it re-exports the same objects."""

import warnings

from adaptive_batcher.control.guards.unused_window import *  # noqa: F403
from adaptive_batcher.control.guards.unused_window import __all__  # noqa: F401

warnings.warn(
    "adaptive_batcher.control.unused_window moved to adaptive_batcher.control.guards.unused_window",
    DeprecationWarning,
    stacklevel=2,
)
