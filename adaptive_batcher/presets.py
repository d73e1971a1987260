"""Declarative scenario presets: TOML files naming an SLO, a policy, bounds and batcher settings.

Use one::

    from adaptive_batcher import AdaptiveBatcher, list_presets, load_preset

    batcher = AdaptiveBatcher.from_preset("realtime_chat", model)   # or with overrides:
    batcher = AdaptiveBatcher.from_preset("search", model, max_queue_size=1000)
    preset = load_preset("customer_service/chat")                    # one batcher of a group
    batcher = AdaptiveBatcher(model, **preset.batcher_kwargs())

The shipped presets live in the repository's top-level ``policies/`` folder, installed as
``adaptive_batcher/_presets``; ``list_presets()`` names them. Any file can be loaded by path.

Schema (every table and key is optional unless marked, but a file, and each member of a group,
must hold at least one of ``[slo]``, ``[policy]``, ``[batcher]``, ``[bounds]``: an empty file is
refused rather than read as a static batcher without an SLO; units are in the key names)::

    [preset]
    name = "realtime_chat"       # default: the file name without ".toml"
    description = "..."

    [slo]                        # an SLO; without it the batcher has no latency objective
    latency_ms = 200.0           # required: the latency target at percentile, ms (> 0)
    percentile = 99.0            # the percentile it applies to, in [1, 100)
    preprocess_ms = 10.0         # time spent outside the batcher, ms (>= 0, < margin * latency_ms)
    margin = 0.8                 # fraction of the target the controller aims at, in (0, 1]

    [policy]                     # default: PID when [slo] is set, else fixed settings
    name = "pid"                 # required: pid | static | aimd | bandit_ucb | bandit_thompson
    kp = 0.3                     # ... and that policy's constructor arguments (its parameters)

    [batcher]                    # AdaptiveBatcher keyword arguments, only these (BATCHER_KEYS):
    max_batch_size = 16          #   max_batch_size, window_ms, max_concurrent_batches,
    window_ms = 10.0             #   max_queue_size, batch_sizes, shed_late,
    shed_late = true             #   control_interval_ms, executor

    [bounds]                     # Bounds fields: min_window_ms, max_window_ms, min_batch_size,
    max_window_ms = 20.0         #   max_batch_size, batch_sizes. Missing ones follow [batcher]:
                                 #   max_batch_size = the batcher's cap, batch_sizes = its
                                 #   buckets, max_window_ms = max(100, window_ms, SLO budget)

Several batchers in one file (e.g. an interactive and a background model of one service): put
each under ``[batchers.<member>]`` with its own optional ``description`` and its own ``slo``,
``policy``, ``batcher`` and ``bounds`` tables (``[batchers.chat.slo]`` ...); the top level then
holds only ``[preset]`` and ``[batchers]``. A member is loaded as ``"<file name>/<member>"`` and
named so (also in the log field ``batcher``), or all at once with :func:`load_preset_group`.
A one-batcher file goes through the same code: it is a group of one, whose tables sit at the top.

Cross-checks: the bounds' cap must not exceed the batcher's cap, the batcher's window must lie
within the bounds' window range, and the largest bucket must be the cap.

Every error is a :class:`PresetError` (a ``ValueError``) whose message reads
``<file>: key '<dotted.key>': <what is wrong>``; range errors reuse the messages of
:class:`~adaptive_batcher.SLO`, :class:`~adaptive_batcher.control.Bounds` and the policies.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from adaptive_batcher._validate import (
    check_bool,
    check_choice,
    check_increasing_ints,
    check_int,
    check_number,
    check_str,
)
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.core.settings import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_WINDOW_MS,
    EXECUTOR_KINDS,
    BatcherSettings,
    default_window_range_ms,
)
from adaptive_batcher.policies import REGISTRY, Policy
from adaptive_batcher.slo import SLO

__all__ = [
    "BATCHER_KEYS",
    "BOUNDS_KEYS",
    "POLICIES",
    "PRESET_DIRS",
    "SLO_KEYS",
    "PolicySpec",
    "Preset",
    "PresetError",
    "list_presets",
    "load_preset",
    "load_preset_group",
]

PRESET_DIRS: tuple[Path, ...] = (
    Path(__file__).resolve().parent / "_presets",  # installed wheel (force-included policies/)
    Path(__file__).resolve().parents[1] / "policies",  # source checkout, editable install
)
"""Where preset names are looked up, first match wins."""


class PresetError(ValueError):
    """A preset that cannot be found, read or validated.

    Attributes:
        path: the file at fault (None for an unknown name).
        key: the dotted key at fault (None when the file as a whole is).
    """

    def __init__(self, message: str, path: Path | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.key = key


# -- value checks: (name, value) -> value, raising TypeError / ValueError ------------------------
# thin adapters to adaptive_batcher._validate, the package's one set of checks and messages

_Check = Callable[[str, object], Any]


def _number(minimum: float, *, strict: bool = False) -> _Check:
    return lambda name, value: check_number(name, value, minimum, strict=strict)


def _int(minimum: int) -> _Check:
    return lambda name, value: check_int(name, value, minimum)


def _choice(*choices: str) -> _Check:
    return lambda name, value: check_choice(name, value, sorted(choices))


def _buckets(name: str, value: object) -> tuple[int, ...]:
    return check_increasing_ints(name, value, 1)


_bool: _Check = check_bool
_text: _Check = check_str
_BUCKETS: _Check = _buckets

SLO_KEYS: Mapping[str, _Check] = MappingProxyType(
    {
        "latency_ms": _number(0, strict=True),
        "percentile": _number(0, strict=True),
        "preprocess_ms": _number(0),
        "margin": _number(0, strict=True),
    }
)
"""The keys of ``[slo]`` (the :class:`~adaptive_batcher.SLO` fields) and their checks."""

# Old [slo] keys -> their new names: an old key is refused with a PresetError naming the new one
# (p99_ms read false for any percentile but 99).
_RENAMED_SLO_KEYS: Mapping[str, str] = MappingProxyType({"p99_ms": "latency_ms"})

BATCHER_KEYS: Mapping[str, _Check] = MappingProxyType(
    {
        "max_batch_size": _int(1),
        "window_ms": _number(0),
        "max_concurrent_batches": _int(1),
        "max_queue_size": _int(1),
        "batch_sizes": _BUCKETS,
        "shed_late": _bool,
        "control_interval_ms": _number(0, strict=True),
        "executor": _choice(*EXECUTOR_KINDS),
    }
)
"""The ``AdaptiveBatcher`` keyword arguments a ``[batcher]`` table may set, and their checks."""

BOUNDS_KEYS: Mapping[str, _Check] = MappingProxyType(
    {
        "min_window_ms": _number(0),
        "max_window_ms": _number(0),
        "min_batch_size": _int(1),
        "max_batch_size": _int(1),
        "batch_sizes": _BUCKETS,
    }
)
"""The keys of ``[bounds]`` (the :class:`~adaptive_batcher.control.Bounds` fields)."""

POLICIES: Mapping[str, Any] = REGISTRY
"""The policy classes by the ``[policy] name`` that selects them (each class's ``name``); the
keys each one accepts besides ``name`` are its constructor arguments, listed in its
``parameters``."""

_SECTIONS = ("slo", "policy", "batcher", "bounds")
_ANY_MEMBER_TABLE = "[slo], [policy], [batcher] or [bounds]"
_ANY_TABLE = "[slo], [policy], [batcher], [bounds] or [batchers]"
_MEMBER = re.compile(r"[A-Za-z0-9_-]+")


# -- the result ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy by name and constructor arguments; :meth:`build` makes a fresh instance.

    Attributes:
        name: a key of :data:`POLICIES` (``pid``, ``static``, ``aimd``, ``bandit_ucb``,
            ``bandit_thompson``).
        params: the constructor's keyword arguments (arrays as tuples), read-only.
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def build(self) -> Policy:
        """A new policy instance (policies keep state: never share one between batchers).

        Raises:
            TypeError, ValueError: as the policy's constructor (a loaded spec never raises).
        """
        policy: Policy = POLICIES[self.name](**self.params)
        return policy


@dataclass(frozen=True, slots=True)
class Preset:
    """One batcher's settings, as loaded from a preset file.

    Attributes:
        name: the preset's name (``"search"``, or ``"customer_service/chat"`` for a member of a
            group); also the batcher's log name.
        description: what the preset is for.
        source: the file it was loaded from (absolute).
        slo: the latency objective (None: none set).
        policy: the control law to build (None: the batcher's default, PID with an SLO).
        batcher: ``AdaptiveBatcher`` keyword arguments from ``[batcher]`` (arrays as tuples).
        bounds: the controller's range (None: the batcher's default).
    """

    name: str
    description: str
    source: Path
    slo: SLO | None
    policy: PolicySpec | None
    batcher: Mapping[str, Any] = field(hash=False)
    bounds: Bounds | None

    def make_policy(self) -> Policy | None:
        """A new instance of the preset's policy, or None when it names none."""
        return self.policy.build() if self.policy is not None else None

    def batcher_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``AdaptiveBatcher(model, **kwargs)``, ``overrides`` winning.

        Holds ``name``, the ``[batcher]`` settings, ``slo``, ``bounds`` and a NEW ``policy``
        instance on every call. Unless ``bounds`` is overridden too, the preset's bounds follow
        overridden settings so that they still hold: ``max_batch_size`` becomes the bounds' cap
        (``min_batch_size`` lowered to it if needed), ``window_ms`` widens the window range to
        include it, ``batch_sizes`` replaces the bounds' buckets. Unless ``batch_sizes`` is
        overridden too, an overridden ``max_batch_size`` drops the preset's buckets above it
        (in ``[batcher]`` and in the bounds): no bucket may exceed the cap.

        Raises nothing itself; the batcher's constructor validates the overrides.
        """
        kwargs: dict[str, Any] = {"name": self.name, **self.batcher, "slo": self.slo}
        if "policy" not in overrides:
            kwargs["policy"] = self.make_policy()
        overrides = _buckets_follow_cap(kwargs, overrides)
        if self.bounds is not None and "bounds" not in overrides:
            kwargs["bounds"] = _follow(self.bounds, overrides)
        kwargs.update(overrides)
        return kwargs


def _buckets_follow_cap(kwargs: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` plus the preset's ``batch_sizes`` without those above an overridden cap.
    Unchanged when ``batch_sizes`` is overridden, the cap is invalid, the preset has no buckets
    or none fits (the constructor then names the buckets above the cap)."""
    cap = _valid_override(overrides, "max_batch_size", _int(1))
    if cap is None or "batch_sizes" in overrides:
        return dict(overrides)
    fitting = tuple(b for b in kwargs.get("batch_sizes") or () if b <= cap)
    return {**overrides, "batch_sizes": fitting} if fitting else dict(overrides)


