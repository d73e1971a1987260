"""Service-time and memory models for the simulator: how long a batch takes, how much it holds.

A batch is measured in *units*: items (rows, images, sequences) or tokens, whatever the engine's
size function counts. Every model answers two questions:

- ``service_s(units, rng)``: seconds the model takes for one batch of ``units`` (>= 1). All
  randomness comes from the passed :class:`numpy.random.Generator`, so a replay with the same
  seed is identical.
- ``memory_bytes(units)``: peak device memory while such a batch runs, in bytes, weights included
  (``units == 0``: the idle footprint); NaN when the model does not know.

Models:

- :class:`LinearService`: ``fixed_s + per_unit_s * units`` (the ``a*n + b`` fit of BentoML's
  adaptive batching dispatcher, which refits it over its last 50 batches).
- :class:`TableService`: linear interpolation in a measured table, e.g. the shipped H200 tables
  (:meth:`TableService.from_h200`) or a file from ``adaptive-batcher profile``
  (:meth:`TableService.from_profile_json`).
- :class:`Noisy`: multiplies another model's time by a lognormal factor with mean 1.
- :class:`Stalls`: adds a heavy-tailed stall to a fraction of another model's batches.
- :class:`ColdShapes`: the first call at each new batch size pays a one-off cost (GPU algorithm
  selection; on one NVIDIA H200, measured by this project with resnet50, bf16, eager, cold shapes
  put p99 at 100-970 ms).

:class:`MemoryLimit` is the device's capacity over time (with "squeezes": another tenant takes
memory at a given time), to decide out-of-memory batches and report free memory.
"""

from __future__ import annotations

import math
import numbers
import os
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from adaptive_batcher._validate import (
    MAX_SERVICE_S,
    check_batch_time,
    check_in_range,
    check_int,
    check_ints,
    check_number,
    check_real,
)
from adaptive_batcher.profile.format import load_profile
from adaptive_batcher.sim.measured_tables import MIB, Row, load_h200_table

__all__ = [
    "H200_MODELS",
    "MAX_NOISE_CV",
    "ColdShapes",
    "LinearService",
    "MemoryLimit",
    "Noisy",
    "ServiceModel",
    "Spikes",
    "Stalls",
    "TableService",
]

H200_MODELS: Final = ("resnet50", "bert_base_seq128", "llama_1b_decode", "llama_1b_prefill")
"""Model names accepted by :meth:`TableService.from_h200`."""

MAX_NOISE_CV: Final = 10.0
"""The largest ``cv`` :class:`Noisy` accepts (see its Raises)."""


@runtime_checkable
class ServiceModel(Protocol):
    """The simulated device's true service time, s: what the simulator asks of a service model.

    Not the controller's :class:`~adaptive_batcher.control.ServiceTimeEstimator` (its online
    estimate, in ms, learnt from the batches it sees).

    ``name`` identifies the model in reports. ``service_s`` returns seconds (> 0 for every model
    here) for a batch of ``units`` >= 1 and raises ValueError for ``units`` < 1. The simulator
    refuses a time that is not a finite number in [0, ``MAX_SERVICE_S``] (1e5 s; see
    :func:`check_service_time`).
    ``memory_bytes`` returns the peak memory in bytes of a batch of ``units`` >= 0 (0: idle), or
    NaN when unknown, and raises ValueError for ``units`` < 0.
    """

    @property
    def name(self) -> str: ...

    def service_s(self, units: int, rng: np.random.Generator) -> float: ...

    def memory_bytes(self, units: int) -> float: ...


def check_service_model(name: str, value: object) -> ServiceModel:
    """``value`` if it is a :class:`ServiceModel` instance (the simulator's service, a wrapper's
    inner model), else TypeError naming ``name``; a class given for an instance
    (``Noisy(TableService)``) is told so: ``inner must be an instance of TableService, got the
    class`` (a class has the members a :class:`ServiceModel` needs, and would fail only when run).
    """
    if isinstance(value, type):
        raise TypeError(f"{name} must be an instance of {value.__name__}, got the class")
    if not isinstance(value, ServiceModel):
        raise TypeError(
            f"{name} must be a ServiceModel (name, service_s, memory_bytes; e.g. a "
            f"TableService), got {type(value).__name__}"
        )
    return value


