"""Help text for the sub-commands: their module docstrings, as a terminal shows them."""

from __future__ import annotations

__all__ = ["plain"]


def plain(docstring: str | None) -> str:
    """``docstring`` without reStructuredText's literal quotes (````x```` -> ``x``)."""
    return (docstring or "").replace("``", "")