def _follow(bounds: Bounds, overrides: Mapping[str, Any]) -> Bounds:
    """``bounds`` moved to admit the overridden cap, window and buckets (numpy scalars too).
    Invalid overrides are ignored here: the batcher's constructor reports them."""
    changes: dict[str, Any] = {}
    cap = _valid_override(overrides, "max_batch_size", _int(1))
    if cap is not None:
        changes.update(max_batch_size=cap, min_batch_size=min(bounds.min_batch_size, cap))
    window = _valid_override(overrides, "window_ms", _number(0))
    if window is not None:
        changes.update(
            min_window_ms=min(bounds.min_window_ms, window),
            max_window_ms=max(bounds.max_window_ms, window),
        )
    if "batch_sizes" in overrides:
        buckets = overrides["batch_sizes"]
        changes["batch_sizes"] = () if buckets is None else buckets
    try:
        return replace(bounds, **changes)
    except (TypeError, ValueError):  # invalid buckets: the constructor says so
        return replace(bounds, **{k: v for k, v in changes.items() if k != "batch_sizes"})


def _valid_override(overrides: Mapping[str, Any], name: str, check: _Check) -> Any:
    """The override ``name`` as ``check`` returns it; None if it is absent or invalid."""
    try:
        return check(name, overrides[name]) if name in overrides else None
    except (TypeError, ValueError):
        return None


