"""Trace shapes beyond the Azure CSV: a named time column in s, ms or dates (with zones), JSON
Lines records, a size column or field; and the trace scenarios' folder. Each test writes its
own small trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaptive_batcher.sim.scenarios import SLO_50, make_scenarios
from adaptive_batcher.sim.service import TableService
from adaptive_batcher.sim.traces import TIME_UNITS, find_trace, load_trace


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(tmp_path: Path, name: str, records: list[object]) -> Path:
    return write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in records))


def test_a_csv_with_epoch_seconds_in_a_named_column(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "s.csv",
        "request_id,arrival_s,tokens\n"
        "a,1700000000.5,12\n"
        "b,1700000000.0,30\n"  # out of order: sorted with its size
        "c,1700000002.25,7\n",
    )
    arrivals = load_trace(path, time_column="arrival_s", time_unit="s", size_column="tokens")
    np.testing.assert_allclose(arrivals.times_s, [0.0, 0.5, 2.25], atol=1e-6)
    assert arrivals.sizes.tolist() == [30, 12, 7]
    assert arrivals.duration_s == pytest.approx(2.25, abs=1e-6)


def test_a_csv_with_milliseconds_since_the_start(tmp_path: Path) -> None:
    path = write(tmp_path, "ms.csv", "t_ms\n0\n250\n250.5\n1000\n")
    arrivals = load_trace(path, time_column="t_ms", time_unit="ms", compress=10.0)
    np.testing.assert_allclose(arrivals.times_s, [0.0, 0.025, 0.02505, 0.1], atol=1e-12)
    assert np.all(arrivals.sizes == 1)


def test_dates_with_time_zones_are_taken_to_utc(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "zones.csv",
        "when\n2024-03-01T12:00:00Z\n2024-03-01T13:00:01+01:00\n2024-03-01 12:00:02.5\n",
    )
    arrivals = load_trace(path, time_column="when")  # datetime is the default unit
    np.testing.assert_allclose(arrivals.times_s, [0.0, 1.0, 2.5], atol=1e-9)


def test_json_lines_records_with_a_timestamp_and_a_size_field(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path,
        "trace.jsonl",
        [
            {"timestamp": "2023-11-16 18:17:00.0000000", "input_tokens": 100, "model": "x"},
            {"timestamp": "2023-11-16 18:17:00.5000000", "input_tokens": 8.0},
            {"timestamp": "2023-11-16 18:17:01.0000001", "input_tokens": "3"},
        ],
    )
    arrivals = load_trace(path, time_column="timestamp", size_column="input_tokens")
    np.testing.assert_allclose(arrivals.times_s, [0.0, 0.5, 1.0000001], atol=1e-12)
    assert arrivals.sizes.tolist() == [100, 8, 3]
    assert arrivals.name == "trace x1"


def test_json_lines_with_numeric_times_and_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "t.ndjson", '{"t": 10.5}\n\n{"t": 12}\n{"t": 11.0}\n')
    arrivals = load_trace(path, time_column="t", time_unit="s")
    np.testing.assert_allclose(arrivals.times_s, [0.0, 0.5, 1.5])


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('{"t": 1}\n{"u": 2}\n', r"j\.jsonl line 2: no field 't'; the record has u"),
        ('{"t": 1}\nnot json\n', r"j\.jsonl line 2: not a JSON record"),
        ('{"t": 1}\n[1, 2]\n', r"j\.jsonl line 2: a JSON object expected, got list"),
        ('{"t": 1}\n{"t": true}\n', r"j\.jsonl line 2: column 't': not a time in s"),
        ('{"t": 1}\n{"t": "soon"}\n', r"j\.jsonl line 2: column 't': not a time in s .*'soon'"),
        ("\n\n", r"j\.jsonl: no records"),
    ],
)
def test_bad_json_lines_name_the_line_and_field(tmp_path: Path, lines: str, message: str) -> None:
    path = write(tmp_path, "j.jsonl", lines)
    with pytest.raises(ValueError, match=message):
        load_trace(path, time_column="t", time_unit="s")


@pytest.mark.parametrize(
    ("size", "shown"), [(1.5, "1.5"), (True, "True"), ("many", "'many'"), (None, "None")]
)
def test_a_size_that_is_not_an_integer_is_refused(tmp_path: Path, size: object, shown: str) -> None:
    path = jsonl(tmp_path, "j.jsonl", [{"t": 0, "n": 1}, {"t": 1, "n": size}])
    with pytest.raises(ValueError, match=rf"j\.jsonl line 2: column 'n': not an integer: {shown}"):
        load_trace(path, time_column="t", time_unit="s", size_column="n")


def test_a_bad_time_in_a_numeric_column_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "n.csv", "t\n1\nnan\n")
    with pytest.raises(ValueError, match=r"n\.csv line 3: column 't': not a time in ms"):
        load_trace(path, time_column="t", time_unit="ms")


def test_a_date_that_does_not_parse_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "when\n2024-03-01T12:00:00Z\n01/03/2024\n")
    with pytest.raises(ValueError, match=r"d\.csv line 3: column 'when': not a timestamp"):
        load_trace(path, time_column="when")


@pytest.mark.parametrize("numbers", ["0\n5\n10\n12\n", "1700000000\n1700000001\n", "1.5e3\n"])
def test_numbers_read_as_dates_are_refused_with_the_unit_to_give(
    tmp_path: Path, numbers: str
) -> None:
    """Before: numpy read "12" as the year 12, and a 12 ms trace became days long."""
    path = write(tmp_path, "n.csv", "ts\n" + numbers)
    with pytest.raises(ValueError, match=r"n\.csv line 2: column 'ts': '.*' is a number, not a"):
        load_trace(path, time_column="ts")


def test_the_time_unit_is_checked() -> None:
    assert TIME_UNITS == ("datetime", "s", "ms")
    with pytest.raises(ValueError, match=r"time_unit must be one of 'datetime', 's', 'ms'"):
        load_trace("unused.csv", time_unit="us")


def test_a_missing_time_column_is_named_with_the_header(tmp_path: Path) -> None:
    path = write(tmp_path, "h.csv", "arrival_s\n1\n")
    with pytest.raises(ValueError, match=r"no column 'TIMESTAMP'; the header has arrival_s"):
        load_trace(path)


def test_find_trace_tries_csv_then_json_lines(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl", '{"t": 0}\n')
    write(tmp_path, "b.csv", "t\n0\n")
    write(tmp_path, "b.jsonl", '{"t": 0}\n')
    assert find_trace("a", tmp_path) == tmp_path / "a.jsonl"
    assert find_trace("b", tmp_path) == tmp_path / "b.csv"
    assert find_trace("b.jsonl", tmp_path) == tmp_path / "b.jsonl"
    assert find_trace("a.csv", tmp_path) is None


AZURE_ROWS = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:17:00.0,10,1\n2023-11-16 18:17:01.0,10,1\n2023-11-16 18:17:03.0,10,1\n"
)


def test_trace_scenarios_read_their_files_from_the_folder_given(tmp_path: Path) -> None:
    write(tmp_path, "azure_llm_2023_code.csv", AZURE_ROWS)
    scenarios = make_scenarios(TableService.from_h200("resnet50"), SLO_50, tmp_path)
    arrivals = scenarios["azure_code"].arrivals(0)
    np.testing.assert_allclose(arrivals.times_s, [0.0, 0.001, 0.003])  # compressed x1000
    with pytest.raises(FileNotFoundError, match=r"'azure_llm_2023_conv\.csv' not found in "):
        scenarios["azure_conv"].arrivals(0)
