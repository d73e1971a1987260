"""``adaptive-batcher profile`` end to end, on the real example torch MLP and on a user module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs

from adaptive_batcher.cli.main import main
from adaptive_batcher.profile import load_profile

pytestmark = pytest.mark.usefixtures("pristine_structlog")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TABLE_HEADER = (
    "| batch | median ms | p99 ms | items/s | peak mem MiB | CV % | robust CV % | calls | note |"
)


def run_cli(*argv: str) -> int:
    """``adaptive-batcher profile ARGV...`` in this process, through the real entry point."""
    return main(["profile", *argv])


@pytest.fixture(autouse=True)
def _keep_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command makes the current directory importable; undo that after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_builtin_mlp_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    status = run_cli(
        "--batch-sizes", "1,2,4", "--repeats", "3", "--warmup", "1", "--device", "cpu",
        "--no-progress", "--out", str(out),
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0
    assert TABLE_HEADER in captured.out
    assert "# Profile of `adaptive_batcher.examples.mlp:mlp_batch_fn`" in captured.out
    assert "## Recommendation" in captured.out
    for name in ("profile.json", "profile.md", "profile.png"):
        assert (out / name).is_file()
        assert f"wrote {out / name}" in captured.out
    result, rec = load_profile(out / "profile.json")
    assert result.batch_sizes == (1, 2, 4)
    assert result.repeats == 3
    assert result.device == "cpu"
    assert rec is not None and rec.slo_latency_ms is None and rec.max_batch_size in (1, 2, 4)
    assert (out / "profile.png").read_bytes().startswith(PNG_SIGNATURE)
    assert TABLE_HEADER in (out / "profile.md").read_text(encoding="utf-8")
    assert "profiled" not in captured.err  # --no-progress


def test_builtin_mlp_with_slo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = run_cli(
        "--max-batch-size", "4", "--repeats", "2", "--warmup", "0", "--device", "cpu",
        "--slo-p99-ms", "5000", "--preprocess-ms", "1", "--window-fraction", "0.5",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 0
    result, rec = load_profile(tmp_path / "profile.json")
    assert result.batch_sizes == (1, 2, 4)
    assert rec is not None
    assert rec.slo_latency_ms == 5000.0
    assert rec.meets_slo is True
    compute_ms = result.row(rec.max_batch_size).p99_ms
    assert rec.window_ms == pytest.approx(0.5 * (5000.0 - 1.0 - compute_ms))
    assert "- SLO: p99 <= 5000 ms, can be met" in capsys.readouterr().out


def test_preprocessing_beyond_the_controllers_margin_is_profiled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the offline recommendation budgets the whole SLO (latency - preprocess = 5 ms here), not
    # the controller's target margin (0.8 * 50 = 40 ms would leave nothing after 45 ms)
    status = run_cli(
        "--batch-sizes", "1,2", "--repeats", "2", "--device", "cpu", "--no-progress",
        "--slo-p99-ms", "50", "--preprocess-ms", "45", "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 0
    captured = capsys.readouterr()
    assert "- preprocess 45 ms = 5 ms" in captured.out
    # online, SLO(50, preprocess_ms=45) needs a margin above 0.9: the user is told so
    warning = (
        "online, the controller aims at SLO.margin x the SLO (0.8 x 50 ms by default), "
        "which 45 ms of preprocessing leaves no time: give the batcher SLO(..., margin=...) "
        "above 0.9"
    )
    assert f"warning: {warning}\n" in captured.err
    # and the report says so too (it used to be on the console only), after any of the sweep's
    report = (tmp_path / "profile.md").read_text(encoding="utf-8")
    _, _, warnings = report.partition("\n## Warnings\n\n")
    assert f"- {warning}\n" in warnings.partition("\n## ")[0]


def test_unmeetable_slo_warns_on_stderr_and_still_succeeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = run_cli(
        "--batch-sizes", "1,2", "--repeats", "2", "--device", "cpu", "--no-progress",
        "--slo-p99-ms", "0.001",
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0
    assert "**cannot be met**" in captured.out
    assert "warning: SLO cannot be met: even batch 1" in captured.err


def test_progress_bar_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("--batch-sizes", "1,2", "--repeats", "1", "--device", "cpu") == 0
    captured = capsys.readouterr()
    assert "profiled 2 batch sizes" in captured.err
    assert "profiled 2 batch sizes" not in captured.out


def test_stdout_holds_the_report_not_the_info_log(capsys: pytest.CaptureFixture[str]) -> None:
    run_cli("--batch-sizes", "1", "--repeats", "1", "--device", "cpu", "--no-progress")
    captured = capsys.readouterr()
    assert TABLE_HEADER in captured.out
    assert "profile.started" not in captured.out + captured.err


def test_log_level_debug_shows_one_event_per_batch_size() -> None:
    with capture_logs() as logs:
        status = main(
            ["--log-level", "debug", "profile", "--batch-sizes", "1,2", "--repeats", "1",
             "--device", "cpu", "--no-progress"]
        )  # fmt: skip
    assert status == 0
    done = [entry for entry in logs if entry["event"] == "profile.batch_size_done"]
    assert [entry["batch_size"] for entry in done] == [1, 2]


USER_MODULE = """
def build():
    def model(batch):
        return [x * 2 for x in batch]
    return model

