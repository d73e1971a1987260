"""``adaptive-batcher replay`` on traces of other shapes (a named time column in s, ms or dates,
JSON Lines, a size column) and named trace scenarios pointed at a folder (``--traces-dir``).
Each test writes its own small trace."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adaptive_batcher.cli.main import build_parser, main
from adaptive_batcher.cli.replay_cmd import _REPLAY
from adaptive_batcher.sim.traces import load_trace

ONE_CONTENDER = ["--contender", "triton_like", "--no-best-static"]


def replay(tmp_path: Path, *arguments: str) -> int:
    return main(["replay", *arguments, *ONE_CONTENDER, "--out", str(tmp_path / "out")])


def err_text(capsys: pytest.CaptureFixture[str]) -> str:
    """stderr with rich's line wrapping undone."""
    return re.sub(r"\s+", " ", capsys.readouterr().err)


def test_a_json_lines_trace_with_ms_times_and_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "requests.jsonl"
    # 200 requests 5 ms apart: 1 s, 200 requests/s, were the times read as ms
    records = [{"arrived_ms": 5.0 * i, "prompt_tokens": 1 + i % 7} for i in range(200)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    read_as = ["--trace", str(trace), "--time-column", "arrived_ms", "--time-unit", "ms"]
    sized = ["--size-column", "prompt_tokens", "--max-units", "4", "--compress", "1"]
    assert replay(tmp_path, *read_as, *sized) == 0, capsys.readouterr().err
    table = (tmp_path / "out" / "replay.md").read_text()
    assert "| trace | triton_like | 201 |" in table  # goodput: 200 answers in 995 ms
    # the size option reaches the loader
    assert replay(tmp_path, *read_as, "--size-column", "tokens") == 2
    assert "line 1: no field 'tokens'; the record has arrived_ms, prompt_tokens" in err_text(capsys)


def test_a_csv_trace_with_epoch_seconds(tmp_path: Path) -> None:
    trace = tmp_path / "epoch.csv"
    trace.write_text(
        "id,ts\n" + "".join(f"{i},{1700000000 + 0.01 * i:.2f}\n" for i in range(100)),
        encoding="utf-8",
    )
    status = replay(tmp_path, "--trace", str(trace), "--time-column", "ts", "--time-unit", "s")
    assert status == 0
    assert "| trace | triton_like |" in (tmp_path / "out" / "replay.md").read_text()


def test_a_wrong_time_column_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "epoch.csv"
    trace.write_text("id,ts\n1,2\n", encoding="utf-8")
    assert replay(tmp_path, "--trace", str(trace)) == 2
    assert "no column 'TIMESTAMP'; the header has id, ts" in err_text(capsys)


def test_a_bad_time_unit_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--trace", "x.csv", "--time-unit", "us"])
    assert exit_info.value.code == 2
    assert "--time-unit" in capsys.readouterr().err


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:17:{i // 10:02d}.{i % 10}000000,10,1\n" for i in range(300)
)


def test_a_trace_stretched_past_a_week_of_replay_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --compress 1e-9 stretched this 5 s trace to 158 years and the replay died on a
    40 GiB numpy array (a traceback, exit 1)."""
    trace = tmp_path / "t.csv"
    trace.write_text("ts\n0\n1000\n2000\n5000\n", encoding="utf-8")
    read_as = ["--trace", str(trace), "--time-column", "ts", "--time-unit", "ms"]
    assert replay(tmp_path, *read_as, "--compress", "1e-9") == 2
    err = err_text(capsys)
    assert "--compress 1e-09: the trace (5 s in the file) would span 5e+09 s of replay" in err
    assert "give --compress 8.27e-06 or more" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before any replay
    # a week's span is still replayed: the limit is on replay time, not the file's
    assert replay(tmp_path, *read_as, "--compress", "1e-5") == 0


def test_the_compress_a_refusal_suggests_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5.977 s needs --compress 9.8826e-06 or more: the suggestion is rounded up (9.89e-06),
    where rounding to the nearest suggested 9.88e-06, itself refused."""
    trace = tmp_path / "t.csv"
    trace.write_text("ts\n0\n1000\n5977\n", encoding="utf-8")
    read_as = ["--trace", str(trace), "--time-column", "ts", "--time-unit", "ms"]
    assert replay(tmp_path, *read_as, "--compress", "1e-9") == 2
    assert "give --compress 9.89e-06 or more" in err_text(capsys)
    assert replay(tmp_path, *read_as, "--compress", "9.89e-06") == 0


def test_the_help_states_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    help_text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "exit status: 0 done, 2 bad arguments" in help_text


def test_the_help_says_sizes_below_one_count_as_one_unit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    help_text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "a size below 1 (0 or negative) is replayed as 1 unit, not refused" in help_text
    # as it does: sizes 0 and -3 replay as one unit each (4 requests, 4 units)
    trace = tmp_path / "sizes.csv"
    trace.write_text("ts,n\n0,0\n1,-3\n2,1\n3,1\n", encoding="utf-8")
    read_as = ["--trace", str(trace), "--time-column", "ts", "--time-unit", "ms"]
    assert replay(tmp_path, *read_as, "--size-column", "n", "--compress", "1") == 0
    loaded = load_trace(trace, time_column="ts", time_unit="ms", size_column="n")
    assert loaded.sizes.tolist() == [1, 1, 1, 1]


def test_a_named_trace_scenario_reads_from_the_traces_dir(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "azure_llm_2023_code.csv").write_text(AZURE, encoding="utf-8")
    status = replay(tmp_path, "--scenario", "azure_code", "--traces-dir", str(folder))
    assert status == 0
    assert "| azure_code | triton_like |" in (tmp_path / "out" / "replay.md").read_text()


def test_a_missing_scenario_trace_names_the_folder_and_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    status = replay(
        tmp_path, "--scenario", "step_3x", "--scenario", "azure_conv", "--traces-dir", str(empty)
    )
    assert status == 2
    err = err_text(capsys)
    assert "'azure_llm_2023_conv.csv' not found in" in err
    assert "empty" in err
    assert "--traces-dir" in err
    assert not (tmp_path / "out" / "replay.md").exists()  # nothing was replayed first


@pytest.mark.parametrize(
    "options",
    [["--max-units", "5"], ["--size-column", "tokens"], ["--time-unit", "ms"], ["--compress", "2"]],
)
def test_options_for_reading_a_trace_are_refused_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str]
) -> None:
    """Before: ignored, and the default replay ran as if they had not been given."""
    assert replay(tmp_path, "--scenario", "step_3x", *options) == 2
    assert f"{options[0]}: options for reading --trace, given without it" in err_text(capsys)
    assert not (tmp_path / "out" / "replay.md").exists()


