"""The docs stay true: relative links resolve, the examples marked ``<!-- test -->`` run, and the
API reference (rendered by mkdocstrings from ``::: module`` directives in ``docs/api/``, see
``mkdocs.yml``) covers every public module. CI builds the site itself with ``mkdocs build
--strict``; these tests do not."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from dataclasses import fields
from pathlib import Path
from types import ModuleType

import pytest

import adaptive_batcher
from adaptive_batcher.sim.simulator import SimConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = DOCS / "api"
MARKDOWN = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_TESTED_BLOCK = re.compile(r"^<!-- test -->\n```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# a mkdocstrings directive and its indented YAML options
_DIRECTIVE = re.compile(r"^::: ([\w.]+)[ \t]*\n((?:[ \t]+\S.*\n)*)", re.MULTILINE)
_NAV_BLOCK = re.compile(r"^nav:\n((?:[ \t]+.*\n|\n)*)", re.MULTILINE)
_NAV_PAGE = re.compile(r"^[ \t]*- (?:[^:\n]+:[ \t]*)?([\w/.-]+\.md)[ \t]*$", re.MULTILINE)
_REFERENCE = re.compile(r"\[`([\w.]+)`\]\[([\w.]+)\]")

# Public modules (no ``_`` in the dotted path) that the API reference leaves out on purpose.
NOT_IN_REFERENCE = {
    "adaptive_batcher.cli": "the command line; each command documents itself with --help",
    "adaptive_batcher.data": "package data (measured tables), read via adaptive_batcher.sim",
    "adaptive_batcher.examples": "the demo's example model",
    "adaptive_batcher.core.buckets": "the spine's internal bucket arithmetic",
    "adaptive_batcher.runtime.batch_runner": "AdaptiveBatcher's internal batch runner",
    "adaptive_batcher.runtime.driver": "AdaptiveBatcher's internal loop driver",
    "adaptive_batcher.runtime.in_flight": "AdaptiveBatcher's internal registry of batches",
    "adaptive_batcher.runtime.listeners": "AdaptiveBatcher's listeners (BatchListener: batcher)",
    "adaptive_batcher.runtime.loop": "AdaptiveBatcher's internal loop helpers",
    "adaptive_batcher.runtime.requests": "AdaptiveBatcher's internal queued request",
    "adaptive_batcher.runtime.shutdown": "AdaptiveBatcher's internal close",
    "adaptive_batcher.runtime.warmup": "AdaptiveBatcher's internal warm-up",
    "adaptive_batcher.control.cap_probe": "deprecated path of control.guards.cap_probe",
    "adaptive_batcher.control.unused_window": "deprecated path of control.guards.unused_window",
}


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where links are not links."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    anchors = set(_EXPLICIT_ANCHOR.findall(text))
    anchors.update(_slug(h) for h in _HEADING.findall(_FENCE.sub("", text)))
    return anchors


def _is_external(target: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken: list[str] = []
    for target in _LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
        if _is_external(target):
            continue
        file_part, _, fragment = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no such file {linked}")
        elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
            broken.append(f"{target}: no heading or anchor '{fragment}' in {linked.name}")
    assert not broken, f"broken links in {doc.relative_to(ROOT)}:\n" + "\n".join(broken)


def _tested_blocks() -> list[tuple[str, str]]:
    blocks: list[tuple[str, str]] = []
    for doc in sorted(DOCS.glob("*.md")):
        found = _TESTED_BLOCK.findall(doc.read_text(encoding="utf-8"))
        blocks += [(f"{doc.name}:{index}", code) for index, code in enumerate(found, start=1)]
    return blocks


def test_the_tuning_guide_has_tested_examples() -> None:
    assert sum(1 for name, _ in _tested_blocks() if name.startswith("tuning.md:")) >= 3


@pytest.mark.parametrize(
    ("name", "code"), [pytest.param(name, code, id=name) for name, code in _tested_blocks()]
)
def test_marked_examples_run(name: str, code: str) -> None:
    exec(compile(code, f"docs/{name}", "exec"), {"__name__": f"docs_example_{name}"})


def _directives() -> dict[str, str]:
    """Every ``::: identifier`` in the API pages -> its options block (indented YAML)."""
    found: dict[str, str] = {}
    for page in sorted(API.glob("*.md")):
        for identifier, options in _DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            assert identifier not in found, f"{identifier} is rendered twice ({page.name})"
            found[identifier] = options
    return found


def _rendered_names(identifier: str, options: str) -> set[str]:
    """The names a directive renders: those its ``members:`` option lists (``false``: none),
    by default the module's ``__all__``."""
    listed = re.search(r"^\s*members:\s*(.+?)\s*$", options, re.MULTILINE)
    if listed is None:
        return set(getattr(importlib.import_module(identifier), "__all__", ()))
    if listed.group(1) == "false":
        return set()
    names = re.fullmatch(r"\[([\w, ]*)\]", listed.group(1))
    assert names is not None, f"{identifier}: members must be false or a [flow, list]"
    return {name.strip() for name in names.group(1).split(",") if name.strip()}


def _public_modules() -> list[str]:
    names = [adaptive_batcher.__name__]
    for info in pkgutil.walk_packages(adaptive_batcher.__path__, f"{adaptive_batcher.__name__}."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def _left_out(module: str) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in NOT_IN_REFERENCE)


def _resolve(identifier: str) -> object:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = identifier.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError as exc:
            if exc.name is None or not identifier.startswith(exc.name):
                raise  # a dependency is missing, not a module of this path
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(identifier)