def make_batch(n):
    return list(range(n))

def not_a_factory():
    return 42

def needs_an_argument(size):
    return lambda batch: batch

def batch_of_nothing():
    return [1]

NOT_CALLABLE = 3

def no_memory(n):
    raise MemoryError

def build_raises():
    raise RuntimeError("no weights")

def broken():
    def model(batch):
        raise ValueError("broken model")
    return model

def contended():
    # batch 2 waits 20 ms on every call, as a batch size slowed by contention would:
    # larger batches run measurably faster than it
    import time

    def model(batch):
        if len(batch) == 2:
            time.sleep(0.02)
        return [x * 2 for x in batch]
    return model
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``user_model_<id>.py`` in a fresh current directory; returns its name."""
    name = f"user_model_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return name


def test_user_model_from_the_current_directory(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run_cli(
        f"{user_module}:build", "--input", f"{user_module}:make_batch",
        "--batch-sizes", "1,8,64", "--repeats", "3", "--no-progress", "--out", "res",
    )  # fmt: skip
    assert status == 0
    result, _ = load_profile(tmp_path / "res" / "profile.json")
    assert result.model_name == f"{user_module}:build"
    assert result.batch_sizes == (1, 8, 64)
    assert f"# Profile of `{user_module}:build`" in capsys.readouterr().out


def test_out_of_memory_at_the_smallest_size_exits_1(
    user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run_cli(
        f"{user_module}:build", "--input", f"{user_module}:no_memory", "--no-progress",
    )  # fmt: skip
    assert status == 1
    assert capsys.readouterr().err.endswith(
        "adaptive-batcher profile: the smallest batch size (1) ran out of memory; "
        "nothing to report\n"
    )


def test_a_model_that_raises_exits_3_with_its_error_and_no_traceback(
    user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run_cli(
        f"{user_module}:broken", "--input", f"{user_module}:make_batch", "--no-progress",
    )  # fmt: skip
    assert status == 3
    err = capsys.readouterr().err
    assert err.endswith(
        "adaptive-batcher profile: the model or --input raised ValueError: broken model\n"
    )
    assert "Traceback" not in err


def test_a_model_factory_that_raises_exits_3_with_its_error_and_no_traceback(
    user_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # MODEL's factory, not the model it returns, raises: the same exit status and one line
    status = run_cli(
        f"{user_module}:build_raises", "--input", f"{user_module}:make_batch", "--no-progress",
    )  # fmt: skip
    assert status == 3
    err = capsys.readouterr().err
    assert err == (
        f"adaptive-batcher profile: MODEL '{user_module}:build_raises' raised RuntimeError: "
        "no weights\n"
    )


# --- argument errors: exit status 2, a clear message, no traceback ---


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_such_module_xyz:build", "--input", "no_such_module_xyz:f"],
         "MODEL 'no_such_module_xyz:build': cannot import module 'no_such_module_xyz': "
         "No module named 'no_such_module_xyz'"),
        (["{mod}:missing", "--input", "{mod}:make_batch"],
         "MODEL '{mod}:missing': module '{mod}' has no attribute 'missing'"),
        (["{mod}:NOT_CALLABLE", "--input", "{mod}:make_batch"],
         "MODEL '{mod}:NOT_CALLABLE': 'NOT_CALLABLE' is not callable, got int"),
        (["{mod}:build", "--input", "{mod}:nope"],
         "--input '{mod}:nope': module '{mod}' has no attribute 'nope'"),
        (["{mod}:not_a_factory", "--input", "{mod}:make_batch"],
         "MODEL '{mod}:not_a_factory' returned int, which is not callable; it must return the "
         "batch callable model(batch)"),
        (["{mod}:needs_an_argument", "--input", "{mod}:make_batch"],
         "MODEL '{mod}:needs_an_argument' must be a function with no arguments that returns "
         "the model; it takes (size)"),
        (["{mod}:build", "--input", "{mod}:batch_of_nothing"],
         "--input '{mod}:batch_of_nothing' must be a function of one argument n that returns "
         "a batch of n; it takes ()"),
        (["{mod}:build"],
         "--input MODULE:FUNCTION is required with MODEL (function(n) returns a batch of n)"),
        (["--preprocess-ms", "2"],
         "--preprocess-ms needs --slo-p99-ms (it is subtracted from the SLO)"),
        (["--slo-p99-ms", "5", "--preprocess-ms", "6"],
         "SLO.preprocess_ms (6.0) must be below latency_ms (5.0)"),
        (["--device", "tpu"],
         "--device: device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
        (["--repeats", "5", "--max-repeats", "4"],
         "--max-repeats must be >= --repeats (5), got 4"),
    ],
)  # fmt: skip
def test_argument_errors_exit_2_with_a_clear_message(
    user_module: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [arg.replace("{mod}", user_module) for arg in argv]
    assert run_cli(*argv, "--no-progress") == 2
    captured = capsys.readouterr()
    assert (
        captured.err
        == f"adaptive-batcher profile: error: {message.replace('{mod}', user_module)}\n"
    )
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_cuda_device_without_cuda_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_cli("--device", "cuda") == 2
    assert "--device: device='cuda' but CUDA is not available" in capsys.readouterr().err


def test_builtin_model_without_torch_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    assert run_cli("--device", "cpu", "--no-progress") == 2
    assert capsys.readouterr().err == (
        "adaptive-batcher profile: error: the built-in example model needs torch: "
        "pip install 'adaptive-batcher[torch]', or pass your own MODEL and --input\n"
    )


def test_an_out_folder_that_cannot_be_made_fails_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a FileNotFoundError traceback after the whole sweep had run."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("x", encoding="utf-8")
    assert run_cli("--out", str(blocker / "sub")) == 2
    captured = capsys.readouterr()
    assert "cannot write --out" in captured.err
    assert TABLE_HEADER not in captured.out  # nothing was measured


def test_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "file.txt"
    file.write_text("x", encoding="utf-8")
    assert run_cli("--out", str(file)) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["nocolon"],
            "argument MODEL: MODEL must be 'module:function' (e.g. mypkg.serving:build_model), "
            "got 'nocolon'",
        ),
        (
            ["--batch-sizes", "1,x"],
            "argument --batch-sizes: --batch-sizes must be comma-separated ints, got '1,x'",
        ),
        (["--batch-sizes", "0,2"], "argument --batch-sizes: --batch-sizes[0] must be >= 1, got 0"),
        (["--repeats", "0"], "argument --repeats: --repeats must be >= 1, got 0"),
        (["--warmup", "-1"], "argument --warmup: --warmup must be >= 0, got -1"),
        (
            ["--window-fraction", "1.5"],
            "argument --window-fraction: --window-fraction must be a number in (0, 1], got 1.5",
        ),
        (
            ["--slo-p99-ms", "nan"],
            "argument --slo-p99-ms: --slo-p99-ms must be a finite number > 0, got nan",
        ),
        (
            ["--slo-p99-ms", "-5"],
            "argument --slo-p99-ms: --slo-p99-ms must be a finite number > 0, got -5.0",
        ),
        (["--input", "a:b:c"], "argument --input: --input must be 'module:function'"),
        (["--threads", "0"], "argument --threads: --threads must be >= 1, got 0"),
        (["--max-repeats", "x"], "argument --max-repeats: --max-repeats must be an int, got 'x'"),
        (
            ["--cv-threshold", "0"],
            "argument --cv-threshold: --cv-threshold must be a finite number > 0, got 0.0",
        ),
    ],
)
def test_malformed_options_are_rejected_by_argparse_with_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        run_cli(*argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_help_explains_model_and_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_cli("--help")
    assert info.value.code == 0
    out = capsys.readouterr().out
    for text in (
        "usage: adaptive-batcher profile [-h]",
        "MODEL",
        "--input MODULE:FUNCTION",
        "--slo-p99-ms MS",
        "built-in example",
        "callable model(batch)",
        "exit status: 0 done",
        "--threads N",
        "--max-repeats N",
        "--cv-threshold F",
        "NOT RELIABLE",
    ):
        assert text in out


def test_runs_as_a_command_and_fails_cleanly() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "adaptive_batcher.cli.main", "profile", "--batch-sizes", "1,2",
         "--repeats", "2", "--device", "cpu", "--no-progress"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert TABLE_HEADER in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "adaptive_batcher.cli.main", "profile", "no_such_mod_q:f",
         "--input", "no_such_mod_q:g"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "cannot import module 'no_such_mod_q'" in bad.stderr
    assert "Traceback" not in bad.stderr


# --- noise and threads ---


@pytest.fixture
def three_torch_threads() -> Iterator[None]:
    """torch at 3 intra-op threads during the test (so 1 and 2 are changes), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_threads_option_sets_torch_threads_for_the_sweep_and_reports_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], three_torch_threads: None
) -> None:
    status = run_cli(
        "--batch-sizes", "1,2", "--repeats", "2", "--device", "cpu", "--no-progress",
        "--threads", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 0
    result, _ = load_profile(tmp_path / "profile.json")
    assert result.torch_threads == 1
    assert result.torch_interop_threads == torch.get_num_interop_threads()
    assert f"Threads: torch intra-op 1, inter-op {torch.get_num_interop_threads()}" in (
        capsys.readouterr().out
    )
    assert torch.get_num_threads() == 3  # restored after the sweep


def test_without_threads_option_torch_threads_are_left_alone_and_reported(
    tmp_path: Path, three_torch_threads: None
) -> None:
    status = run_cli(
        "--batch-sizes", "1", "--repeats", "2", "--device", "cpu", "--no-progress",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert status == 0
    result, _ = load_profile(tmp_path / "profile.json")
    assert result.torch_threads == 3
    assert [row.repeats for row in result.rows] != [None]
    assert result.max_repeats == 10 and result.cv_threshold == 0.1


def test_more_threads_than_cores_warns_on_stderr(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    three_torch_threads: None,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    status = run_cli(
        "--batch-sizes", "1", "--repeats", "2", "--device", "cpu", "--no-progress",
        "--threads", "2",
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0
    assert (
        "warning: torch uses 2 intra-op threads but this process may run on only 1 CPU core(s)"
        in captured.err
    )
    assert "Threads: torch intra-op 2" in captured.out
    assert "1 CPU cores available to the process" in captured.out


def test_a_non_monotone_sweep_warns_and_the_recommendation_is_not_reliable(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run_cli(
        f"{user_module}:contended", "--input", f"{user_module}:make_batch",
        "--batch-sizes", "1,2,4,8", "--repeats", "3", "--warmup", "0", "--no-progress",
        "--out", "res",
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0
    result, rec = load_profile(tmp_path / "res" / "profile.json")
    assert result.noisy is True
    assert rec is not None and rec.noisy is True
    inversions = [w for w in result.warnings if w.startswith("latency not monotone")]
    assert [w.split(" (")[0] for w in inversions] == [
        "latency not monotone: batch 4", "latency not monotone: batch 8",
    ]  # fmt: skip
    for warning in result.warnings:
        assert f"warning: {warning}\n" in captured.err
        assert f"- {warning}\n" in captured.out
    assert "warning: recommendation NOT RELIABLE: cap " in captured.err
    assert "profile.noisy" not in captured.err  # said once, in words, not also as a log event
    assert "**recommendation NOT RELIABLE: cap " in captured.out
    assert "## Warnings" in (tmp_path / "res" / "profile.md").read_text(encoding="utf-8")


def test_threads_option_without_torch_exits_2(
    user_module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    status = run_cli(
        f"{user_module}:build", "--input", f"{user_module}:make_batch", "--threads", "1",
        "--no-progress",
    )  # fmt: skip
    assert status == 2
    assert capsys.readouterr().err == (
        "adaptive-batcher profile: error: --threads sets torch's thread count, but torch is "
        "not installed\n"
    )


def test_a_torch_free_model_runs_without_torch(
    user_module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    status = run_cli(
        f"{user_module}:build", "--input", f"{user_module}:make_batch", "--batch-sizes", "1,2",
        "--repeats", "2", "--device", "cpu", "--no-progress", "--out", "res",
    )  # fmt: skip
    assert status == 0
    result, _ = load_profile(tmp_path / "res" / "profile.json")
    assert result.torch_threads is None and result.torch_interop_threads is None