def test_a_missing_service_profile_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the message pointed at --traces-dir."""
    assert replay(tmp_path, "--service", str(tmp_path / "missing.json")) == 2
    err = err_text(capsys)
    assert "no service profile file at" in err and "(--service)" in err
    assert "--traces-dir" not in err


def test_a_trace_and_named_scenarios_are_refused_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --scenario was ignored and only the trace replayed."""
    trace = tmp_path / "t.csv"
    trace.write_text("ts\n0\n5\n", encoding="utf-8")
    status = replay(tmp_path, "--trace", str(trace), "--time-unit", "ms", "--scenario", "step_3x")
    assert status == 2
    assert "--scenario and --trace: give one" in err_text(capsys)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--scenario", "step_3x"], "--scenario"),
        (["--trace", "x.csv"], "--trace"),
        (["--time-unit", "ms"], "--time-unit"),
        (["--no-best-static", "--seed", "3"], "--no-best-static, --seed"),
        (["--contender", "triton_like", "--out", "elsewhere"], "--contender, --out"),
    ],
)
def test_list_refuses_the_options_of_a_replay(
    capsys: pytest.CaptureFixture[str], options: list[str], named: str
) -> None:
    """Before: listed, as if the options had not been given (and ran nothing)."""
    assert main(["replay", "--list", *options]) == 2
    captured = capsys.readouterr()
    message = re.sub(r"\s+", " ", captured.err)
    assert f"{named}: options for a replay, given with --list" in message
    assert "give --list alone" in message
    assert captured.out == ""