def check_service_time(model: ServiceModel, units: int, value: object) -> float:
    """``value``, the seconds ``model.service_s`` returned for a batch of ``units``, as a float
    if it is a finite number >= 0; else TypeError (not a number) or ValueError naming the model,
    the batch size and the value, e.g. ``service model 'linear' returned nan s for a batch of
    64 units; service_s must return a finite number >= 0``; likewise a time above
    ``MAX_SERVICE_S`` (1e5 s). (A NaN time would otherwise stall a replay's clock forever, a
    negative one turn latencies negative, an infinite one lose every request, one from ~1e302 s
    overflow the latency histogram.)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"service model {model.name!r} returned a {type(value).__name__} for a batch of "
            f"{units} units; service_s must return a number of seconds"
        )
    seconds = float(value)
    if not 0.0 <= seconds < math.inf:
        raise ValueError(
            f"service model {model.name!r} returned {value!r} s for a batch of {units} units; "
            "service_s must return a finite number >= 0"
        )
    if seconds > MAX_SERVICE_S:
        raise ValueError(
            f"service model {model.name!r} returned {value!r} s for a batch of {units} units; "
            f"service_s must return at most {MAX_SERVICE_S:g} s (MAX_SERVICE_S)"
        )
    return seconds


def _check_batch(units: int) -> None:
    check_int("units", units, 1)


def _check_memory_units(units: int) -> None:
    check_int("units", units, 0)


def _check_sizes(name: str, sizes: Iterable[int]) -> tuple[int, ...]:
    """Batch sizes given warm (:class:`ColdShapes`' ``warmed`` and :meth:`ColdShapes.warm`)."""
    return check_ints(name, sizes, 1, empty=True)


def _check_nonnegative(name: str, value: float, *, allow_nan: bool = False) -> None:
    if not (allow_nan and math.isnan(check_real(name, value))):
        check_number(name, value, 0.0)


@dataclass(frozen=True, slots=True)
class LinearService:
    """Service time ``fixed_s + per_unit_s * units`` seconds, memory likewise in bytes.

    Deterministic: ``rng`` is not used (wrap it in :class:`Noisy` for variation). The linear form
    is the ``duration = a*n + b`` fit of BentoML's adaptive batching dispatcher (refitted over
    its last 50 batches); it misses the flat launch-bound start measured on GPUs, for which use
    :class:`TableService`.

    Args:
        fixed_s: seconds per batch whatever its size (>= 0).
        per_unit_s: seconds per unit (>= 0).
        memory_fixed_bytes: resident bytes (weights, workspace); NaN (default) when unknown.
        memory_per_unit_bytes: bytes per unit of the batch; NaN (default) when unknown.
        name: the model's name in reports.

    Raises:
        TypeError: a figure that is not a number.
        ValueError: a time is negative, not finite or above ``MAX_SERVICE_S`` (1e5 s), or a
            memory figure is negative or infinite.
    """

    fixed_s: float
    per_unit_s: float
    memory_fixed_bytes: float = math.nan
    memory_per_unit_bytes: float = math.nan
    name: str = "linear"

    def __post_init__(self) -> None:
        check_batch_time("fixed_s", self.fixed_s)
        check_batch_time("per_unit_s", self.per_unit_s)
        _check_nonnegative("memory_fixed_bytes", self.memory_fixed_bytes, allow_nan=True)
        _check_nonnegative("memory_per_unit_bytes", self.memory_per_unit_bytes, allow_nan=True)

    def service_s(self, units: int, rng: np.random.Generator) -> float:
        """Seconds for a batch of ``units`` (>= 1, else ValueError)."""
        _check_batch(units)
        return self.fixed_s + self.per_unit_s * units

    def memory_bytes(self, units: int) -> float:
        """Bytes for a batch of ``units`` (>= 0, else ValueError); NaN if either figure is NaN."""
        _check_memory_units(units)
        return self.memory_fixed_bytes + self.memory_per_unit_bytes * units


def _as_table(
    values: Any, what: str, n: int | None, maximum: float = math.inf
) -> npt.NDArray[np.float64]:
    array = np.array(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{what} must be a non-empty 1-D sequence, got shape {array.shape}")
    if n is not None and array.size != n:
        raise ValueError(f"{what} must have {n} values (one per size), got {array.size}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{what} must be finite numbers >= 0, got {array.tolist()}")
    if np.any(array > maximum):
        raise ValueError(
            f"{what} must be at most {maximum:g} s (MAX_SERVICE_S), got {array.tolist()}"
        )
    array.flags.writeable = False
    return array


class TableService:
    """Service time and memory interpolated in a table measured at a few batch sizes.

    Between two measured sizes the value is interpolated linearly (:func:`numpy.interp`). Below
    the smallest size it is flat (the smallest size's value). Beyond the largest size it is
    extrapolated along the line through the last two points, but never below the last value (a
    falling last segment extrapolates flat); a one-row table is flat everywhere. Memory follows
    the same rule; ``memory_bytes(0)`` (idle) is the smallest size's value, an overestimate of
    the idle footprint since the table does not measure it. Deterministic: ``rng`` is not used.
    Results are memoised per ``units``.

    Args:
        sizes: measured batch sizes in units, 1-D, strictly increasing integers >= 1.
        latencies_s: seconds per batch at each size, same shape, finite, in [0,
            ``MAX_SERVICE_S``] (1e5 s).
        memory_bytes: peak bytes at each size, same shape, finite and >= 0; None when unknown
            (then :meth:`memory_bytes` returns NaN).
        name: the model's name in reports.

    Raises:
        ValueError: empty or mismatched arrays, sizes not strictly increasing integers >= 1,
            negative or non-finite values, latencies above ``MAX_SERVICE_S``.
    """

    __slots__ = (
        "_cache_mem",
        "_cache_s",
        "_name",
        "_xs",
        "latencies_s",
        "memory_table_bytes",
        "sizes",
    )

    def __init__(
        self,
        sizes: Sequence[int] | npt.ArrayLike,
        latencies_s: Sequence[float] | npt.ArrayLike,
        memory_bytes: Sequence[float] | npt.ArrayLike | None = None,
        *,
        name: str = "table",
    ) -> None:
        size_values = _as_table(sizes, "sizes", None)
        if np.any(size_values < 1) or np.any(size_values != np.round(size_values)):
            raise ValueError(f"sizes must be ints >= 1, got {size_values.tolist()}")
        if np.any(np.diff(size_values) <= 0):
            raise ValueError(f"sizes must be strictly increasing, got {size_values.tolist()}")
        self._xs = size_values
        sizes_int = size_values.astype(np.int64)
        sizes_int.flags.writeable = False
        self.sizes: npt.NDArray[np.int64] = sizes_int
        """Measured batch sizes in units, int64, shape (n,), read-only."""
        self.latencies_s: npt.NDArray[np.float64] = _as_table(
            latencies_s, "latencies_s", size_values.size, MAX_SERVICE_S
        )
        """Seconds per batch at each size, float64, shape (n,), read-only."""
        self.memory_table_bytes: npt.NDArray[np.float64] | None = (
            None
            if memory_bytes is None
            else _as_table(memory_bytes, "memory_bytes", size_values.size)
        )
        """Peak bytes at each size, float64, shape (n,), read-only; None when unknown."""
        self._name = name
        self._cache_s: dict[int, float] = {}
        self._cache_mem: dict[int, float] = {}

    @property
    def name(self) -> str:
        """The model's name in reports."""
        return self._name

    def __repr__(self) -> str:
        return (
            f"TableService(name={self._name!r}, sizes={self.sizes.tolist()}, "
            f"memory={'known' if self.memory_table_bytes is not None else 'unknown'})"
        )

    def service_s(self, units: int, rng: np.random.Generator) -> float:
        """Seconds for a batch of ``units`` (>= 1, else ValueError), interpolated."""
        cached = self._cache_s.get(units)
        if cached is not None:
            return cached
        _check_batch(units)
        value = _interpolate(float(units), self._xs, self.latencies_s)
        self._cache_s[units] = value
        return value

    def memory_bytes(self, units: int) -> float:
        """Peak bytes for a batch of ``units`` (>= 0, else ValueError); NaN when unknown."""
        if self.memory_table_bytes is None:
            _check_memory_units(units)
            return math.nan
        cached = self._cache_mem.get(units)
        if cached is not None:
            return cached
        _check_memory_units(units)
        value = _interpolate(float(units), self._xs, self.memory_table_bytes)
        self._cache_mem[units] = value
        return value

    @classmethod
    def from_h200(cls, model: str) -> TableService:
        """A table measured on one NVIDIA H200 (shipped in ``adaptive_batcher/data/h200/``).

        PyTorch 2.11.0+cu130, bf16 eager, random weights, median of 20 calls after 3 warm-up
        calls; memory is the peak allocated, weights included (``peak_mib`` x 2**20 bytes).

        Args:
            model: one of :data:`H200_MODELS`:

                - ``"resnet50"``, ``"bert_base_seq128"``: ``batch_profile.csv`` (``median_ms``,
                  ``peak_mib``), units = images / sequences of 128 tokens, sizes 1..512. E.g.
                  resnet50 at 256 takes 16.651 ms. Below ~64 the times are launch-bound and not
                  monotone (resnet50 batch 2: 6.284 ms, batch 4: 3.881 ms), kept as measured.
                - ``"llama_1b_decode"``: ``decoder_profile.csv`` phase ``decode``: one decode
                  step of a Llama-shaped 1.2B decoder with a 512-token KV cache; units =
                  sequences, sizes 1..256 (49-55 ms).
                - ``"llama_1b_prefill"``: phase ``prefill``: a 512-token prompt per sequence;
                  units = sequences, sizes 2..256. The batch-1 row (988.776 ms) is dropped: it is
                  a cold first call (batch 2 takes 61.006 ms), so below 2 the table is flat at
                  batch 2's value.

        Raises:
            ValueError: an unknown model name.
        """
        if model in ("resnet50", "bert_base_seq128"):
            rows = [r for r in load_h200_table("batch_profile") if r["model"] == model]
            return cls._from_rows(rows, "batch", "median_ms", f"h200:{model}")
        if model in ("llama_1b_decode", "llama_1b_prefill"):
            phase = model.removeprefix("llama_1b_")
            rows = [
                r
                for r in load_h200_table("decoder_profile")
                if r["model"] == "llama_1b" and r["phase"] == phase
            ]
            if phase == "prefill":
                rows = [r for r in rows if float(r["batch"]) != 1]  # cold outlier, see docstring
            return cls._from_rows(rows, "batch", "median_ms", f"h200:{model}")
        raise ValueError(f"unknown H200 model {model!r}; available: {', '.join(H200_MODELS)}")

    @classmethod
    def _from_rows(cls, rows: list[Row], size_key: str, ms_key: str, name: str) -> TableService:
        ordered = sorted(rows, key=lambda r: float(r[size_key]))
        return cls(
            [int(float(r[size_key])) for r in ordered],
            [float(r[ms_key]) / 1e3 for r in ordered],
            [float(r["peak_mib"]) * MIB for r in ordered],
            name=name,
        )

    @classmethod
    def from_profile_json(
        cls, path: str | os.PathLike[str], *, name: str | None = None
    ) -> TableService:
        """A table from a profile written by ``adaptive-batcher profile`` (JSON).

        The file is read by the profiler's own reader,
        :func:`adaptive_batcher.profile.format.load_profile` (schema
        ``adaptive_batcher.profile/1``, :data:`adaptive_batcher.profile.format.SCHEMA`), so
        the simulator accepts exactly the files the profiler writes. Service time is a row's
        ``median_ms / 1000``; memory is its ``peak_mem_bytes``, unknown (NaN) unless every row
        has one.

        Args:
            path: the JSON file.
            name: the model's name in reports; default the file's ``"model"`` value, or
                ``"profile:<file name>"`` when that is empty.

        Raises:
            OSError: the file cannot be read (FileNotFoundError when absent).
            ProfileFormatError: (a ValueError) not UTF-8 JSON, another schema, or a missing or
                bad key; the message starts with the path and names the key, e.g.
                ``p.json: key 'rows[1].median_ms': must be a number, got a string``.
        """
        result, _ = load_profile(path)
        peaks = [row.peak_mem_bytes for row in result.rows]
        memory = None if None in peaks else [float(peak or 0) for peak in peaks]
        if name is None:
            name = result.model_name or f"profile:{Path(path).name}"
        return cls(
            [row.batch_size for row in result.rows],
            [row.median_ms / 1e3 for row in result.rows],
            memory,
            name=name,
        )


def _interpolate(x: float, xs: npt.NDArray[np.float64], ys: npt.NDArray[np.float64]) -> float:
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        if xs.size == 1:
            return float(ys[-1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + max(float(slope), 0.0) * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def _set_float(model: object, name: str, value: float) -> None:
    """Store a field of a frozen model as the float its check returned: a ``Fraction``,
    numpy scalar or int given for it reads (``name``, ``repr``) and computes as that float."""
    object.__setattr__(model, name, value)


class _Wrapper:
    """A service model around another (``inner``): its memory is the inner model's."""

    __slots__ = ()
    inner: ServiceModel

    def memory_bytes(self, units: int) -> float:
        """The inner model's peak bytes (NaN when unknown)."""
        return self.inner.memory_bytes(units)


@dataclass(frozen=True, slots=True)
class Noisy(_Wrapper):
    """Another model's service time times a lognormal factor with mean 1 and CV ``cv``.

    The factor is ``exp(N(mu, sigma))`` with ``sigma**2 = ln(1 + cv**2)`` and
    ``mu = -sigma**2 / 2``, so its mean is exactly 1 and its coefficient of variation ``cv``
    (moments of the lognormal distribution). Each call draws one normal from ``rng`` after the
    inner model's draws; with ``cv == 0`` nothing is drawn. Memory is the inner model's.

    Args:
        inner: the model whose time is perturbed.
        cv: coefficient of variation of the factor, in [0, :data:`MAX_NOISE_CV`]; 0.05 is the
            default, the order of the p90/median spread of the H200 tables at large batches
            (resnet50 at 256: 16.678 / 16.651 ms; bert at 512: 29.238 / 27.825 ms).

    Raises:
        TypeError: ``inner`` not a :class:`ServiceModel` instance (a class given for one too),
            ``cv`` not a number.
        ValueError: ``cv`` outside [0, 10] (NaN too). The bound keeps the factor finite and
            meaningful: at cv 10 (sigma 2.15, mu -2.31) the median batch already takes a tenth
            of the inner time, and the factor could overflow only for a normal draw above 330.
            Larger cvs only make the factor more degenerate (at cv 1e6 the median is 1e-6 of
            the inner time), and from cv ~1.3e154 ``cv**2`` overflows: sigma is infinite and
            every factor NaN.
    """

    inner: ServiceModel
    cv: float = 0.05
    _mu: float = field(init=False, repr=False, compare=False)
    _sigma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_service_model("inner", self.inner)
        _set_float(self, "cv", check_in_range("cv", self.cv, 0.0, MAX_NOISE_CV))
        sigma = math.sqrt(math.log1p(self.cv * self.cv))
        object.__setattr__(self, "_sigma", sigma)
        object.__setattr__(self, "_mu", -0.5 * sigma * sigma)

    @property
    def name(self) -> str:
        """``noisy(<inner>, cv=<cv>)``."""
        return f"noisy({self.inner.name}, cv={self.cv:g})"

    def service_s(self, units: int, rng: np.random.Generator) -> float:
        """Seconds for a batch of ``units`` (>= 1, else ValueError): inner time x factor."""
        base = self.inner.service_s(units, rng)
        if self._sigma == 0.0:
            return base
        return base * math.exp(self._mu + self._sigma * float(rng.standard_normal()))


@dataclass(frozen=True)
class Stalls(_Wrapper):
    """Another model's service time, plus a heavy-tailed stall on a fraction of the batches.

    With probability ``probability`` a batch stalls for ``scale_s * (1 + L)`` more seconds,
    where ``L`` is Lomax (Pareto II) distributed with shape ``alpha`` (numpy's ``pareto``): a
    tail that falls as ``x ** -alpha``, so with ``alpha`` near 1.5 the mean stall is
    ``scale_s * alpha / (alpha - 1)`` = 3 scales and one stall in a hundred exceeds about
    ``22 * scale_s``. It stands for what a batch's own work cannot explain: a garbage-collector
    pause, a page fault storm, another tenant's kernel, a preempted worker thread. Each call
    draws one uniform (and, for a stall, one Lomax) from ``rng`` after the inner model's draws.

    Args:
        inner: the model whose times stall.
        probability: share of batches that stall, in [0, 1].
        scale_s: the stall's scale, seconds (> 0, at most ``MAX_SERVICE_S``).
        alpha: the tail's shape (> 1: a finite mean).

    Raises:
        TypeError: ``inner`` not a :class:`ServiceModel` instance (a class given for one too),
            another argument that is not a number.
        ValueError: an argument out of range.
    """

    inner: ServiceModel
    probability: float = 0.05
    scale_s: float = 0.01
    alpha: float = 1.5

    def __post_init__(self) -> None:
        check_service_model("inner", self.inner)
        _set_float(self, "probability", check_in_range("probability", self.probability, 0.0, 1.0))
        _set_float(self, "scale_s", check_batch_time("scale_s", self.scale_s, strict=True))
        _set_float(self, "alpha", check_number("alpha", self.alpha, 1.0, strict=True))

    @property
    def name(self) -> str:
        """``stalls(<inner>, p=<probability>, scale=<ms> ms, alpha=<alpha>)``."""
        return (
            f"stalls({self.inner.name}, p={self.probability:g}, "
            f"scale={self.scale_s * 1e3:g} ms, alpha={self.alpha:g})"
        )

    def service_s(self, units: int, rng: np.random.Generator) -> float:
        """Seconds for a batch of ``units`` (>= 1): the inner time, plus a stall at times."""
        base = self.inner.service_s(units, rng)
        if float(rng.random()) >= self.probability:
            return base
        return base + self.scale_s * (1.0 + float(rng.pareto(self.alpha)))


@dataclass(frozen=True)
class Spikes(_Wrapper):
    """Another model's service time, ``factor`` times longer on a fraction of the batches.

    Unlike :class:`Stalls` (a pause added whatever the batch), a spike scales with the batch's
    own work: a clock throttled down, another tenant's kernels interleaved with this one's, a
    batch evicted from the cache. A smaller batch escapes part of it, so the right window
    differs: against spikes, fewer batches meet fewer of them, but each lasts longer. Each call
    draws one uniform from ``rng`` after the inner model's draws.

    Args:
        inner: the model whose times spike.
        probability: share of batches that spike, in [0, 1].
        factor: how many times longer a spiking batch runs, in [1, 1000].

    Raises:
        TypeError: ``inner`` not a :class:`ServiceModel` instance (a class given for one too),
            another argument that is not a number.
        ValueError: an argument out of range.
    """

    inner: ServiceModel
    probability: float = 0.05
    factor: float = 10.0

    def __post_init__(self) -> None:
        check_service_model("inner", self.inner)
        _set_float(self, "probability", check_in_range("probability", self.probability, 0.0, 1.0))
        _set_float(self, "factor", check_in_range("factor", self.factor, 1.0, 1000.0))

    @property
    def name(self) -> str:
        """``spikes(<inner>, p=<probability>, x<factor>)``."""
        return f"spikes({self.inner.name}, p={self.probability:g}, x{self.factor:g})"

    def service_s(self, units: int, rng: np.random.Generator) -> float:
        """Seconds for a batch of ``units`` (>= 1): the inner time, ``factor`` times at times."""
        base = self.inner.service_s(units, rng)
        return base * self.factor if float(rng.random()) < self.probability else base


class ColdShapes(_Wrapper):
    """Adds ``cold_s`` to the first call at each batch size not seen (or warmed) before.

    On GPUs the first call at a new input shape selects kernels/algorithms: on an H200 cold
    shapes put p99 at 100-970 ms in every execution mode, while warmed shapes gave p99
    11-14 ms (measured by this project: resnet50, bf16, eager, the same load served with and
    without warmed shapes, in each execution mode). The default
    0.3 s lies in that range. Stateful: each instance remembers the sizes it has run; use one
    instance per simulated replica and :meth:`reset` between replays. Memory is the inner
    model's; ``rng`` is passed to the inner model only.

    Args:
        inner: the warm model.
        cold_s: extra seconds on a size's first call (>= 0).
        warmed: sizes already warm at the start (and after :meth:`reset`), e.g. the buckets a
            ``warmup()`` ran.

    Raises:
        TypeError: ``inner`` not a :class:`ServiceModel` instance (a class given for one too),
            ``cold_s`` not a number, ``warmed`` not a sequence of ints.
        ValueError: ``cold_s`` negative, not finite or above ``MAX_SERVICE_S``, a warmed size < 1.
    """

    __slots__ = ("_initial", "_seen", "cold_s", "inner")

    def __init__(
        self, inner: ServiceModel, cold_s: float = 0.3, warmed: Iterable[int] = ()
    ) -> None:
        self.inner = check_service_model("inner", inner)
        check_batch_time("cold_s", cold_s)
        initial = frozenset(_check_sizes("warmed", warmed))
        self.cold_s = float(cold_s)
        self._initial = initial
        self._seen: set[int] = set(initial)

    @property
    def name(self) -> str:
        """``cold(<inner>, +<cold_s>s)``."""
        return f"cold({self.inner.name}, +{self.cold_s:g}s)"

    @property
    def warm_sizes(self) -> frozenset[int]:
        """The sizes that run without the cold cost now."""
        return frozenset(self._seen)

    def is_warm(self, units: int) -> bool:
        """True when a batch of ``units`` would not pay ``cold_s``."""
        return units in self._seen

    def warm(self, sizes: Iterable[int]) -> None:
        """Mark ``sizes`` warm, as a ``warmup()`` that runs them once would (no time passes).

        Raises:
            TypeError, ValueError: as the constructor's ``warmed`` (``sizes`` not a sequence
                of ints, a size < 1); nothing is marked then.
        """
        self._seen.update(_check_sizes("sizes", sizes))

    def reset(self) -> None:
        """Forget every size run since construction; only the ``warmed`` ones stay warm."""
        self._seen = set(self._initial)

    def service_s(self, units: int, rng: np.random.Generator) -> float:
        """Inner seconds for ``units`` (>= 1, else ValueError), plus ``cold_s`` the first time."""
        base = self.inner.service_s(units, rng)
        if units in self._seen:
            return base
        self._seen.add(units)
        return base + self.cold_s

    def __repr__(self) -> str:
        return f"ColdShapes({self.inner!r}, cold_s={self.cold_s!r}, warm={sorted(self._seen)})"


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """Device memory capacity in bytes, optionally changing over (simulated) time.

    Args:
        capacity_bytes: capacity from time 0 (> 0), e.g. ``141e9`` for an H200 (141 GB HBM3e).
        squeezes: ``(time_s, capacity_bytes)`` pairs: from ``time_s`` (>= 0) on (inclusive), the
            capacity is ``capacity_bytes`` (> 0), until the next squeeze. Stored sorted by time;
            a later entry for the same time wins. Models another tenant taking (or giving back)
            memory.

    Raises:
        TypeError: a capacity or time that is not a number.
        ValueError: a capacity not finite or <= 0, a squeeze time not finite or < 0.
    """

    capacity_bytes: float
    squeezes: Sequence[tuple[float, float]] = ()
    _times: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_number("capacity_bytes", self.capacity_bytes, 0.0, strict=True)
        pairs = [
            (
                check_number(f"squeezes[{i}] time_s", t, 0.0),
                check_number(f"squeezes[{i}] capacity_bytes", c, 0.0, strict=True),
            )
            for i, (t, c) in enumerate(self.squeezes)
        ]
        ordered = tuple(sorted(pairs, key=lambda p: p[0]))  # stable: later entry wins at a tie
        object.__setattr__(self, "squeezes", ordered)
        object.__setattr__(self, "_times", tuple(t for t, _ in ordered))

    def capacity_at(self, t: float) -> float:
        """Capacity in bytes at time ``t`` seconds."""
        i = bisect_right(self._times, t)
        return self.capacity_bytes if i == 0 else self.squeezes[i - 1][1]

    def is_oom(self, model: ServiceModel, units: int, t: float) -> bool:
        """True when a batch of ``units`` needs more than the capacity at ``t`` seconds.

        ``model.memory_bytes(units) > capacity_at(t)``; False when the model's memory is
        unknown (NaN): an unknown footprint never runs out of memory here.
        """
        need = model.memory_bytes(units)
        return not math.isnan(need) and need > self.capacity_at(t)

    def free_bytes(self, model: ServiceModel, running_units: int, t: float) -> float | None:
        """Bytes still free at ``t`` while batches totalling ``running_units`` run (0: idle).

        ``max(0, capacity_at(t) - model.memory_bytes(running_units))``: concurrent batches are
        modelled as one batch of their summed size. None when the model's memory is unknown.
        """
        used = model.memory_bytes(running_units)
        if math.isnan(used):
            return None
        return max(0.0, self.capacity_at(t) - used)

    def free_fraction(self, model: ServiceModel, running_units: int, t: float) -> float | None:
        """:meth:`free_bytes` / :meth:`capacity_at`, in [0, 1]; None when memory is unknown.

        The same convention as ``TelemetrySample.free_fraction``.
        """
        free = self.free_bytes(model, running_units, t)
        if free is None:
            return None
        return min(1.0, free / self.capacity_at(t))