# -- public functions ---------------------------------------------------------------------------


def list_presets() -> list[str]:
    """The names :func:`load_preset` accepts, sorted; members of a group as ``"file/member"``.

    Raises:
        PresetError: a preset file that cannot be read or is not valid TOML.
    """
    names: list[str] = []
    for stem, path in _preset_files().items():
        members = _read(path).get("batchers")
        if isinstance(members, dict) and members:
            names.extend(f"{stem}/{member}" for member in members)
        else:
            names.append(stem)
    return sorted(names)


def load_preset(name_or_path: str | os.PathLike[str]) -> Preset:
    """Load one batcher's preset.

    Args:
        name_or_path: a name from :func:`list_presets` (``"search"``,
            ``"customer_service/chat"``), or the path of a TOML file: a ``PathLike``, a string
            ending in ``.toml``, or a string with a slash naming an existing file.

    Raises:
        PresetError: an unknown name (the message lists the available ones), a missing or
            unreadable file, a directory, a file that is not UTF-8 or holds no settings, a file
            holding several batchers when no member was named, or an invalid file (the message
            names the file and the key).
        TypeError: ``name_or_path`` is neither a string nor a path.
    """
    path, member = _locate(name_or_path)
    found = _load_file(path)
    if member is None and None in found:
        return found[None]
    if member is not None and member in found:
        return found[member]
    if member is None:
        members = ", ".join(f"{path.stem}/{m}" for m in found if m is not None)
        raise PresetError(
            f"{path}: holds several batchers; load one of: {members} "
            "(or all with load_preset_group)",
            path,
            "batchers",
        )
    raise PresetError(f"unknown preset {name_or_path!r}; available: {', '.join(list_presets())}")


