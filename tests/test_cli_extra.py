"""The ``cli`` extra (rich, matplotlib, kneed) is optional: without it the package, the batcher,
the controller, the simulator and the profile files work, and the command line, the plots, the
knee and the progress bar say which extra to install. Each case runs in a fresh interpreter
whose import system refuses the three libraries, as if they were not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

INSTALL = 'pip install "adaptive-batcher[cli]"'

BLOCKER = """
import sys

BLOCKED = ("rich", "matplotlib", "kneed")


class NotInstalled:
    '''A meta-path finder that refuses the cli extra's libraries, as a missing package would.'''

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""


def run_without_cli_extra(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_blocker_blocks() -> None:
    result = run_without_cli_extra(
        """
        for name in ("rich", "matplotlib.figure", "kneed"):
            try:
                __import__(name)
            except ImportError:
                print("refused", name)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == [
        "refused rich",
        "refused matplotlib.figure",
        "refused kneed",
    ]


def test_the_core_works_without_the_cli_extra() -> None:
    profile = (
        Path(__file__).parents[1] / "adaptive_batcher" / "data" / "cpu" / "mlp_epyc_2core.json"
    )
    result = run_without_cli_extra(
        f"""
        import asyncio

        import numpy as np

        import adaptive_batcher
        from adaptive_batcher import SLO, AdaptiveBatcher
        from adaptive_batcher.profile import load_profile, profile_model
        from adaptive_batcher.sim.service import LinearService, TableService
        from adaptive_batcher.sim.simulator import SimConfig, Simulator
        from adaptive_batcher.sim.workloads import Poisson
        from adaptive_batcher.testing.virtual_time import run_in_virtual_time


        async def model(items):
            await asyncio.sleep(0.002 + 0.0001 * len(items))
            return [2 * x for x in items]


        async def serve():
            batcher = AdaptiveBatcher(
                model, max_batch_size=16, window_ms=2.0, slo=SLO(latency_ms=20.0),
                control_interval_ms=50.0,
            )
            async with batcher:
                results = await asyncio.gather(*(batcher.submit(i) for i in range(200)))
                for _ in range(20):
                    await asyncio.sleep(0.05)
                    await batcher.submit(1)
            return results, batcher.stats()


        results, stats = run_in_virtual_time(serve())
        assert results == [2 * i for i in range(200)]
        assert stats.decisions > 0, stats
        print("batcher and controller ok")

        arrivals = Poisson(1000.0).generate(2.0, np.random.default_rng(0))
        config = SimConfig(max_batch_size=32, window_ms=2.0, slo=SLO(latency_ms=30.0))
        sim = Simulator(LinearService(0.002, 0.0001), config).run(arrivals)
        assert sim.completed == sim.requests > 0
        print("simulator ok")

        table = TableService.from_profile_json({str(profile)!r})
        result, _ = load_profile({str(profile)!r})
        assert table.sizes.tolist() == list(result.batch_sizes)
        print("profile files ok")

        swept = profile_model(
            lambda batch: batch, lambda n: [0] * n, batch_sizes=[1, 2], repeats=2,
            device="cpu", progress=False,
        )
        assert swept.batch_sizes == (1, 2)
        print("profile_model(progress=False) ok")
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()  # with the library's log events (structlog's default)
    for step in (
        "batcher and controller",
        "simulator",
        "profile files",
        "profile_model(progress=False)",
    ):
        assert f"{step} ok" in lines, result.stdout


@pytest.mark.parametrize(
    ("call", "needed_by", "library"),
    [
        (
            "plot_profile(ROWS, 'p.png')",
            "plot_profile",
            "matplotlib",
        ),
        ("find_knee(ROWS)", "find_knee (Kneedle)", "kneed"),
        ("recommend(ROWS)", "find_knee (Kneedle)", "kneed"),
        (
            "profile_model(lambda b: b, lambda n: [0] * n, batch_sizes=[1], device='cpu')",
            "profile_model(progress=True)",
            "rich",
        ),
        ("plot_goodput([], 'g.png')", "plot_goodput", "matplotlib"),
        ("plot_timeseries({}, 't.png', slo_ms=1.0, title='t')", "plot_timeseries", "matplotlib"),
    ],
)
def test_plots_knee_and_progress_bar_name_the_extra(
    call: str, needed_by: str, library: str, tmp_path: Path
) -> None:
    result = run_without_cli_extra(
        f"""
        import os
        os.chdir({str(tmp_path)!r})
        from adaptive_batcher.profile import (
            ProfileResult, ProfileRow, find_knee, plot_profile, profile_model, recommend,
        )
        from adaptive_batcher.sim.report import plot_goodput, plot_timeseries

        ROWS = ProfileResult(
            tuple(ProfileRow(n, 1.0 + n / 8, 2.0 + n / 8, n / (1.0 + n / 8)) for n in (1, 2, 4, 8)),
            None, "cpu", "m", 1,
        )
        try:
            {call}
        except ImportError as exc:
            print(exc)
        else:
            print("no error")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{needed_by}")
    assert f"needs {library} (the cli extra): {INSTALL}" in result.stdout
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    "module", ["adaptive_batcher.cli.demo_cmd", "adaptive_batcher.cli.replay_cmd"]
)
def test_the_command_modules_name_the_extra(module: str) -> None:
    result = run_without_cli_extra(
        f"""
        try:
            import {module}
        except ImportError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert f"needs rich (the cli extra): {INSTALL}" in result.stdout


def test_the_console_script_prints_the_install_command_and_exits_2(tmp_path: Path) -> None:
    """The installed ``adaptive-batcher`` script, in an interpreter that cannot import rich,
    matplotlib or kneed (a ``sitecustomize`` installs the blocker at start-up)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    script = Path(sys.executable).with_name("adaptive-batcher")
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "adaptive_batcher.cli.main"]
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for argv in (["demo"], ["--help"], ["replay", "--list"]):
        result = subprocess.run(
            [*command, *argv], capture_output=True, text=True, timeout=120, check=False, env=env
        )
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        assert result.stderr == (
            "adaptive-batcher: the command line needs the cli extra (missing: rich, matplotlib, "
            f"kneed): {INSTALL}\n"
        )
        assert result.stdout == ""
