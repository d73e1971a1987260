"""A griffe extension for the docs site: Sphinx roles in docstrings become cross-references.

The package's docstrings name other objects with Sphinx roles (``:class:`Bandit```,
``:meth:`~BatchingEngine.poll```, ``:mod:`adaptive_batcher.sim.traces```), which mkdocstrings
would print as they are. Loaded by ``mkdocs.yml`` (mkdocstrings' python handler, ``extensions``),
this rewrites each role into an optional autorefs cross-reference: a link where the target is
rendered in the site, plain inline code otherwise (mkdocs-autorefs renders an unresolved optional
reference as its title, without a warning). A name is resolved in the scope of the docstring's
object, as Python would look it up there (members, then the enclosing class and module); ``~``
shows only the last component, as in Sphinx.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import griffe

__all__ = ["SphinxRoles", "rewrite_roles"]

ROLE = re.compile(
    r":(?:py:)?(?:attr|class|const|data|exc|func|meth|mod|obj):`(~?)([\w.]+)(?:\(\))?`"
)


def rewrite_roles(text: str, resolve: Callable[[str], str]) -> str:
    """``text`` with each Sphinx role replaced by an optional autorefs reference.

    Args:
        text: a docstring.
        resolve: dotted name as written -> full dotted path of the object it names.

    Returns:
        The docstring with ``<autoref identifier="PATH" optional><code>TITLE</code></autoref>``
        in place of each role; TITLE is the name as written, or its last component after ``~``.
    """

    def replace(match: re.Match[str]) -> str:
        short, name = match.group(1), match.group(2)
        title = name.rsplit(".", 1)[-1] if short else name
        identifier = html.escape(resolve(name), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

    return ROLE.sub(replace, text)


def scoped_resolver(obj: griffe.Object) -> Callable[[str], str]:
    """Resolve a dotted name's first component in ``obj``'s scope; keep it as written if unknown."""

    def resolve(name: str) -> str:
        head, dot, rest = name.partition(".")
        try:
            return obj.resolve(head) + dot + rest
        except griffe.NameResolutionError:
            return name

    return resolve


class SphinxRoles(griffe.Extension):
    """Rewrites the roles in every docstring of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._rewrite(pkg)

    def _rewrite(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite_roles(obj.docstring.value, scoped_resolver(obj))
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member)  # type: ignore[arg-type]
