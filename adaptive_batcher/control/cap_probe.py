"""Deprecated: moved to :mod:`adaptive_batcher.control.guards.cap_probe` (the guards are a
package, one module a guard). Importing this module warns; it re-exports the same objects."""

import warnings

from adaptive_batcher.control.guards.cap_probe import *  # noqa: F403
from adaptive_batcher.control.guards.cap_probe import __all__  # noqa: F401

warnings.warn(
    "adaptive_batcher.control.cap_probe moved to adaptive_batcher.control.guards.cap_probe",
    DeprecationWarning,
    stacklevel=2,
)
