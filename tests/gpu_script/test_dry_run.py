"""The GPU check (``benchmarks/gpu/run_h200.py``) run on the CPU with the project's fakes for CUDA
and NVML, at tiny sizes, so the script cannot rot before a device is lent: every phase runs and
writes its files with the expected columns, a failing phase does not stop the next, and missing
imports are named in one line."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import run_h200, runner
from benchmarks.gpu.config import PHASES, QUICK
from benchmarks.gpu.results import COLUMNS, PhaseOutcome

SCRIPT = Path(run_h200.__file__)


def read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("gpu_dry_run")
    return run_h200.main(["--out", str(out), "--dry-run", "--quick"]), out


def test_every_phase_runs_and_the_run_succeeds(dry_run: tuple[int, Path]) -> None:
    status, out = dry_run
    _, phases = read(out / "phases.csv")
    assert [(row["phase"], row["status"]) for row in phases] == [(p, "ok") for p in PHASES]
    assert status == 0


def test_at_most_eight_files_come_back_each_with_its_columns(dry_run: tuple[int, Path]) -> None:
    _, out = dry_run
    names = sorted(path.name for path in out.iterdir())
    assert names == sorted(["summary.md", *(f"{name}.csv" for name in COLUMNS)])
    assert len(names) <= 8  # the device tool brings back at most 8 files
    for name, columns in COLUMNS.items():
        header, rows = read(out / f"{name}.csv")
        assert header == list(columns), name
        assert rows, f"{name}.csv has no rows"


def test_environment_names_the_fake_gpu_and_gpm(dry_run: tuple[int, Path]) -> None:
    _, rows = read(dry_run[1] / "environment.csv")
    facts = {row["key"]: row["value"] for row in rows}
    assert facts["platform"] == "dry-run"
    assert facts["gpu_name"] == "NVIDIA H200 (FakeH200Nvml, dry run)"
    assert facts["gpm_enabled"] == "True"
    assert facts["energy_counter"] == "True"


def test_telemetry_costs_and_readings_idle_and_under_load(dry_run: tuple[int, Path]) -> None:
    _, costs = read(dry_run[1] / "telemetry_cost.csv")
    assert {row["state"] for row in costs} == {"idle", "load"}
    sources = {row["source"] for row in costs}
    assert "NvmlTelemetry(gpm=True).sample" in sources
    assert "TelemetrySampler.latest" in sources
    assert "pynvml.nvmlDeviceGetPowerUsage" in sources
    assert all(float(row["median_us"]) > 0 for row in costs)
    _, readings = read(dry_run[1] / "telemetry_readings.csv")
    by_state = {row["state"]: row for row in readings}
    assert set(by_state) == {"idle", "load"}
    assert float(by_state["load"]["gpu_util_mean_pct"]) == 100.0  # FakeH200Nvml.busy()
    assert float(by_state["load"]["sm_util_mean_pct"]) == pytest.approx(91.6)
    for row in readings:  # the fake counter advances at the fake power draw
        assert row["in_range"] == "True"
        assert float(row["energy_ratio"]) == pytest.approx(1.0, abs=0.05)


def test_serving_runs_every_contender_at_every_rate_and_loses_nothing(
    dry_run: tuple[int, Path],
) -> None:
    _, rows = read(dry_run[1] / "serving.csv")
    warmed = ["static_w0", *(f"ours_slo{slo:g}" for slo in QUICK.slos_ms)]
    configs = ["naive", *warmed, *(f"{name}_graphs" for name in warmed)]
    assert [(float(r["rate_rps"]), r["config"]) for r in rows] == [
        (rate, config) for rate in QUICK.rates_rps for config in configs
    ]
    for row in rows:
        assert row["error"] == ""
        assert row["lost"] == "0"
        ended = sum(int(row[k]) for k in ("completed", "failed", "rejected", "expired"))
        assert ended == int(row["arrivals"]) > 0
        assert row["executor"] == ("thread" if row["config"] == "naive" else "cuda")
        assert float(row["energy_j"]) > 0 and float(row["j_per_request"]) > 0
        assert float(row["gpu_busy_s"]) >= 0  # known for the naive one too (sampler started late)
    assert sum(int(row["completed"]) for row in rows) > 0


def test_the_graphed_contenders_are_captured_and_checked(dry_run: tuple[int, Path]) -> None:
    text = (dry_run[1] / "summary.md").read_text(encoding="utf-8")
    assert f"CUDA graphs: {len(QUICK.buckets)} captured in" in text
    assert "ours (CUDA graphs) p99 <=" in text


def test_the_squeeze_shrinks_the_cap_splits_the_oom_batches_and_loses_nothing(
    dry_run: tuple[int, Path],
) -> None:
    _, rows = read(dry_run[1] / "squeeze.csv")
    stages = [row["stage"] for row in rows]
    assert stages[0] == "before" and stages[-1] == "end"
    assert {"squeezed", "after"} <= set(stages)
    squeezed = [row for row in rows if row["stage"] == "squeezed"]
    assert min(float(row["free_gib"]) for row in squeezed) == pytest.approx(1.0)
    before_cap = int([row for row in rows if row["stage"] == "before"][-1]["cap"])
    assert min(int(row["cap"]) for row in squeezed) < before_cap
    end = rows[-1]
    assert end["lost"] == "0"
    assert int(end["oom_errors"]) >= 1
    assert int(end["memory_guard_events"]) >= 1
    assert int(end["submitted"]) == sum(
        int(end[k]) for k in ("completed", "failed", "rejected", "expired")
    )


def test_the_decoder_grid_is_timed(dry_run: tuple[int, Path]) -> None:
    _, rows = read(dry_run[1] / "llm_steps.csv")
    assert [(int(r["batch"]), int(r["ctx"])) for r in rows] == [
        (b, c) for b in QUICK.llm_batches for c in QUICK.llm_contexts
    ]
    for row in rows:
        assert row["status"] == "ok"
        assert row["impl"] in ("torch.nn", "transformers")
        assert float(row["prefill_ms"]) > 0 and float(row["decode_ms"]) > 0


def test_the_summary_has_every_section_and_the_targets(dry_run: tuple[int, Path]) -> None:
    text = (dry_run[1] / "summary.md").read_text(encoding="utf-8")
    for heading in (
        "## Phases",
        "## Targets (issue 26)",
        "## Environment",
        "## Telemetry",
        "## Serving",
        "## Memory squeeze",
        "## Decoder step times",
    ):
        assert heading in text
    assert "Dry run: the figures come from fakes" in text
    assert "| memory squeeze: no request lost | PASS | lost 0 |" in text
    assert "## Tracebacks" not in text


def test_the_run_leaves_pynvml_alone(dry_run: tuple[int, Path]) -> None:
    assert type(sys.modules.get("pynvml")).__name__ != "FakeH200Nvml"


def test_a_failing_phase_is_recorded_and_the_next_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_: object) -> PhaseOutcome:
        raise RuntimeError("telemetry broke")

    monkeypatch.setitem(runner.PHASE_FUNCTIONS, "telemetry", broken)
    args = ["--out", str(tmp_path), "--dry-run", "--quick", "--phases", "telemetry,environment"]
    assert run_h200.main(args) == 1
    _, phases = read(tmp_path / "phases.csv")
    assert [(r["phase"], r["status"]) for r in phases] == [
        ("telemetry", "failed"),
        ("environment", "ok"),
    ]
    assert phases[0]["detail"] == "RuntimeError: telemetry broke"
    text = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "### telemetry" in text and "RuntimeError: telemetry broke" in text


def test_phases_past_the_budget_are_skipped(tmp_path: Path) -> None:
    args = ["--out", str(tmp_path), "--dry-run", "--quick", "--budget-s", "0"]
    assert run_h200.main(args) == 0
    _, phases = read(tmp_path / "phases.csv")
    assert [(r["phase"], r["status"], r["detail"]) for r in phases] == [
        (p, "skipped", "time budget") for p in PHASES
    ]


def test_missing_imports_are_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(run_h200.REQUIRED, "no_such_module_for_the_gpu_check", "no-such-wheel")
    assert run_h200.main(["--out", str(tmp_path), "--dry-run"]) == 2
    assert capsys.readouterr().out == (
        "missing: no-such-wheel (carry them as wheels: benchmarks/gpu/README.md)\n"
    )
    assert not any(tmp_path.iterdir())


def test_unknown_phases_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_h200.main(["--out", str(tmp_path), "--dry-run", "--phases", "serving,gpu"]) == 2
    assert capsys.readouterr().out.splitlines()[-1] == (
        "unknown phases: gpu; known: environment, telemetry, serving, squeeze, llm"
    )


def test_it_runs_as_a_file_from_anywhere(tmp_path: Path) -> None:
    # as a file, its own folder must not lead sys.path: a module there named like a standard
    # one (it was platform.py) shadowed it, and torch's import failed
    command = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--dry-run", "--quick"]
    done = subprocess.run(
        [*command, "--phases", "environment"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _, phases = read(tmp_path / "phases.csv")
    assert [(r["phase"], r["status"]) for r in phases] == [("environment", "ok")]


def test_without_a_cuda_device_the_real_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_h200.main(["--out", str(tmp_path)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "no device: no CUDA device: torch.cuda.is_available() is False"
    _, phases = read(tmp_path / "phases.csv")
    assert [(r["phase"], r["status"]) for r in phases] == [("platform", "failed")]