def test_list_knows_every_option_of_a_replay_and_its_default() -> None:
    """A new replay option must join the table --list checks (or --list would ignore it)."""
    parsed = vars(build_parser().parse_args(["replay"]))
    options = {k: v for k, v in parsed.items() if k not in {"command", "log_level", "func", "list"}}
    assert options == _REPLAY


def _markdown_rows(text: str) -> dict[str, list[str]]:
    """replay.md's rows by contender: the cells after the contender's."""
    rows = [line.strip("|").split("|") for line in text.splitlines()[2:] if line]
    return {cells[1].strip(): [c.strip() for c in cells[2:]] for cells in rows}


def _console_rows(out: str) -> dict[str, list[str]]:
    """The console table's rows by contender (rich's box characters split the cells)."""
    rows = [line.strip("│").split("│") for line in out.splitlines() if line.startswith("│")]
    return {cells[1].strip(): [c.strip() for c in cells[2:]] for cells in rows}


def test_console_and_markdown_compare_a_shedding_contender_with_the_shedding_grid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the console table had no ``vs best``, ``vs oracle`` or ``ms per good``, and
    both tables compared ``adaptive_pid_shed`` with the best static setting *without*
    shedding (under overload shedding alone doubles a fixed setting's goodput)."""
    trace = tmp_path / "overload.csv"
    # 3000 requests at 25k req/s: 1.6x resnet50's capacity under the 50 ms SLO
    trace.write_text("ts\n" + "".join(f"{0.04 * i:.3f}\n" for i in range(3000)))
    status = main(
        [
            "replay",
            *("--trace", str(trace), "--time-column", "ts", "--time-unit", "ms"),
            *("--compress", "1", "--contender", "triton_like"),
            *("--contender", "adaptive_pid_shed", "--contender", "bentoml_cork"),
            *("--out", str(tmp_path / "out")),
        ]
    )
    assert status == 0
    markdown = _markdown_rows((tmp_path / "out" / "replay.md").read_text())
    console = _console_rows(capsys.readouterr().out)
    # no cost oracle: no static setting meets the SLO under this overload
    expected = {
        "triton_like",
        "adaptive_pid_shed",
        "bentoml_cork",
        "best_static",
        "best_static_shed",
    }
    assert set(markdown) == set(console) == expected

    def goodput(row: list[str]) -> float:
        return float(row[0].replace(",", ""))

    best, best_shed = goodput(markdown["best_static"]), goodput(markdown["best_static_shed"])
    assert best_shed > 1.5 * best  # the two yardsticks differ
    for name, reference in [
        ("triton_like", best),
        ("adaptive_pid_shed", best_shed),
        ("bentoml_cork", best_shed),  # it sheds by itself: before, compared with best
        ("best_static_shed", best_shed),
    ]:
        # markdown: goodput, vs best, attainment, p99, ms/req, vs oracle, ms per good, ...
        md, con = markdown[name], console[name]
        assert md[1] == f"{goodput(md) / reference:.2f}"
        # console: goodput/s, vs best, in SLO, p99 ms, dev ms/req, vs oracle, ms per good, ...
        assert (con[0], con[1], con[4], con[5], con[6]) == (md[0], md[1], md[4], md[5], md[6])
        assert con[5] == "-"  # vs oracle: there is no oracle


def _profile(path: Path, sizes: tuple[int, ...]) -> Path:
    from adaptive_batcher.profile.format import write_profile
    from adaptive_batcher.profile.result import ProfileResult, ProfileRow

    # overloaded steps: the queue fills batches up to the cap, far beyond the sizes measured
    rows = tuple(ProfileRow(n, 2 + n / 1e3, 2.5 + n / 1e3, n / (2 + n / 1e3), None) for n in sizes)
    return write_profile(path, ProfileResult(rows, None, "cpu", "tiny", 3))


@pytest.mark.parametrize(("sizes", "noted"), [((1, 2, 4, 8), True), ((1, 64, 512), False)])
def test_a_replay_beyond_the_profiled_sizes_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sizes: tuple[int, ...], noted: bool
) -> None:
    profile = _profile(tmp_path / "p.json", sizes)
    status = replay(tmp_path, "--service", str(profile), "--scenario", "steps")
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert status == 0
    assert ("the profile measured sizes up to 8" in out) is noted
    assert ("note: batches of up to" in out) is noted
