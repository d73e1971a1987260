"""The trace loader, on a tiny fixture and on the shared Azure code trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adaptive_batcher.sim.traces import TRACE_DIR, find_trace, load_trace

FIXTURE = Path(__file__).parent / "fixtures" / "tiny_trace.csv"
FIXTURE_TIMES_S = [0.0, 0.5, 1.0, 2.25, 5.0, 5.0000001, 9.9999999, 10.0]
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_loads_relative_times_at_0_1_us_resolution() -> None:
    arrivals = load_trace(FIXTURE)
    np.testing.assert_allclose(arrivals.times_s, FIXTURE_TIMES_S, rtol=0, atol=1e-12)
    assert arrivals.times_s[5] - arrivals.times_s[4] == pytest.approx(1e-7, abs=1e-12)
    assert np.all(arrivals.sizes == 1)
    assert arrivals.duration_s == 10.0
    assert arrivals.rate_rps == pytest.approx(0.8)
    assert arrivals.name == "tiny_trace x1"


def test_compression_scales_times_and_rate() -> None:
    arrivals = load_trace(FIXTURE, compress=100.0)
    np.testing.assert_allclose(arrivals.times_s, np.array(FIXTURE_TIMES_S) / 100, atol=1e-14)
    assert arrivals.duration_s == pytest.approx(0.1)
    assert arrivals.rate_rps == pytest.approx(80.0)
    assert arrivals.name == "tiny_trace x100"


def test_window_in_trace_seconds() -> None:
    arrivals = load_trace(FIXTURE, start_s=1.0, duration_s=4.0)
    np.testing.assert_allclose(arrivals.times_s, [0.0, 1.25], atol=1e-12)
    assert arrivals.duration_s == 4.0
    tail = load_trace(FIXTURE, start_s=5.0, duration_s=5.0, compress=10.0)
    np.testing.assert_allclose(tail.times_s, [0.0, 1e-8, 0.49999999], atol=1e-12)
    assert tail.duration_s == pytest.approx(0.5)


def test_window_keeps_an_idle_start_and_runs_to_the_end_by_default() -> None:
    arrivals = load_trace(FIXTURE, start_s=3.0)
    np.testing.assert_allclose(arrivals.times_s, [2.0, 2.0000001, 6.9999999, 7.0], atol=1e-12)
    assert arrivals.duration_s == 7.0


def test_sizes_from_a_column_clipped() -> None:
    context = load_trace(FIXTURE, size_column="ContextTokens", max_units=8192)
    assert context.sizes.tolist() == [100, 8192, 300, 1, 4000, 50, 8192, 1]
    generated = load_trace(FIXTURE, size_column="GeneratedTokens")
    assert generated.sizes.tolist() == [10, 1, 5, 7, 1, 2, 3, 4]
    assert generated.sizes.dtype == np.int64


def test_unsorted_rows_are_sorted_with_their_sizes(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        HEADER + "2023-11-16 18:17:02.0,20,1\n2023-11-16 18:17:00.0,10,1\n"
        "\n"  # blank lines are skipped
        "2023-11-16 18:17:01.0,30,1\n",
    )
    arrivals = load_trace(path, size_column="ContextTokens")
    np.testing.assert_allclose(arrivals.times_s, [0.0, 1.0, 2.0])
    assert arrivals.sizes.tolist() == [10, 30, 20]


def test_missing_timestamp_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "time,ContextTokens\n1,2\n")
    with pytest.raises(ValueError, match=r"t\.csv: no column 'TIMESTAMP'; the header has time"):
        load_trace(path)


def test_missing_size_column() -> None:
    with pytest.raises(ValueError, match=r"tiny_trace\.csv: no column 'Tokens'; the header has "):
        load_trace(FIXTURE, size_column="Tokens")


def test_bad_timestamp_names_file_column_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "2023-11-16 18:17:00.0,1,1\n16/11/2023 18:17,1,1\n")
    with pytest.raises(
        ValueError, match=r"t\.csv line 3: column 'TIMESTAMP': not a timestamp like .*'16/11/2023"
    ):
        load_trace(path)


def test_empty_timestamp(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + ",1,1\n")
    with pytest.raises(ValueError, match=r"t\.csv line 2: column 'TIMESTAMP': not a timestamp"):
        load_trace(path)


def test_bad_size_names_file_column_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "2023-11-16 18:17:00.0,1,1\n2023-11-16 18:17:01.0,1.5,1\n")
    with pytest.raises(
        ValueError, match=r"t\.csv line 3: column 'ContextTokens': not an integer: '1\.5'"
    ):
        load_trace(path, size_column="ContextTokens")


def test_short_row(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "2023-11-16 18:17:00.0,1\n")
    with pytest.raises(ValueError, match=r"t\.csv line 2: 2 fields, fewer than the header's 3"):
        load_trace(path, size_column="GeneratedTokens")


def test_empty_file_and_header_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"empty\.csv: empty file"):
        load_trace(_write(tmp_path, "", "empty.csv"))
    with pytest.raises(ValueError, match=r"head\.csv: no data rows"):
        load_trace(_write(tmp_path, HEADER, "head.csv"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "absent.csv")


def test_start_past_the_end() -> None:
    with pytest.raises(ValueError, match=r"tiny_trace\.csv: start_s=11\.0 is past the end"):
        load_trace(FIXTURE, start_s=11.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compress": 0.0}, "compress must be finite and > 0"),
        ({"start_s": -1.0}, "start_s must be finite and >= 0"),
        ({"duration_s": 0.0}, "duration_s must be finite and > 0 or None"),
        ({"max_units": 0}, "max_units must be an integer >= 1 or None"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_trace(FIXTURE, **kwargs)  # type: ignore[arg-type]


def test_find_trace(tmp_path: Path) -> None:
    (tmp_path / "mine.csv").write_text(HEADER, encoding="utf-8")
    assert find_trace("mine", tmp_path) == tmp_path / "mine.csv"
    assert find_trace("mine.csv", tmp_path) == tmp_path / "mine.csv"
    assert find_trace("other", tmp_path) is None
    assert find_trace("mine", tmp_path / "no_such_folder") is None


def test_trace_dir_is_shared_next_to_the_repository() -> None:
    repo_root = Path(__file__).resolve().parents[2]
    assert (repo_root / ".." / "shared" / "traces").resolve() == TRACE_DIR


def test_the_default_trace_folder_is_adaptive_batcher_traces_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh user's checkout without ../shared: ``ADAPTIVE_BATCHER_TRACES``, which the README
    names, was read by the LLM scenarios only, and the share scenarios' trace was not found."""
    from adaptive_batcher.sim.traces import default_trace_dir

    (tmp_path / "mine.csv").write_text("TIMESTAMP\n2023-11-16 18:17:03.0\n")
    monkeypatch.setenv("ADAPTIVE_BATCHER_TRACES", str(tmp_path))
    assert default_trace_dir() == tmp_path
    assert find_trace("mine") == tmp_path / "mine.csv"
    monkeypatch.delenv("ADAPTIVE_BATCHER_TRACES")
    assert default_trace_dir() == TRACE_DIR