def load_preset_group(name_or_path: str | os.PathLike[str]) -> dict[str, Preset]:
    """Load every batcher of a preset file: {member name: preset}.

    A one-batcher file gives ``{preset.name: preset}``. ``name_or_path`` is a file name from
    :func:`list_presets` without the member part (``"customer_service"``) or a path.

    Raises:
        PresetError, TypeError: as :func:`load_preset`.
    """
    path, member = _locate(name_or_path)
    if member is not None:
        raise PresetError(f"{name_or_path!r} names one batcher; pass the group {path.stem!r}")
    return {key if key is not None else p.name: p for key, p in _load_file(path).items()}


# -- finding and reading files ------------------------------------------------------------------


def _preset_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for folder in PRESET_DIRS:
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                files.setdefault(path.stem, path)
    return files


def _locate(name_or_path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """(file, member or None) for a name or a path."""
    if isinstance(name_or_path, os.PathLike):
        return _existing(Path(name_or_path)), None
    if not isinstance(name_or_path, str):
        raise TypeError(f"preset must be a name or a path, got {type(name_or_path).__name__}")
    is_path = "/" in name_or_path or os.sep in name_or_path
    if name_or_path.endswith(".toml") or (is_path and Path(name_or_path).is_file()):
        return _existing(Path(name_or_path)), None
    group, _, member = name_or_path.partition("/")
    path = _preset_files().get(group)
    if path is None:
        if Path(name_or_path).is_dir():
            raise _not_a_file(Path(name_or_path))
        raise PresetError(
            f"unknown preset {name_or_path!r}; available: {', '.join(list_presets())}"
        )
    return path, member or None


def _existing(path: Path) -> Path:
    if path.is_dir():
        raise _not_a_file(path)
    if not path.is_file():
        raise PresetError(f"{path}: no such preset file", path)
    return path


def _not_a_file(folder: Path) -> PresetError:
    return PresetError(f"{folder}: is a directory, not a preset file", folder)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PresetError(f"{path}: cannot read: {exc}", path) from exc
    try:
        return tomllib.loads(data.decode("utf-8-sig"))  # a byte-order mark is allowed
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"{path}: invalid TOML: {exc}", path) from exc
    except UnicodeDecodeError as exc:
        raise PresetError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}); TOML files must be UTF-8",
            path,
        ) from exc
    except RecursionError:
        raise PresetError(
            f"{path}: invalid TOML: arrays or tables nested too deeply", path
        ) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise PresetError(f"{path}: invalid TOML: {exc}", path) from None


