"""The metrics libraries stay optional: the package imports without them, only the exporters
import them, and an exporter without its library says which extra to install."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import adaptive_batcher

PACKAGE = Path(adaptive_batcher.__file__).parent
LIBRARIES = ("prometheus_client", "opentelemetry")
GATEWAY_EXPORTERS = {
    Path("gateway/prometheus.py"),
    Path("gateway/otel.py"),
    Path("gateway/app.py"),
    Path("gateway/telemetry.py"),
}
"""The LLM gate's exporters, its /metrics route and its engine-metrics parser (the gateway
extra): they import the metrics libraries, never the export package."""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_importing_the_package_imports_no_metrics_library() -> None:
    result = run_python(
        """
        import sys
        import adaptive_batcher, adaptive_batcher.export, adaptive_batcher.export.readings
        import adaptive_batcher.gateway, adaptive_batcher.gateway.readings
        top = {m.split(".")[0] for m in sys.modules}
        print(sorted(top & {"prometheus_client", "opentelemetry"}))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "library", "extra"),
    [
        ("adaptive_batcher.export.prometheus", "prometheus_client", "prometheus"),
        ("adaptive_batcher.export.otel", "opentelemetry", "otel"),
        ("adaptive_batcher.gateway.prometheus", "prometheus_client", "prometheus"),
        ("adaptive_batcher.gateway.otel", "opentelemetry", "otel"),
    ],
)
def test_an_exporter_without_its_library_names_the_extra(
    module: str, library: str, extra: str
) -> None:
    result = run_python(
        f"""
        import sys
        sys.modules[{library!r}] = None  # as if it were not installed
        sys.modules[{library!r} + ".metrics"] = None
        import adaptive_batcher
        try:
            import {module}
        except ImportError as exc:
            print(exc)
        else:
            print("imported")
        """
    )
    assert result.returncode == 0, result.stderr
    assert f'pip install "adaptive-batcher[{extra}]"' in result.stdout
    assert module in result.stdout


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_only_the_exporters_import_the_metrics_libraries_or_the_export_package() -> None:
    offending: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "export":
            continue
        exporter = relative in GATEWAY_EXPORTERS
        for name in _top_level_imports(path):
            library = name.split(".")[0] in LIBRARIES and not exporter
            if library or name.startswith("adaptive_batcher.export"):
                offending.append(f"{relative} imports {name}")
    assert not offending, "\n".join(offending)
