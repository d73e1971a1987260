"""Docstrings, comments and shipped text cite their sources in words, never by a path outside
the repository: the project's shared measurement folder and design notes are not part of the
package, so a reader of the installed package (or of the API reference) could not follow them.

The only paths outside the repository that may appear are the ones the code reads, told to the
user as such: the Azure traces in ``../shared/traces/`` next to a checkout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import adaptive_batcher

ROOT = Path(adaptive_batcher.__file__).parents[1]
OUTSIDE = ("shared/profiles", "DESIGN.md", "shared/traces")

# where ../shared/traces is the path the code reads, told to the user (an instruction, not a source)
READS_THE_TRACES = {"adaptive_batcher/sim/traces.py", "adaptive_batcher/sim/scenarios.py"}


def _texts() -> list[Path]:
    files = [*(ROOT / "adaptive_batcher").rglob("*.py"), *(ROOT / "adaptive_batcher").rglob("*.md")]
    files += [*(ROOT / "policies").glob("*.toml"), *(ROOT / "policies").glob("*.md")]
    return sorted(files)


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_is_cited_by_a_path_outside_the_repository(path: Path) -> None:
    relative = str(path.relative_to(ROOT))
    text = path.read_text(encoding="utf-8")
    found = []
    for marker in OUTSIDE:
        if marker not in text:
            continue
        if marker == "shared/traces" and relative in READS_THE_TRACES:
            continue
        found += [
            f"{relative}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), start=1)
            if marker in line
        ]
    assert not found, "cite the fact and its source in words:\n" + "\n".join(found)


def test_the_exemptions_are_still_needed() -> None:
    for relative in READS_THE_TRACES:
        assert "shared/traces" in (ROOT / relative).read_text(encoding="utf-8"), relative
