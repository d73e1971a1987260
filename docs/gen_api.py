"""Generate ``docs/api.md``, the API reference, from the docstrings of the public API.

Run ``python docs/gen_api.py`` from anywhere: it rewrites ``docs/api.md`` next to this file.
``tests/test_docs.py`` checks that the committed file equals what :func:`render` produces, so
the reference never drifts from the code.

What is documented: every name in the ``__all__`` of the modules in :data:`MODULES`, in that
order. A class gets its signature, base classes, docstring, and the public methods and
properties defined in its own body (inherited ones are documented on the base class); a function
gets its signature and docstring; a constant gets the source text of its value and its
attribute docstring (a string right after the assignment, or ``#:`` comments right before it).
The output depends only on the source, never on memory addresses or the environment.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MODULES", "OUTPUT", "main", "render"]

MODULES: tuple[str, ...] = (
    "adaptive_batcher",
    "adaptive_batcher.control",
    "adaptive_batcher.policies",
    "adaptive_batcher.telemetry",
    "adaptive_batcher.metrics",
    "adaptive_batcher.profile",
    "adaptive_batcher.testing",
)
"""The modules whose ``__all__`` is documented, in the order of the reference."""

OUTPUT: Path = Path(__file__).resolve().parent / "api.md"
"""The file :func:`main` writes."""

_ROOT = Path(__file__).resolve().parents[1]
_WIDTH = 96  # longest one-line signature; longer ones get one parameter per line
_HIDDEN_BASES = frozenset({"object", "Generic", "Protocol"})
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Text:
    """An annotation or default shown exactly as the given text (``repr`` returns it)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


# -- small renderers ------------------------------------------------------------------------------


def _annotation(annotation: Any) -> str:
    """An annotation as written in the source (string annotations stay unevaluated)."""
    if isinstance(annotation, str):
        return annotation
    forward = getattr(annotation, "__forward_arg__", None)
    if isinstance(forward, str):
        return forward
    return inspect.formatannotation(annotation)


def _literal(value: Any) -> str:
    """``repr`` with double-quoted strings, as the source writes them."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _default(value: Any) -> str:
    """A default value without memory addresses: functions by name, the rest by ``repr``."""
    if isinstance(value, str):
        return _literal(value)
    if isinstance(value, types.BuiltinFunctionType):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, types.FunctionType | type):
        return value.__qualname__
    return _ADDRESS.sub("", repr(value))


def _parameters(signature: inspect.Signature, drop_first: bool) -> list[str]:
    """Each parameter as ``name: annotation = default``, with ``/`` and ``*`` markers."""
    params = list(signature.parameters.values())
    if drop_first and params:
        params = params[1:]
    out: list[str] = []
    star_done = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    for index, param in enumerate(params):
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not star_done:
            out.append("*")
            star_done = True
        text = param.name
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            text = f"*{text}"
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            text = f"**{text}"
        annotated = param.annotation is not inspect.Parameter.empty
        if annotated:
            text += f": {_annotation(param.annotation)}"
        if param.default is not inspect.Parameter.empty:
            text += f" = {_default(param.default)}" if annotated else f"={_default(param.default)}"
        out.append(text)
        following = params[index + 1] if index + 1 < len(params) else None
        if param.kind is inspect.Parameter.POSITIONAL_ONLY and (
            following is None or following.kind is not inspect.Parameter.POSITIONAL_ONLY
        ):
            out.append("/")
    return out


def _signature_text(
    prefix: str, name: str, signature: inspect.Signature | None, *, drop_first: bool = False
) -> str:
    """``prefix name(params) -> return``, wrapped one parameter per line when too long."""
    if signature is None:
        return f"{prefix}{name}"
    params = _parameters(signature, drop_first)
    returns = ""
    if signature.return_annotation is not inspect.Signature.empty and prefix != "class ":
        returns = f" -> {_annotation(signature.return_annotation)}"
    one_line = f"{prefix}{name}({', '.join(params)}){returns}"
    if len(one_line.rsplit("\n", 1)[-1]) <= _WIDTH or not params:
        return one_line
    body = "".join(f"    {param},\n" for param in params)
    return f"{prefix}{name}(\n{body}){returns}"


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):  # builtin types, e.g. exceptions without __init__
        return None


def _docstring(obj: Any) -> str:
    """The cleaned docstring, or "" when there is none."""
    doc = inspect.getdoc(obj)
    return doc.strip() if doc else ""


def _own_docstring(obj: Any) -> str:
    """The docstring written on ``obj`` itself (not one inherited from a base class)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc).strip() if isinstance(doc, str) and doc.strip() else ""


