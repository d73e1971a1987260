"""The docs stay true: the API reference matches the docstrings, relative links resolve, and the
examples marked ``<!-- test -->`` run."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKDOWN = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_TESTED_BLOCK = re.compile(r"^<!-- test -->\n```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def test_api_reference_matches_the_docstrings() -> None:
    expected = _load_generator().render()
    actual = (DOCS / "api.md").read_text(encoding="utf-8")
    assert actual == expected, (
        "docs/api.md is out of date with the docstrings of the public API; "
        "run `python docs/gen_api.py` and commit docs/api.md"
    )


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
