"""Run Ray Serve's own unit tests of ``@serve.batch`` against ``adaptive_batcher.ray.batch``.

Usage::

    python scripts/ray_upstream_tests.py [--source PATH] [--min-passed N]

The test file (``python/ray/serve/tests/unit/test_batching.py`` in the Ray repository) is not
kept in this repository. It is taken from ``--source`` (the file itself, or the root of a Ray
source checkout) or else from the installed ``ray`` package, copied into a temporary folder
next to a ``conftest.py`` that puts our ``batch`` in place of ``ray.serve.batch``, and run with
pytest (Ray must be installed: the file imports it). The report counts passed, failed and
skipped cases; the exit status is 0 when at least ``--min-passed`` cases passed.

The Ray wheels on PyPI leave the tests out (checked for ray 2.60.0), so without ``--source``
the script says where to get the file and exits with status 2.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

RELATIVE = Path("python/ray/serve/tests/unit/test_batching.py")
IN_PACKAGE = Path("serve/tests/unit/test_batching.py")

# Put into the copied test's folder: every ``serve.batch`` the tests use is ours. The file's
# other imports (Ray's replica context, RayServeException, _BatchQueue) stay Ray's.
CONFTEST = '''"""Written by scripts/ray_upstream_tests.py: serve.batch is adaptive_batcher's."""

import ray.serve

import adaptive_batcher.ray

ray.serve.batch = adaptive_batcher.ray.batch
'''

PYTEST_INI = """[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
"""

NOT_OURS = {
    "test_warn_if_max_batch_size_exceeds_max_ongoing_requests": (
        "tests Ray's private _BatchQueue class directly, not serve.batch; our equivalent "
        "is tests/ray/test_serve.py::test_a_replica_that_cannot_fill_a_batch_is_warned_about"
    ),
}


def find_source(given: Path | None) -> Path | None:
    """The upstream test file: ``given`` (a file or a Ray checkout), else the installed one."""
    if given is not None:
        candidate = given / RELATIVE if given.is_dir() else given
        return candidate if candidate.is_file() else None
    try:
        import ray
    except ImportError:
        return None
    installed = Path(ray.__file__).parent / IN_PACKAGE
    return installed if installed.is_file() else None


def run(source: Path, workdir: Path) -> Path:
    """Copy ``source`` into ``workdir`` beside the shim and run it; returns the JUnit report."""
    shutil.copy(source, workdir / "test_batching.py")
    (workdir / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (workdir / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    report = workdir / "report.xml"
    deselect = [f"--deselect=test_batching.py::{name}" for name in NOT_OURS]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            f"--junitxml={report}",
            *deselect,
            "test_batching.py",
        ],
        cwd=workdir,
        check=False,
    )
    return report


def summarise(report: Path) -> dict[str, list[str]]:
    """Case names by outcome: passed, failed, skipped."""
    outcomes: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("name", "?")
        if case.find("skipped") is not None:
            outcomes["skipped"].append(name)
        elif case.find("failure") is not None or case.find("error") is not None:
            outcomes["failed"].append(name)
        else:
            outcomes["passed"].append(name)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="the test file, or a Ray source checkout")
    parser.add_argument("--min-passed", type=int, default=58)
    args = parser.parse_args(argv)
    source = find_source(args.source)
    if source is None:
        print(
            f"Ray's {RELATIVE} was not found: the ray wheels on PyPI do not ship their tests. "
            "Pass --source with the file or a Ray source checkout (at the tag of the installed "
            "version).",
            file=sys.stderr,
        )
        return 2
    text = source.read_text(encoding="utf-8")
    not_run = {name: why for name, why in NOT_OURS.items() if f"def {name}(" in text}
    with tempfile.TemporaryDirectory(prefix="ray-upstream-") as folder:
        outcomes = summarise(run(source, Path(folder)))
    passed, failed, skipped = (len(outcomes[k]) for k in ("passed", "failed", "skipped"))
    total = passed + failed + skipped + len(not_run)
    print(f"\nupstream {source}")
    print(f"{passed} of {total} cases passed against adaptive_batcher.ray.batch")
    for name in outcomes["failed"]:
        print(f"  failed:  {name}")
    for name in outcomes["skipped"]:
        print(f"  skipped: {name}")
    for name, why in not_run.items():
        print(f"  not run: {name}: {why}")
    return 0 if passed >= args.min_passed else 1


if __name__ == "__main__":
    sys.exit(main())
