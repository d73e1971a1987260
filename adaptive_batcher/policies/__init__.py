"""Control laws over (window, cap) behind one interface, :class:`Policy`.

- :class:`Static`: fixed window and cap (today's Triton / Ray Serve / TorchServe behaviour).
- :class:`PID`: PID on the SLO latency error, window and cap in split range (the default when an
  SLO is set).
- :class:`AIMD`: Clipper's additive-increase / multiplicative-decrease of the cap.
- :class:`DiscountedUCB`, :class:`DiscountedThompson`: non-stationary bandits over a
  (window, cap) grid, sharing :class:`Bandit`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from adaptive_batcher.control.policy import Policy
from adaptive_batcher.policies.aimd import AIMD
from adaptive_batcher.policies.bandit import Bandit, DiscountedThompson, DiscountedUCB
from adaptive_batcher.policies.pid import PID
from adaptive_batcher.policies.static import Static

__all__ = [
    "AIMD",
    "PID",
    "REGISTRY",
    "Bandit",
    "DiscountedThompson",
    "DiscountedUCB",
    "Policy",
    "Static",
]

REGISTRY: Mapping[str, Any] = MappingProxyType(
    {cls.name: cls for cls in (AIMD, DiscountedThompson, DiscountedUCB, PID, Static)}
)
"""The policy classes by name (each class's ``name``), as presets select them; each class
lists the constructor arguments a preset may set in its ``parameters``."""
