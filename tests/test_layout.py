"""The architecture, checked: which package may import which, and the public names.

Dependencies point one way: the sans-IO engine and controller import no shell (runtime,
simulator), no policy and no wiring; the wiring (core, settings) imports no shell; presets
import no runtime. The LLM gate (``llm``) is sans-IO like the engine: it imports no shell, no
simulator and no batcher wiring, and no clock, I/O or asyncio module at all; its simulator
(``sim.llm``) imports the gate, never the batching simulator's loop or the runtime. Nothing
outside them imports either. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import adaptive_batcher

PACKAGE = Path(adaptive_batcher.__file__).parent

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "engine": ("control", "policies", "runtime", "sim", "core", "settings", "presets", "cli"),
    "control": ("policies", "runtime", "sim", "core", "settings", "presets", "cli", "profile"),
    "policies": ("runtime", "sim", "core", "settings", "presets", "cli"),
    "metrics": ("control", "policies", "runtime", "sim", "core", "presets", "cli"),
    "settings": ("runtime.batcher", "runtime.executors", "sim", "core", "presets", "cli"),
    "core": ("runtime.batcher", "runtime.executors", "sim", "presets", "cli"),
    "presets": ("runtime.batcher", "sim", "cli"),
    "sim": ("runtime.batcher", "runtime.executors", "cli"),
    "llm": (
        "runtime",
        "sim",
        "core",
        "settings",
        "presets",
        "cli",
        "policies",
        "control",
        "profile",
        "ray",
        "export",
        "telemetry",
    ),
    "sim.llm": (
        "runtime",
        "cli",
        "core",
        "settings",
        "presets",
        "policies",
        "control",
        "sim.simulator",
        "sim.scenarios",
        "sim.cluster",
        "ray",
    ),
}

# parts that must not know the LLM gate exists (it builds on them, not they on it)
BELOW_LLM = ("engine", "control", "policies", "metrics", "settings", "core", "presets", "runtime")

# what a sans-IO module may not import: no clock, no I/O, no event loop, no threads
IO_MODULES = ("asyncio", "threading", "time", "socket", "selectors", "subprocess", "concurrent")


def modules_of(part: str) -> list[Path]:
    folder = PACKAGE / part.replace(".", "/")
    if folder.is_dir():
        return sorted(folder.rglob("*.py"))
    return [PACKAGE / f"{part.replace('.', '/')}.py"]


def raw_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n.removeprefix("adaptive_batcher.") for n in names if n.startswith("adaptive_batcher")}


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_dependencies_point_one_way(part: str) -> None:
    offending = [
        f"{path.relative_to(PACKAGE)} imports adaptive_batcher.{name}"
        for path in modules_of(part)
        for name in sorted(imported(path))
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[part])
    ]
    assert not offending, "\n".join(offending)


@pytest.mark.parametrize("part", BELOW_LLM)
def test_nothing_below_the_llm_gate_imports_it(part: str) -> None:
    offending = [
        f"{path.relative_to(PACKAGE)} imports adaptive_batcher.{name}"
        for path in modules_of(part)
        for name in sorted(imported(path))
        if name == "llm" or name.startswith("llm.") or name.startswith("sim.llm")
    ]
    assert not offending, "\n".join(offending)


def test_the_llm_gate_is_sans_io() -> None:
    offending = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in modules_of("llm")
        for name in sorted(raw_imports(path))
        if name.split(".")[0] in IO_MODULES
    ]
    assert modules_of("llm") and not offending, "\n".join(offending)


def test_the_top_level_exports_exactly_the_public_api() -> None:
    assert sorted(adaptive_batcher.__all__) == sorted(
        [
            "SLO",
            "AdaptiveBatcher",
            "BatchFailedError",
            "BatchedFunction",
            "BatcherClosedError",
            "BatcherError",
            "BatcherStats",
            "Bounds",
            "ConcurrentReadError",
            "DeadlineExceededError",
            "GCPauseProbe",
            "ItemSizeError",
            "ItemTooLargeError",
            "PaddingError",
            "Preset",
            "PresetError",
            "QueueFullError",
            "ResultCountError",
            "StreamBufferFullError",
            "__version__",
            "batched",
            "concat_rows",
            "freeze_after_warmup",
            "list_presets",
            "load_preset",
            "load_preset_group",
            "pad_rows",
            "repeat_last",
            "row_count",
            "stacked",
        ]
    )
    for name in adaptive_batcher.__all__:
        assert hasattr(adaptive_batcher, name), name


def test_the_package_is_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()


COUNTERS = {"submitted", "completed", "within_slo", "failed", "rejected", "expired", "cancelled"}


def count_writes(path: Path) -> list[str]:
    """``<...>.recorder.<counter> = / +=`` and ``recorder.<counter> ...`` writes in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AugAssign)
            else []
        )
        for target in targets:
            if not (isinstance(target, ast.Attribute) and target.attr in COUNTERS):
                continue
            owner = target.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == "recorder":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} writes {target.attr}")
    return found


def test_only_the_core_changes_the_outcome_counts() -> None:
    """Every count change goes through BatcherCore (one method per outcome): the shells never
    write the recorder's counters, so the rules (counts only go up, each request counted once)
    live in one place."""
    writes = [
        write
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "core.py" or path.parent != PACKAGE
        for write in count_writes(path)
    ]
    assert not writes, "\n".join(writes)