# -- parsing: one code path for one batcher and for groups --------------------------------------


def _load_file(path: Path) -> dict[str | None, Preset]:
    """Every batcher in the file: {None: preset} for a one-batcher file, {member: preset}."""
    doc = _read(path)
    _known(path, "", doc, ("preset", "batchers", *_SECTIONS))
    header = _section(path, "preset", doc.get("preset", {}), {"name": _text, "description": _text})
    name: str = header.get("name", path.stem)
    description: str = header.get("description", "")
    if "batchers" not in doc:
        if not any(section in doc for section in _SECTIONS):
            raise PresetError(f"{path}: holds no settings; give at least one of {_ANY_TABLE}", path)
        return {None: _parse_batcher(path, "", doc, name, description)}
    for stray in _SECTIONS:
        if stray in doc:
            raise _error(path, stray, "not allowed next to [batchers]; move it into each member")
    members = _table(path, "batchers", doc["batchers"])
    if not members:
        raise _error(path, "batchers", "must hold at least one batcher")
    found: dict[str | None, Preset] = {}
    for member, table in members.items():
        key = f"batchers.{member}"
        if not _MEMBER.fullmatch(member):
            raise _error(path, key, "member names use letters, digits, '_' and '-' only")
        table = _table(path, key, table)
        _known(path, key, table, ("description", *_SECTIONS))
        if not any(section in table for section in _SECTIONS):
            raise _error(path, key, f"holds no settings; give at least one of {_ANY_MEMBER_TABLE}")
        text = _checked(path, f"{key}.description", _text, table.get("description", description))
        found[member] = _parse_batcher(path, f"{key}.", table, f"{name}/{member}", text)
    return found


def _parse_batcher(
    path: Path, prefix: str, table: Mapping[str, Any], name: str, description: str
) -> Preset:
    """One batcher from the tables ``slo``, ``policy``, ``batcher``, ``bounds`` of ``table``."""
    slo = None
    if "slo" in table:
        fields = _section(
            path, f"{prefix}slo", table["slo"], SLO_KEYS, ("latency_ms",), _RENAMED_SLO_KEYS
        )
        slo = _build(path, f"{prefix}slo", SLO, fields)
    policy = _parse_policy(path, f"{prefix}policy", table["policy"]) if "policy" in table else None
    batcher = _section(path, f"{prefix}batcher", table.get("batcher", {}), BATCHER_KEYS)
    bounds = None
    if "bounds" in table:
        key = f"{prefix}bounds"
        given = _section(path, key, table["bounds"], BOUNDS_KEYS)
        window: float = batcher.get("window_ms", DEFAULT_WINDOW_MS)
        missing = {
            "max_batch_size": batcher.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE),
            "max_window_ms": default_window_range_ms(window, slo),
            "batch_sizes": batcher.get("batch_sizes", ()),
        }
        bounds = _build(path, key, Bounds, {**missing, **given}, given)
    _check_settings(path, prefix, batcher, slo, bounds)
    return Preset(
        name=name,
        description=description,
        source=path.resolve(),
        slo=slo,
        policy=policy,
        batcher=MappingProxyType(batcher),
        bounds=bounds,
    )


