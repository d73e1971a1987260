"""The command line: help, demo, replay (profile has its own, in test_profile_cmd.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from adaptive_batcher.cli.main import build_parser, main
from adaptive_batcher.sim.traces import load_trace

FIXTURE = Path(__file__).parents[1] / "sim" / "fixtures" / "tiny_trace.csv"


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "profile", "replay"):
        assert command in out


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["gateway", "--upstream", "http://h"], "warning"),
        (["--log-level", "info", "gateway", "--upstream", "http://h"], "info"),
        (["gateway", "--upstream", "http://h", "--log-level", "debug"], "debug"),
        (["--log-level", "error", "replay", "--log-level", "info"], "info"),
    ],
)
def test_log_level_goes_before_or_after_the_command(argv: list[str], level: str) -> None:
    assert build_parser().parse_args(argv).log_level == level


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from adaptive_batcher.cli import demo_cmd

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_cmd, "run", interrupted)
    assert main(["demo", "--duration", "1"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "adaptive-batcher demo: interrupted\n"
    assert "Traceback" not in captured.out


def test_demo_runs_and_summarises(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", "--duration", "2", "--rate", "200", "--burst-rate", "400"])
    out = capsys.readouterr().out
    assert status == 0
    assert "requests completed" in out
    assert "p99 latency, ms" in out
    assert "decisions" in out  # the controller ran
    completed = int(re.search(r"requests completed\s*│\s*(\d+)", out).group(1))  # type: ignore[union-attr]
    within = int(re.search(r"answered within the SLO \(50 ms\)\s*│\s*(\d+)", out).group(1))  # type: ignore[union-attr]
    assert 0 < within <= completed
    assert re.search(r"device time per request, ms\s*│\s*\d+\.\d{3}", out)
    assert re.search(r"torch threads where the model ran\s*│\s*1\s*│", out)  # the default
    assert re.search(r"model runs\s*│\s*thread \(--executor thread\)", out)


@pytest.mark.parametrize(
    ("option", "runs"), [("adaptive", "(thread|inline)"), ("inline", "inline")]
)
def test_demo_says_where_the_model_ran(
    option: str, runs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--executor adaptive`` was not offered, and the summary did not say where the model
    ran. The demo's MLP takes about 1 ms at its largest batch: adaptive runs it on the loop
    or in its thread, as warm-up finds it."""
    status = main(["demo", "--duration", "1", "--rate", "100", "--executor", option])
    out = capsys.readouterr().out
    assert status == 0
    assert re.search(rf"model runs\s*│\s*{runs} \(--executor {option}\)", out)


def test_a_static_demo_says_its_slo_is_only_judged(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "SLO p99, ms: none" beside "answered within the SLO (50 ms)"."""
    status = main(["demo", "--static", "--duration", "1", "--rate", "100", "--burst-rate", "100"])
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert status == 0
    assert re.search(r"SLO p99, ms │ 50, judged only", out)  # the rest may wrap
    assert "controller │ off" in out


def test_the_demo_summary_starts_on_its_own_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: captured or piped, the summary's title followed the live table's bottom border
    on the same line (rich's Live ends its last line only on a terminal)."""
    status = main(["demo", "--static", "--duration", "1", "--rate", "100", "--burst-rate", "100"])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0
    titles = [line for line in lines if "summary (latency" in line]
    assert titles
    assert all(line.strip().startswith("summary (latency") for line in titles)
    assert lines[lines.index(titles[0]) - 1].startswith("└")  # right below the live table
    # a 1 s run's latency covers that second, not the histogram's 10 s span
    assert re.search(r"the\s+last\s+1\s+s\s+of", " ".join(lines))


@pytest.fixture
def three_torch_threads() -> Iterator[None]:
    """torch at 3 intra-op threads during the test (so 1 and 2 are changes), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("option", "expected"), [("2", "2"), ("0", "3")])
def test_demo_torch_threads_option_reaches_the_model_thread(
    option: str, expected: str, capsys: pytest.CaptureFixture[str], three_torch_threads: None
) -> None:
    status = main(["demo", "--duration", "1", "--rate", "100", "--torch-threads", option])
    out = capsys.readouterr().out
    assert status == 0
    # the count torch reports inside the batcher's model thread (0: torch's own, here 3)
    assert re.search(rf"torch threads where the model ran\s*│\s*{expected}\s*│", out)
    assert torch.get_num_threads() == 3  # restored after the run


def test_demo_help_says_why_one_torch_thread(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "--torch-threads" in out
    assert "the event loop needs a core" in " ".join(out.split())


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--duration", "0", "--duration must be a finite number > 0, got 0.0"),
        ("--window-ms", "nan", "--window-ms must be a finite number >= 0, got nan"),
        ("--max-batch-size", "2.5", "--max-batch-size must be an int, got '2.5'"),
        ("--max-batch-size", "0", "--max-batch-size must be >= 1, got 0"),
        ("--rate", "fast", "--rate must be a number, got 'fast'"),
        ("--torch-threads", "-1", "--torch-threads must be >= 0, got -1"),
        ("--torch-threads", "1.5", "--torch-threads must be an int, got '1.5'"),
        ("--seed", "-1", "--seed must be >= 0, got -1"),  # as replay's (it was accepted)
    ],
)
def test_demo_rejects_bad_numbers(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", option, value])
    assert exit_info.value.code == 2
    assert f"error: argument {option}: {message}\n" in capsys.readouterr().err


def test_replay_of_a_trace_writes_table_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "replay",
            "--trace",
            str(FIXTURE),
            "--compress",
            "10",
            "--contender",
            "triton_like",
            "--contender",
            "adaptive_pid_shed",
            "--no-best-static",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    table = (tmp_path / "replay.md").read_text()
    assert "| trace | triton_like |" in table
    assert "| trace | adaptive_pid_shed |" in table
    for png in ("replay_goodput.png", "replay_trace.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "goodput" in out
    # what the compression made of the trace is said, before the table
    arrivals = load_trace(FIXTURE, compress=10.0)
    span_s = arrivals.duration_s
    assert (
        f"trace: {arrivals.times_s.size:,} requests over {span_s:.3g} s after --compress 10 "
        f"({span_s * 10:.3g} s in the file): {arrivals.rate_rps:,.0f} req/s"
    ) in out


def test_replay_lists_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--list"]) == 0
    out = capsys.readouterr().out
    assert "step_3x" in out
    assert "bentoml_cork" in out


def test_replay_missing_trace_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--trace", str(tmp_path / "nope.csv")]) == 2
    assert "no trace at" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--compress", "0", "--compress must be a finite number > 0, got 0.0"),
        ("--slo-p99-ms", "-5", "--slo-p99-ms must be a finite number > 0, got -5.0"),
        ("--seed", "-1", "--seed must be >= 0, got -1"),
        ("--seed", "x", "--seed must be an int, got 'x'"),
    ],
)
def test_replay_rejects_bad_numbers_before_running(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", option, value, "--list"])
    assert exit_info.value.code == 2
    assert f"error: argument {option}: {message}\n" in capsys.readouterr().err


def test_replay_reports_an_unwritable_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    status = main(
        [
            "replay",
            "--trace",
            str(FIXTURE),
            "--contender",
            "triton_like",
            "--no-best-static",
            "--out",
            str(blocker / "out"),
        ]
    )
    assert status == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "replay", "gateway"])
def test_a_sub_commands_help_is_plain_text(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = capsys.readouterr().out
    assert f"adaptive-batcher {command}" in shown and "``" not in shown