def _summary(text: str) -> str:
    """The first paragraph of a docstring, safe inside a markdown table cell."""
    first = text.split("\n\n", 1)[0].replace("\n", " ").strip()
    return first.replace("|", "\\|") if first else "-"


def _block(text: str, language: str = "text") -> str:
    """A fenced block; nothing for empty text (an object without a docstring)."""
    return f"```{language}\n{text}\n```\n" if text else ""


def _anchor(identifier: str) -> str:
    return f'<a id="{identifier}"></a>\n'


# -- constants: their source text and attribute docstrings ----------------------------------------


@dataclass(frozen=True)
class _Constant:
    source: str
    doc: str
    module: str


def _python_files(module: types.ModuleType) -> list[Path]:
    """The module's own file first, then every file of its package, sorted."""
    file = Path(str(module.__file__))
    files = [file]
    if file.name == "__init__.py":
        files += sorted(p for p in file.parent.rglob("*.py") if p != file)
    return files


def _find_constant(module: types.ModuleType, name: str) -> _Constant | None:
    """Where ``name`` is assigned at module level in the package, with its docstring."""
    for path in _python_files(module):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        lines = source.splitlines()
        body = tree.body
        for index, node in enumerate(body):
            target: ast.expr | None = None
            value: ast.expr | None = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if not (isinstance(target, ast.Name) and target.id == name and value is not None):
                continue
            text = ast.get_source_segment(source, value) or ""
            doc = ""
            following = body[index + 1] if index + 1 < len(body) else None
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                doc = inspect.cleandoc(following.value.value)
            else:
                comments: list[str] = []
                row = node.lineno - 2
                while row >= 0 and lines[row].startswith("#:"):
                    comments.insert(0, lines[row][2:].strip())
                    row -= 1
                doc = "\n".join(comments)
            relative = path.relative_to(_ROOT).with_suffix("")
            dotted = ".".join(relative.parts).removesuffix(".__init__")
            return _Constant(" ".join(text.split()), doc, dotted)
    return None


# -- members of a class ---------------------------------------------------------------------------


def _members(cls: type) -> Iterator[tuple[str, str, Any]]:
    """(kind, name, object) of the public members defined in the class body, in source order."""
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(member, property):
            yield "property", name, member
        elif isinstance(member, classmethod):
            yield "classmethod", name, member.__func__
        elif isinstance(member, staticmethod):
            yield "staticmethod", name, member.__func__
        elif inspect.isfunction(member):
            yield "method", name, member


def _class_attributes(cls: type) -> list[str]:
    """Constants assigned in the body of a class that is not a dataclass (e.g. ``name``), as
    written in the source (live values may have been changed by running code)."""
    if "__dataclass_fields__" in vars(cls) or issubclass(cls, tuple):
        return []
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return []
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.ClassDef):
        return []
    out = []
    for statement in node.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign):
            target, value = statement.target, statement.value
        if (
            isinstance(target, ast.Name)
            and not target.id.startswith("_")
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str | int | float | bool)
        ):
            out.append(f"{target.id} = {ast.get_source_segment(source, value)}")
    return out


def _join(*paragraphs: str) -> str:
    """Non-empty paragraphs, one blank line apart, ending with one newline."""
    return "\n".join(p if p.endswith("\n") else f"{p}\n" for p in paragraphs if p)


def _render_member(owner: str, anchor: str, kind: str, name: str, obj: Any) -> str:
    heading = f"{_anchor(f'{anchor}.{name}')}#### `{owner}.{name}`\n"
    if kind == "property":
        fget: Callable[..., Any] | None = obj.fget
        returns = ""
        signature = _signature(fget) if fget is not None else None
        if signature is not None and signature.return_annotation is not inspect.Signature.empty:
            returns = f": {_annotation(signature.return_annotation)}"
        return _join(
            heading, _block(f"property {name}{returns}", "python"), _block(_docstring(obj))
        )
    prefix = {"classmethod": "@classmethod\n", "staticmethod": "@staticmethod\n"}.get(kind, "")
    keyword = "async def " if inspect.iscoroutinefunction(obj) else "def "
    text = _signature_text(
        f"{prefix}{keyword}", name, _signature(obj), drop_first=kind != "staticmethod"
    )
    return _join(heading, _block(text, "python"), _block(_docstring(obj)))