def _parse_policy(path: Path, key: str, value: object) -> PolicySpec:
    table = _table(path, key, value)
    if "name" not in table:
        raise _error(path, f"{key}.name", f"missing; choose one of {', '.join(POLICIES)}")
    name = _checked(path, f"{key}.name", _choice(*POLICIES), table["name"])
    cls = POLICIES[name]
    _known(path, key, table, ("name", *cls.parameters))
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items() if k != "name"}
    _build(path, key, cls, params)  # validate once (the policy checks); batchers get new ones
    return PolicySpec(name, MappingProxyType(params))


def _settings_of(batcher: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[batcher]`` keys that are :class:`BatcherSettings` fields (not ``executor``)."""
    return {k: v for k, v in batcher.items() if k in BatcherSettings.__dataclass_fields__}


def _check_settings(
    path: Path,
    prefix: str,
    batcher: Mapping[str, Any],
    slo: SLO | None,
    bounds: Bounds | None,
) -> None:
    """The cross-checks every batcher makes (one rule, one message; see
    :class:`~adaptive_batcher.core.settings.BatcherSettings`), blamed on the key they name."""
    settings = _settings_of(batcher)
    try:
        BatcherSettings(**settings, slo=slo, bounds=bounds)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        section = "bounds" if message.startswith("bounds.") and bounds is not None else "batcher"
        named = [k for k in settings if re.search(rf"\b{re.escape(k)}\b", message)]
        key = f"{prefix}{section}"
        if section == "bounds":
            key += "." + message.split(" ", 1)[0].removeprefix("bounds.")
        elif named:
            key += f".{named[-1]}"
        raise _error(path, key, message) from exc


def _section(
    path: Path,
    key: str,
    value: object,
    checks: Mapping[str, _Check],
    required: tuple[str, ...] = (),
    renamed: Mapping[str, str] = MappingProxyType({}),
) -> dict[str, Any]:
    """The checked values of the table at ``key``: known keys only, each passing its check; a
    key in ``renamed`` (old name -> new name) is refused with a message naming the new one."""
    table = _table(path, key, value)
    for old, new in renamed.items():
        if old in table:
            raise _error(path, f"{key}.{old}", f"renamed {new!r}; write {new} = ... instead")
    _known(path, key, table, tuple(checks))
    for name in required:
        if name not in table:
            raise _error(path, f"{key}.{name}", "missing")
    return {name: _checked(path, f"{key}.{name}", checks[name], v) for name, v in table.items()}


def _table(path: Path, key: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _error(path, key, f"must be a table, got {type(value).__name__}")
    return value


def _known(path: Path, key: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for name in table:
        if name not in allowed:
            dotted = f"{key}.{name}" if key else name
            raise _error(path, dotted, f"unknown key; allowed: {', '.join(sorted(allowed))}")


def _checked(path: Path, key: str, check: _Check, value: object) -> Any:
    try:
        return check(key.rpartition(".")[2], value)
    except (TypeError, ValueError) as exc:
        raise _error(path, key, str(exc)) from exc


def _build(
    path: Path,
    key: str,
    factory: Callable[..., Any],
    fields: Mapping[str, Any],
    given: Mapping[str, Any] | None = None,
) -> Any:
    """``factory(**fields)``; its error is blamed on the one given key it names, else on ``key``."""
    try:
        return factory(**fields)
    except (TypeError, ValueError) as exc:
        named = [
            k
            for k in (fields if given is None else given)
            if re.search(rf"\b{re.escape(k)}\b", str(exc))
        ]
        raise _error(path, f"{key}.{named[0]}" if len(named) == 1 else key, str(exc)) from exc


def _error(path: Path, key: str, message: str) -> PresetError:
    return PresetError(f"{path}: key '{key}': {message}", path, key)
