"""Token workloads: when requests arrive, and how many prompt and output tokens each has.

* :func:`load_token_trace`: the Azure LLM inference traces of 2023 (Azure/AzurePublicDataset,
  CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024), whose rows carry ``ContextTokens`` and
  ``GeneratedTokens``, read with :func:`~adaptive_batcher.sim.traces.load_trace` and
  time-compressed to a chosen mean rate (the burst structure kept, the rate scaled).
* :func:`token_workload`: any open-loop arrival process of :mod:`adaptive_batcher.sim.workloads`
  (:class:`~adaptive_batcher.sim.workloads.Poisson`,
  :class:`~adaptive_batcher.sim.workloads.Steps`,
  :class:`~adaptive_batcher.sim.workloads.MMPPBursts`, ...) with lengths from a
  :class:`LengthSampler`: :class:`IndependentLengths` (e.g. lognormals) or
  :class:`TraceLengths` (prompt and output pairs drawn from a trace, their correlation kept).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from adaptive_batcher._validate import check_int, check_number, check_str
from adaptive_batcher.sim.traces import TRACE_DIR, find_trace, load_trace
from adaptive_batcher.sim.workloads import SizeSampler, Workload

__all__ = [
    "IndependentLengths",
    "LengthSampler",
    "TokenArrivals",
    "TraceLengths",
    "load_token_trace",
    "token_workload",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

PROMPT_COLUMN = "ContextTokens"
OUTPUT_COLUMN = "GeneratedTokens"


@dataclass(frozen=True, eq=False)
class TokenArrivals:
    """Requests with token counts: arrival times, prompt and output lengths.

    Args:
        times_s: arrival times, seconds from 0, sorted, float64 ``(n,)``.
        prompt_tokens: prompt lengths, ints >= 1, ``(n,)``.
        output_tokens: output lengths (tokens each request produces), ints >= 1, ``(n,)``.
        name: label.
        duration_s: the horizon, seconds (>= the last arrival; NaN: the last arrival).

    Raises:
        ValueError: shapes differ, times unsorted or negative, a length below 1.
    """

    times_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    name: str = "tokens"
    duration_s: float = math.nan

    def __post_init__(self) -> None:
        check_str("TokenArrivals.name", self.name)
        times = np.asarray(self.times_s, dtype=np.float64)
        prompt = np.asarray(self.prompt_tokens)
        output = np.asarray(self.output_tokens)
        if not (times.ndim == prompt.ndim == output.ndim == 1) or not (
            times.shape == prompt.shape == output.shape
        ):
            raise ValueError(
                "times_s, prompt_tokens and output_tokens must be 1-D of one length, got "
                f"shapes {times.shape}, {prompt.shape} and {output.shape}"
            )
        if times.size:
            if not np.all(np.isfinite(times)) or times[0] < 0:
                raise ValueError("times_s must be finite and >= 0")
            if np.any(times[1:] < times[:-1]):
                raise ValueError("times_s must be sorted (non-decreasing)")
            for name, values in (("prompt_tokens", prompt), ("output_tokens", output)):
                if not np.issubdtype(values.dtype, np.integer) or int(values.min()) < 1:
                    raise ValueError(f"{name} must be integers >= 1")
        last = float(times[-1]) if times.size else 0.0
        duration = last if math.isnan(self.duration_s) else float(self.duration_s)
        if not math.isfinite(duration) or duration < last:
            raise ValueError(
                f"duration_s must be finite and >= the last arrival ({last} s), got {duration}"
            )
        arrays: tuple[tuple[str, npt.NDArray[Any]], ...] = (
            ("times_s", times),
            ("prompt_tokens", prompt.astype(np.int64, copy=False)),
            ("output_tokens", output.astype(np.int64, copy=False)),
        )
        for name, values in arrays:
            view = values.view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)
        object.__setattr__(self, "duration_s", duration)

    def __len__(self) -> int:
        return int(self.times_s.size)

    @property
    def rate_rps(self) -> float:
        """Requests per second over ``duration_s`` (0 when empty)."""
        if not len(self):
            return 0.0
        return len(self) / self.duration_s if self.duration_s > 0 else math.inf

    def at_rate(self, rate_rps: float, name: str | None = None) -> TokenArrivals:
        """The same requests with time scaled so the mean rate is ``rate_rps`` (> 0)."""
        check_number("rate_rps", rate_rps, 0.0, strict=True)
        factor = self.rate_rps / rate_rps
        return TokenArrivals(
            self.times_s * factor,
            self.prompt_tokens,
            self.output_tokens,
            name if name is not None else f"{self.name} @ {rate_rps:g} rps",
            self.duration_s * factor,
        )

    def tiled(self, copies: int) -> TokenArrivals:
        """``copies`` back-to-back repeats (>= 1), each shifted by ``duration_s``."""
        check_int("copies", copies, 1)
        offsets = np.repeat(np.arange(copies) * self.duration_s, len(self))
        return TokenArrivals(
            np.tile(self.times_s, copies) + offsets,
            np.tile(self.prompt_tokens, copies),
            np.tile(self.output_tokens, copies),
            f"{self.name} x{copies}",
            self.duration_s * copies,
        )


def load_token_trace(
    name: str | os.PathLike[str],
    *,
    rate_rps: float | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_prompt: int | None = None,
    max_output: int | None = None,
    trace_dir: str | os.PathLike[str] | None = None,
) -> TokenArrivals:
    """An Azure-format trace (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``) as
    token arrivals.

    The window ``[start_s, start_s + duration_s)`` of the trace's own time is kept and
    re-based to 0, then time is compressed so its mean rate is ``rate_rps`` (None: as
    recorded).

    Args:
        name: a file path, or a trace name looked up in ``trace_dir`` (default
            :data:`~adaptive_batcher.sim.traces.TRACE_DIR`), e.g. ``"azure_llm_2023_conv"``.
        rate_rps: the mean rate wanted, requests/s (> 0), or None.
        start_s: the window's start, seconds of trace time.
        duration_s: the window's length, seconds of trace time (None: to the end).
        max_prompt: prompt lengths are clipped to this (None: not clipped).
        max_output: output lengths are clipped to this (None: not clipped).
        trace_dir: where a name is looked up.

    Raises:
        FileNotFoundError: no such trace.
        ValueError: as :func:`~adaptive_batcher.sim.traces.load_trace`; an empty window.
    """
    path = Path(name)
    if not path.is_file():
        found = find_trace(os.fspath(name), trace_dir)
        if found is None:
            raise FileNotFoundError(
                f"trace {os.fspath(name)!r} not found in {trace_dir or TRACE_DIR}"
            )
        path = found
    prompt = load_trace(
        path,
        start_s=start_s,
        duration_s=duration_s,
        size_column=PROMPT_COLUMN,
        max_units=max_prompt,
    )
    output = load_trace(
        path,
        start_s=start_s,
        duration_s=duration_s,
        size_column=OUTPUT_COLUMN,
        max_units=max_output,
    )
    if not len(prompt):
        raise ValueError(f"{path}: no requests in the window from {start_s} s")
    arrivals = TokenArrivals(
        prompt.times_s, prompt.sizes, output.sizes, path.stem, prompt.duration_s
    )
    return arrivals if rate_rps is None else arrivals.at_rate(rate_rps)


@runtime_checkable
class LengthSampler(Protocol):
    """``(n, rng) -> (prompt_tokens, output_tokens)``: ``n`` pairs of ints >= 1."""

    def __call__(self, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]: ...


@dataclass(frozen=True)
class IndependentLengths:
    """Prompt and output lengths drawn independently, each from a size sampler of
    :mod:`adaptive_batcher.sim.workloads` (e.g.
    :class:`~adaptive_batcher.sim.workloads.LognormalSizes`); prompts first."""

    prompt: SizeSampler
    output: SizeSampler

    def __call__(self, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        """``n`` pairs."""
        prompt = np.asarray(self.prompt(n, rng), dtype=np.int64)
        output = np.asarray(self.output(n, rng), dtype=np.int64)
        return np.maximum(prompt, 1), np.maximum(output, 1)


@dataclass(frozen=True, eq=False)
class TraceLengths:
    """(prompt, output) pairs drawn uniformly with replacement from recorded ones (a
    bootstrap of a trace's joint length distribution). Draws ``n`` integers.

    Raises:
        ValueError: empty or mismatched arrays.
    """

    prompt_tokens: IntArray
    output_tokens: IntArray

    def __post_init__(self) -> None:
        prompt = np.asarray(self.prompt_tokens, dtype=np.int64)
        output = np.asarray(self.output_tokens, dtype=np.int64)
        if prompt.ndim != 1 or prompt.shape != output.shape or not prompt.size:
            raise ValueError("prompt_tokens and output_tokens must be non-empty, of one length")
        object.__setattr__(self, "prompt_tokens", np.maximum(prompt, 1))
        object.__setattr__(self, "output_tokens", np.maximum(output, 1))

    @classmethod
    def of(cls, arrivals: TokenArrivals) -> TraceLengths:
        """The lengths of ``arrivals``."""
        return cls(np.asarray(arrivals.prompt_tokens), np.asarray(arrivals.output_tokens))

    def __call__(self, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        """``n`` pairs."""
        index = rng.integers(0, self.prompt_tokens.size, n)
        return self.prompt_tokens[index], self.output_tokens[index]


def token_workload(
    arrivals: Workload, lengths: LengthSampler, duration_s: float, rng: np.random.Generator
) -> TokenArrivals:
    """Arrival times from ``arrivals.generate(duration_s, rng)``, then lengths from
    ``lengths(n, rng)``: same generator state, same requests."""
    times = arrivals.generate(duration_s, rng)
    prompt, output = lengths(len(times), rng)
    return TokenArrivals(times.times_s, prompt, output, arrivals.name, times.duration_s)
