"""The architecture, checked: which package may import which, and the public names.

Dependencies point one way, down. The spine (``core/``) imports only the shared leaves below it,
and each of its modules only the spine modules before it (engine, buckets, settings, then the
core that joins them); the sans-IO controller imports no policy, shell or wiring; presets import
no runtime; and no two modules import each other, however indirectly. Imports inside functions
and under ``TYPE_CHECKING`` count too.
The LLM gate (``llm``) is sans-IO like the engine: it imports no shell, no simulator and
no batcher wiring (of the spine only the engine), and no clock, I/O or asyncio module at all;
its simulator (``sim.llm``) imports the gate, never the batching simulator's loop or the
runtime. Nothing outside them imports either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import adaptive_batcher

PACKAGE = Path(adaptive_batcher.__file__).parent

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "control": ("policies", "runtime", "sim", "core", "presets", "cli", "profile"),
    "policies": ("runtime", "sim", "core", "presets", "cli"),
    "metrics": ("control", "policies", "runtime", "sim", "core", "presets", "cli"),
    "presets": ("runtime", "sim", "cli"),
    "profile": ("runtime", "sim", "core", "presets", "cli"),
    "sim": ("runtime", "cli"),
    "llm": (
        "runtime",
        "sim",
        "core.batcher_core",
        "core.settings",
        "core.buckets",
        "presets",
        "cli",
        "policies",
        "control",
        "profile",
        "ray",
        "export",
        "telemetry",
        "gateway",
    ),
    "gateway": ("runtime", "sim", "core.batcher_core", "presets", "policies", "control", "ray"),
    "sim.llm": (
        "runtime",
        "cli",
        "core.batcher_core",
        "core.settings",
        "core.buckets",
        "presets",
        "policies",
        "control",
        "sim.simulator",
        "sim.scenarios",
        "sim.cluster",
        "ray",
        "gateway",
    ),
}

SPINE = ("core.engine", "core.buckets", "core.settings", "core.batcher_core")
"""The spine's modules, bottom up: each may import those before it."""

BELOW_THE_SPINE = ("_log", "_validate", "errors", "slo", "control", "metrics", "policies")
"""What the spine may import besides itself (and ``telemetry.base``, the reading's type)."""

ENGINE_IMPORTS = {"_validate", "errors"}
"""The engine, the bottom of the spine, imports only the errors and the checks."""

RUNTIME = (
    "runtime.loop",
    "runtime.collector",
    "runtime.threads",
    "runtime.stats",
    "runtime.requests",
    "runtime.in_flight",
    "runtime.listeners",
    "runtime.executors",
    "runtime.collate",
    "runtime.cuda_graphs",
    "runtime.batch_runner",
    "runtime.streaming",
    "runtime.driver",
    "runtime.warmup",
    "runtime.shutdown",
    "runtime.batcher",
    "runtime.decorator",
)
"""The runtime's modules, bottom up: each may import those before it (the facade,
``runtime.batcher``, sits on the parts it joins; ``@batched`` on the facade)."""

# parts that must not know the LLM gate exists (it builds on them, not they on it)
BELOW_LLM = ("core", "control", "policies", "metrics", "presets", "runtime")

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


def test_the_spine_imports_only_what_lies_below_it() -> None:
    offending = []
    for position, part in enumerate(SPINE):
        allowed = (*SPINE[:position], *BELOW_THE_SPINE, "telemetry.base")
        for name in sorted(imported(modules_of(part)[0])):
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                offending.append(f"{part} imports adaptive_batcher.{name}")
    assert {module_name(path) for path in modules_of("core")} == {
        "adaptive_batcher.core",
        *(f"adaptive_batcher.{part}" for part in SPINE),
    }, "a new spine module: place it in SPINE"
    assert imported(modules_of("core.engine")[0]) <= ENGINE_IMPORTS
    assert not offending, "\n".join(offending)


def test_the_runtime_is_layered() -> None:
    offending = [
        f"{part} imports adaptive_batcher.{name}"
        for position, part in enumerate(RUNTIME)
        for name in sorted(imported(modules_of(part)[0]))
        if name.startswith("runtime.") and name not in RUNTIME[:position]
    ]
    listed = {f"adaptive_batcher.{part}" for part in RUNTIME} | {"adaptive_batcher.runtime"}
    assert {module_name(path) for path in modules_of("runtime")} == listed, (
        "a new runtime module: place it in RUNTIME"
    )
    assert not offending, "\n".join(offending)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def module_graph() -> dict[str, set[str]]:
    """Each module -> the modules it imports (a ``from package import name`` counts as an
    import of the submodule ``name`` where there is one, else of the package)."""
    paths = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in paths:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in paths else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in paths)
        graph[name] = targets - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_modules_import_each_other() -> None:
    """Every arrow points one way, lazy and type-checking imports included (before:
    profile.noise and profile.sweep imported each other)."""
    assert import_cycles(module_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("part", BELOW_LLM)
def test_nothing_below_the_llm_gate_imports_it(part: str) -> None:
    offending = [
        f"{path.relative_to(PACKAGE)} imports adaptive_batcher.{name}"
        for path in modules_of(part)
        for name in sorted(imported(path))
        if name.split(".")[0] in ("llm", "gateway") or name.startswith("sim.llm")
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
            "BatchedStream",
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
            "Stream",
            "StreamBufferFullError",
            "EventLoopError",
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
        if path != PACKAGE / "core" / "batcher_core.py"
        for write in count_writes(path)
    ]
    assert not writes, "\n".join(writes)


def engine_uses(path: Path) -> list[str]:
    """Where ``path`` imports ``BatchingEngine`` or reaches through a core for its engine
    (``core.engine``, ``self._core._engine``; other engines, an LLM server's, are no concern)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in {"engine", "_engine"}:
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in {"core", "_core"}:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} reads {name}.{node.attr}")
        elif isinstance(node, ast.alias) and node.name == "BatchingEngine":
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports BatchingEngine")
    return found


def test_the_shells_go_through_the_core() -> None:
    """BatcherCore is the only way in: no module but the core makes or touches the engine
    (the runtime and the simulator ask the core: ``core.queue_depth``, ``core.cancel``...)."""
    spine = {PACKAGE / "core" / "engine.py", PACKAGE / "core" / "batcher_core.py"}
    uses = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in spine
        for use in engine_uses(path)
    ]
    assert not uses, "\n".join(uses)
