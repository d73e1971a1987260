"""Token-level objectives of an LLM service: time to first token and time per output token.

A :class:`TokenSLO` is the LLM counterpart of :class:`~adaptive_batcher.slo.SLO`: the same
conventions (a percentile in [1, 100), milliseconds in the field names, exact messages), two
targets instead of one. :data:`TOKEN_SLO_PRESETS` holds the objectives published for common
services, each with its source; :func:`token_slo_preset` reads one by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import numpy as np
import numpy.typing as npt

from adaptive_batcher._validate import check_in_range, check_real, check_str
from adaptive_batcher.slo import check_measurable

__all__ = ["TOKEN_SLO_PRESETS", "TokenSLO", "TokenSLOPreset", "token_slo_preset"]


@dataclass(frozen=True, slots=True)
class TokenSLO:
    """A streaming request's objective: first token within ``ttft_ms`` and then one token
    every ``tpot_ms`` on average, at ``percentile``; optionally the whole answer within
    ``e2e_ms``.

    A request *meets* the SLO when its TTFT <= ``ttft_ms`` and its TPOT <= ``tpot_ms`` (and its
    end-to-end time <= ``e2e_ms`` when set); the SLO holds for a stream of requests when
    ``percentile`` of them meet each target (request goodput, DistServe's attainment; Zhong et
    al., OSDI 2024).

    Attributes:
        ttft_ms: time to first token, ms (> 0), from the request's arrival at the gate: time
            queued in front of the engine counts.
        tpot_ms: time per output token after the first, ms (> 0): ``(last token time - first
            token time) / (output tokens - 1)``, 0 for a one-token answer.
        percentile: the percentile both targets apply to, in [1, 100); 99 by default.
        e2e_ms: arrival to last token, ms (> 0), or None (no such target).
        margin: fraction of each target a controller aims at, in (0, 1] (0.9 by default).

    Every number is stored as a ``float``.

    Raises:
        TypeError: a field that is not a real number (the message names it).
        ValueError: a value out of range (the message names it and the range).
    """

    ttft_ms: float
    tpot_ms: float
    percentile: float = 99.0
    e2e_ms: float | None = None
    margin: float = 0.9

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = check_real(f"TokenSLO.{name}", getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"TokenSLO.{name} must be a finite number > 0, got {value!r}")
            check_measurable(f"TokenSLO.{name}", value)
            object.__setattr__(self, name, value)
        percentile = check_real("TokenSLO.percentile", self.percentile)
        if not 1.0 <= percentile < 100.0:
            raise ValueError(f"TokenSLO.percentile must be in [1, 100), got {percentile!r}")
        object.__setattr__(self, "percentile", percentile)
        if self.e2e_ms is not None:
            e2e = check_real("TokenSLO.e2e_ms", self.e2e_ms)
            if not (math.isfinite(e2e) and e2e > 0):
                raise ValueError(
                    f"TokenSLO.e2e_ms must be a finite number > 0 or None, got {e2e!r}"
                )
            object.__setattr__(self, "e2e_ms", e2e)
        margin = check_in_range("TokenSLO.margin", self.margin, 0.0, 1.0, open_low=True)
        object.__setattr__(self, "margin", margin)

    @property
    def ttft_s(self) -> float:
        """``ttft_ms`` in seconds."""
        return self.ttft_ms / 1e3

    @property
    def tpot_s(self) -> float:
        """``tpot_ms`` in seconds."""
        return self.tpot_ms / 1e3

    @property
    def e2e_s(self) -> float | None:
        """``e2e_ms`` in seconds, or None."""
        return None if self.e2e_ms is None else self.e2e_ms / 1e3

    @property
    def quantile(self) -> float:
        """The percentile as a fraction in (0, 1)."""
        return self.percentile / 100.0

    def meets(self, ttft_s: float, tpot_s: float, e2e_s: float | None = None) -> bool:
        """Whether one answered request meets every target (times in seconds; ``e2e_s`` is
        needed only when the SLO has ``e2e_ms``; None then counts as a miss)."""
        if not (ttft_s <= self.ttft_s and tpot_s <= self.tpot_s):
            return False
        limit = self.e2e_s
        return limit is None or (e2e_s is not None and e2e_s <= limit)

    def meets_many(
        self,
        ttft_s: npt.ArrayLike,
        tpot_s: npt.ArrayLike,
        e2e_s: npt.ArrayLike | None = None,
    ) -> npt.NDArray[np.bool_]:
        """:meth:`meets` for arrays of answered requests (seconds; NaN is a miss)."""
        ok = (np.asarray(ttft_s, dtype=np.float64) <= self.ttft_s) & (
            np.asarray(tpot_s, dtype=np.float64) <= self.tpot_s
        )
        limit = self.e2e_s
        if limit is not None:
            if e2e_s is None:
                return np.zeros_like(ok)
            ok &= np.asarray(e2e_s, dtype=np.float64) <= limit
        return ok


@dataclass(frozen=True, slots=True)
class TokenSLOPreset:
    """A named objective with the source it comes from.

    Attributes:
        name: the key in :data:`TOKEN_SLO_PRESETS`.
        slo: the objective.
        source: where the targets come from, in words.
    """

    name: str
    slo: TokenSLO
    source: str


def _presets() -> Mapping[str, TokenSLOPreset]:
    entries = [
        TokenSLOPreset(
            "chat",
            TokenSLO(ttft_ms=300.0, tpot_ms=50.0),
            "first token within ~300 ms for a chatbot (the source article of the project); "
            "50 ms per token (20 tokens/s, several times reading speed) is the chat target of "
            "the project's LLM benchmarks",
        ),
        TokenSLOPreset(
            "chat_distserve",
            TokenSLO(ttft_ms=250.0, tpot_ms=100.0),
            "DistServe's chatbot SLO, OPT-13B on ShareGPT: TTFT 0.25 s, TPOT 0.1 s (Zhong et "
            "al., DistServe, OSDI 2024)",
        ),
        TokenSLOPreset(
            "code_completion",
            TokenSLO(ttft_ms=125.0, tpot_ms=200.0),
            "DistServe's code-completion SLO, HumanEval: TTFT 0.125 s, TPOT 0.2 s (Zhong et al., "
            "DistServe, OSDI 2024)",
        ),
        TokenSLOPreset(
            "search",
            TokenSLO(ttft_ms=300.0, tpot_ms=100.0),
            "search must show its first feedback within ~300 ms (the source article); 100 ms "
            "per token (10 tokens/s, about reading speed) is assumed",
        ),
        TokenSLOPreset(
            "summarisation",
            TokenSLO(ttft_ms=15_000.0, tpot_ms=150.0),
            "DistServe's summarisation SLO, LongBench: TTFT 15 s, TPOT 0.15 s (Zhong et al., "
            "DistServe, OSDI 2024)",
        ),
    ]
    return MappingProxyType({p.name: p for p in entries})


TOKEN_SLO_PRESETS: Final[Mapping[str, TokenSLOPreset]] = _presets()
"""The shipped objectives by name: ``chat`` (300 ms / 50 ms), ``chat_distserve`` (250 / 100),
``code_completion`` (125 / 200), ``search`` (300 / 100), ``summarisation`` (15 s / 150 ms);
TTFT / TPOT at p99. Each entry's ``source`` says where its figures come from."""


def token_slo_preset(name: str) -> TokenSLO:
    """The objective of the preset ``name`` (a key of :data:`TOKEN_SLO_PRESETS`).

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: no such preset (the message lists the names).
    """
    check_str("name", name)
    preset = TOKEN_SLO_PRESETS.get(name)
    if preset is None:
        listed = ", ".join(repr(n) for n in TOKEN_SLO_PRESETS)
        raise ValueError(f"name must be one of {listed}, got {name!r}")
    return preset.slo