# -- one exported name ----------------------------------------------------------------------------


def _kind(obj: Any) -> str:
    if isinstance(obj, type):
        if getattr(obj, "_is_protocol", False):
            return "protocol"
        if issubclass(obj, BaseException):
            return "exception"
        return "class"
    if inspect.isfunction(obj):
        return "function"
    return "constant"


def _render_class(module: str, name: str, cls: type) -> tuple[str, str]:
    anchor = f"{module}.{name}"
    kind = _kind(cls)
    signature = None if kind == "protocol" else _signature(cls)
    bases = [b.__name__ for b in cls.__bases__ if b.__name__ not in _HIDDEN_BASES]
    defined = f"Defined in `{cls.__module__}.{cls.__qualname__}`"
    defined += f"; bases: {', '.join(f'`{b}`' for b in bases)}." if bases else "."
    own = _own_docstring(cls)
    attributes = _class_attributes(cls)
    parts = [
        f"{_anchor(anchor)}### `{name}` ({kind})\n",
        _block(_signature_text("class ", name, signature), "python"),
        defined,
        _block(own),
        "Class attributes:" if attributes else "",
        _block("\n".join(attributes), "python"),
    ]
    parts += [_render_member(name, anchor, *member) for member in _members(cls)]
    return _join(*parts), own


def _def_keyword(fn: Any) -> str:
    return "async def " if inspect.iscoroutinefunction(fn) else "def "


def _render_function(module: str, name: str, fn: Callable[..., Any]) -> tuple[str, str]:
    doc = _docstring(fn)
    text = _join(
        f"{_anchor(f'{module}.{name}')}### `{name}` (function)\n",
        _block(_signature_text(_def_keyword(fn), name, _signature(fn)), "python"),
        f"Defined in `{fn.__module__}.{fn.__qualname__}`.",
        _block(doc),
    )
    return text, doc


def _render_constant(module: types.ModuleType, name: str, value: Any) -> tuple[str, str]:
    found = _find_constant(module, name)
    source = found.source if found is not None else _default(value)
    doc = found.doc if found is not None else ""
    text = _join(
        f"{_anchor(f'{module.__name__}.{name}')}### `{name}` (constant)\n",
        _block(f"{name} = {source}", "python"),
        f"Defined in `{found.module}`." if found is not None else "",
        _block(doc),
    )
    return text, doc


def _render_module(module_name: str) -> tuple[str, str]:
    module = importlib.import_module(module_name)
    names: list[str] = list(module.__all__)
    sections: list[str] = []
    rows: list[str] = []
    for name in names:
        obj = getattr(module, name)
        if isinstance(obj, type):
            text, doc = _render_class(module_name, name, obj)
        elif inspect.isfunction(obj):
            text, doc = _render_function(module_name, name, obj)
        else:
            text, doc = _render_constant(module, name, obj)
        sections.append(text)
        rows.append(f"| [`{name}`](#{module_name}.{name}) | {_kind(obj)} | {_summary(doc)} |")
    table = "| name | kind | summary |\n|---|---|---|\n" + "\n".join(rows)
    header = _join(f"{_anchor(module_name)}## `{module_name}`\n", _block(_docstring(module)), table)
    return _join(header, *sections), module_name


def render() -> str:
    """The whole reference as markdown (what :func:`main` writes)."""
    modules = [_render_module(name) for name in MODULES]
    contents = "\n".join(f"- [`{name}`](#{name})" for _, name in modules)
    head = (
        "# API reference\n\n"
        "<!-- Generated by docs/gen_api.py from the docstrings; do not edit by hand. -->\n\n"
        "Generated from the docstrings by `python docs/gen_api.py`; `tests/test_docs.py` fails "
        "when this file\nand the code disagree. It documents the names in the `__all__` of each "
        "module below; for\nhow the parts fit together see [architecture.md](architecture.md), "
        "for the control laws\n[policies.md](policies.md).\n\n"
        f"{contents}\n"
    )
    return _join(head, *(text for text, _ in modules))


def main() -> None:
    """Write :data:`OUTPUT`."""
    OUTPUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    if str(_ROOT) not in sys.path:
        sys.path.insert(0, str(_ROOT))
    main()