def test_every_api_directive_names_an_importable_module() -> None:
    directives = _directives()
    assert adaptive_batcher.__name__ in directives
    for identifier in directives:
        assert isinstance(importlib.import_module(identifier), ModuleType), identifier


def test_the_nav_lists_every_page_and_only_pages_that_exist() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = _NAV_BLOCK.search(config)
    assert nav is not None, "mkdocs.yml has no nav"
    listed = _NAV_PAGE.findall(nav.group(1))
    assert len(listed) == len(set(listed)), f"a page is listed twice: {listed}"
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert set(listed) == pages, (
        f"in the nav, not in docs/: {sorted(set(listed) - pages)}; "
        f"in docs/, not in the nav: {sorted(pages - set(listed))}"
    )
    assert {f"api/{page.name}" for page in API.glob("*.md")} <= set(listed)


def test_the_api_reference_covers_every_public_module() -> None:
    """Each name in the ``__all__`` of a public module is rendered: by the directive for its
    module, or for a module that re-exports it (the same object)."""
    rendered = [
        (importlib.import_module(identifier), _rendered_names(identifier, options))
        for identifier, options in _directives().items()
    ]
    for module, names in rendered:
        unknown = names - set(getattr(module, "__all__", ()))
        assert not unknown, f"{module.__name__}: members not in its __all__: {sorted(unknown)}"
    missing: list[str] = []
    for name in _public_modules():
        if _left_out(name):
            continue
        module = importlib.import_module(name)
        public = getattr(module, "__all__", None)
        if public is None:  # a namespace of submodules: documented through them
            assert hasattr(module, "__path__"), f"{name} is public but has no __all__"
            continue
        for member in public:
            if member.startswith("__"):  # __version__: stated in docs/api/index.md
                continue
            value = getattr(module, member)
            if not any(
                member in names and getattr(shown, member) is value for shown, names in rendered
            ):
                missing.append(f"{name}.{member}")
    assert not missing, "public names the API reference does not render:\n" + "\n".join(missing)


def test_modules_left_out_of_the_reference_exist() -> None:
    for name in NOT_IN_REFERENCE:
        assert importlib.util.find_spec(name) is not None, f"{name} no longer exists"


def test_the_reference_index_links_every_top_level_name() -> None:
    """``docs/api/index.md`` renders the package docstring only and links each top-level name to
    where its module's page documents it; ``mkdocs build --strict`` checks that the anchor
    exists, this test that the list is complete and each link names that very object."""
    links = dict(_REFERENCE.findall((API / "index.md").read_text(encoding="utf-8")))
    for name in adaptive_batcher.__all__:
        if name == "__version__":
            continue
        assert name in links, f"docs/api/index.md does not link {name}"
        assert _resolve(links[name]) is getattr(adaptive_batcher, name), (name, links[name])


def _sphinx_roles() -> ModuleType:
    """``docs/sphinx_roles.py``, the griffe extension of the site (needs the ``docs`` extra)."""
    spec = importlib.util.spec_from_file_location("sphinx_roles", DOCS / "sphinx_roles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sphinx_roles_become_optional_cross_references() -> None:
    paths = {"Bandit": "p.bandit.Bandit", "Engine.poll": "p.engine.Engine.poll", "f": "p.f"}
    text = "See :class:`Bandit`, :meth:`~Engine.poll` and :py:func:`f()`; ``x`` and `y` stay."
    assert _sphinx_roles().rewrite_roles(text, paths.__getitem__) == (
        'See <autoref identifier="p.bandit.Bandit" optional><code>Bandit</code></autoref>, '
        '<autoref identifier="p.engine.Engine.poll" optional><code>poll</code></autoref> and '
        '<autoref identifier="p.f" optional><code>f</code></autoref>; ``x`` and `y` stay.'
    )


def test_sphinx_roles_resolve_in_the_scope_of_the_docstring() -> None:
    import griffe

    extension = _sphinx_roles().SphinxRoles()
    package = griffe.load(adaptive_batcher.__name__, extensions=griffe.Extensions(extension))
    bandit = package["policies.bandit.Bandit"]
    assert bandit.docstring is not None
    # ":func:`tick_reward`" in Bandit's docstring names the module-level function
    assert 'identifier="adaptive_batcher.policies.bandit.tick_reward"' in bandit.docstring.value
    left: list[str] = []

    def collect(obj: griffe.Object) -> None:
        if obj.docstring is not None and re.search(
            r":(class|func|meth|mod):`", obj.docstring.value
        ):
            left.append(obj.path)
        for member in obj.members.values():
            if not member.is_alias:
                collect(member)

    collect(package)
    assert not left, f"Sphinx roles left in: {left}"


def test_the_tuning_guide_lists_exactly_the_settings_of_simconfig() -> None:
    """Before: it listed ``control_interval_s`` (the keyword is ``control_interval_ms``) and
    ``service_seed`` (no argument; the controller's prior is ``service_profile``), and left out
    half the settings."""
    text = (DOCS / "tuning.md").read_text(encoding="utf-8")
    paragraphs = [p for p in text.split("\n\n") if p.startswith("`SimConfig` takes")]
    assert len(paragraphs) == 1
    named = set(re.findall(r"`([a-z][a-z0-9_]*)`", paragraphs[0]))
    assert named == {f.name for f in fields(SimConfig) if f.init}
