"""Every user-facing file format, fuzzed: trace CSV and JSON Lines, profile JSON, preset TOML.

A corpus of malformed files (encodings, byte-order marks, quotes, huge fields, nesting, extreme
timestamps, NaN, keys given twice) pins each error's message, and hypothesis throws random
bytes and mutated valid files at each loader: a file either loads, with every row it holds, or
raises the loader's typed error (a ``ValueError``) whose message starts with the file's path.
The replay command prints such an error as one line on stderr and exits with status 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptive_batcher.cli.main import main
from adaptive_batcher.presets import PresetError, load_preset
from adaptive_batcher.profile.format import ProfileFormatError, load_profile
from adaptive_batcher.sim.traces import load_trace

PROFILE = Path(__file__).parents[1] / "adaptive_batcher" / "data" / "cpu" / "mlp_epyc_2core.json"
PRESET = Path(__file__).parents[1] / "policies" / "search.toml"


def attempt(load: Callable[..., Any], error: type[Exception], *args: Any, **kwargs: Any) -> Any:
    """``load(*args, **kwargs)``, or the ``error`` it raised (returned, not raised)."""
    try:
        return load(*args, **kwargs)
    except error as exc:
        return exc


FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

NUMBERS = {"time_column": "ts", "time_unit": "s"}
SIZED = {**NUMBERS, "size_column": "n"}

# name: (file bytes, load_trace options, the message after "<path>")
TRACE_CORPUS: dict[str, tuple[bytes, dict[str, Any], str]] = {
    "latin-1.csv": (
        "ts,who\n1,café\n".encode("latin-1"),
        NUMBERS,
        " line 2: not UTF-8 text (byte 0xe9 at offset 12); save the trace as UTF-8",
    ),
    "utf-16.csv": (
        "ts\n1\n".encode("utf-16"),
        NUMBERS,
        " line 1: not UTF-8 text (byte 0xff at offset 0); save the trace as UTF-8",
    ),
    "open-quote.csv": (
        b'ts,n\n1,"3\n2,4\n3,5\n',
        SIZED,
        " line 4: not valid CSV: a quoted field is not closed before the end of the file",
    ),
    "stray-quote.csv": (
        b'ts,n\n1,"3"x\n',
        SIZED,
        " line 2: not valid CSV: ',' expected after '\"'",
    ),
    "huge-field.csv": (
        b"ts,n\n1," + b"9" * 200_000 + b"\n",
        SIZED,
        " line 2: not valid CSV: field larger than field limit (131072)",
    ),
    "extra-field.csv": (b"ts\n1\n2,3\n", NUMBERS, " line 3: 2 fields, more than the header's 1"),
    "twice-in-header.csv": (
        b"ts,ts\n1,2\n",
        NUMBERS,
        ": column 'ts' appears 2 times in the header; which one holds the data is ambiguous",
    ),
    "nan.csv": (
        b"ts\n1\nnan\n",
        NUMBERS,
        " line 3: column 'ts': not a time in s (a finite number): 'nan'",
    ),
    "span-overflow.csv": (
        b"ts\n1e308\n-1e308\n",
        NUMBERS,
        " line 2: column 'ts': the times span more than a float holds (from -1e+308 to 1e+308 s)",
    ),
    "year-9999.csv": (
        b"TIMESTAMP\n2023-11-16 18:17:03.9799600\n9999-12-31 00:00:00\n",
        {},
        " line 3: column 'TIMESTAMP': '9999-12-31 00:00:00' is outside the years 1678-2261 "
        "that nanosecond timestamps hold",
    ),
    "year-1.csv": (
        b"TIMESTAMP\n0001-01-01 00:00:00\n",
        {},
        " line 2: column 'TIMESTAMP': '0001-01-01 00:00:00' is outside the years 1678-2261 "
        "that nanosecond timestamps hold",
    ),
    "year-9999-zoned.csv": (
        b"TIMESTAMP\n9999-12-31T00:00:00+05:00\n",
        {},
        " line 2: column 'TIMESTAMP': '9999-12-31T00:00:00+05:00' is outside the years "
        "1678-2261 that nanosecond timestamps hold",
    ),
    "huge-size.csv": (
        b"ts,n\n1,99999999999999999999999\n",
        SIZED,
        " line 2: column 'n': a size beyond a 64-bit integer: '99999999999999999999999'",
    ),
    "markup.csv": (
        b"ts\n1\n[/b]\n",
        NUMBERS,
        " line 3: column 'ts': not a time in s (a finite number): '[/b]'",
    ),
    "deep.jsonl": (
        b'{"ts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        NUMBERS,
        " line 1: not a JSON record: nested too deeply",
    ),
    "twice.jsonl": (b'{"ts": 1}\n{"ts": 1, "ts": 2}\n', NUMBERS, " line 2: field 'ts' given twice"),
    "latin-1.jsonl": (
        '{"ts": 1}\n{"ts": 2, "who": "café"}\n'.encode("latin-1"),
        NUMBERS,
        " line 2: not UTF-8 text (byte 0xe9 at offset 31); save the trace as UTF-8",
    ),
    "long-number.jsonl": (
        b'{"ts": 1' + b"0" * 5000 + b"}\n",
        NUMBERS,
        " line 1: not a JSON record: Exceeds the limit (4300 digits) for integer string "
        "conversion: value has 5001 digits; use sys.set_int_max_str_digits() to increase the "
        "limit",
    ),
    "nan.jsonl": (
        b'{"ts": NaN}\n',
        NUMBERS,
        " line 1: column 'ts': not a time in s (a finite number): nan",
    ),
}


@pytest.mark.parametrize("name", list(TRACE_CORPUS))
def test_a_malformed_trace_names_the_file_line_and_problem(tmp_path: Path, name: str) -> None:
    data, options, problem = TRACE_CORPUS[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError, match=f"^{re.escape(f'{path}{problem}')}$") as caught:
        load_trace(path, **options)
    assert type(caught.value) is ValueError


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_byte_order_mark_is_read_as_the_start_of_the_file(tmp_path: Path, suffix: str) -> None:
    """Before: the CSV header's first column became '\\ufeffts' and the first JSON line 'not a
    JSON record'."""
    path = tmp_path / f"bom{suffix}"
    text = "ts\n1\n2\n" if suffix == ".csv" else '{"ts": 1}\n{"ts": 2}\n'
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_trace(path, **NUMBERS).times_s.tolist() == [0.0, 1.0]


def rows_of(times: list[int], sizes: list[int]) -> str:
    return "ts,n\n" + "".join(f"{t},{n}\n" for t, n in zip(times, sizes, strict=True))


TRACE_ROWS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 64)), min_size=1, max_size=30)
# mutations with no quote character: whatever still loads must keep every line as a row
NO_QUOTE_BYTES = st.binary(min_size=1, max_size=4).filter(lambda b: b'"' not in b)


@FUZZ
@given(rows=TRACE_ROWS, at=st.floats(0.0, 1.0), insert=NO_QUOTE_BYTES, cut=st.integers(0, 3))
def test_a_mutated_csv_trace_loads_every_row_or_says_why(
    tmp_path: Path, rows: list[tuple[int, int]], at: float, insert: bytes, cut: int
) -> None:
    data = rows_of([t for t, _ in rows], [n for _, n in rows]).encode()
    where = int(at * len(data))
    mutated = data[:where] + insert + data[where + cut :]
    path = tmp_path / "mutated.csv"
    path.write_bytes(mutated)
    arrivals = attempt(load_trace, ValueError, path, **SIZED)
    if isinstance(arrivals, ValueError):
        assert str(arrivals).startswith(str(path)), arrivals
        return
    text = mutated.decode("utf-8-sig")
    data_lines = [line for line in re.split(r"\r\n|\r|\n", text)[1:] if line.strip()]
    assert len(arrivals) == len(data_lines)  # no row silently dropped


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".csv", ".jsonl"]))
def test_random_bytes_as_a_trace_load_or_raise_a_value_error_naming_the_file(
    tmp_path: Path, data: bytes, suffix: str
) -> None:
    path = tmp_path / f"random{suffix}"
    path.write_bytes(b"ts,n\n" + data if suffix == ".csv" else data)
    loaded = attempt(load_trace, ValueError, path, **SIZED)
    if isinstance(loaded, ValueError):
        assert str(loaded).startswith(str(path)), loaded


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@FUZZ
@given(records=st.lists(JSON_VALUES, min_size=1, max_size=5))
def test_random_json_lines_load_every_record_or_say_which_line(
    tmp_path: Path, records: list[Any]
) -> None:
    path = tmp_path / "random.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    arrivals = attempt(load_trace, ValueError, path, **NUMBERS)
    if isinstance(arrivals, ValueError):
        assert re.match(rf"{re.escape(str(path))}(:| line \d+:) ", str(arrivals)), arrivals
        return
    assert len(arrivals) == len(records)


# -- profile JSON ----------------------------------------------------------------------------


def test_profile_json_corpus(tmp_path: Path) -> None:
    good = PROFILE.read_bytes()
    corpus = {
        "deep.json": (b"[" * 100_000 + b"]" * 100_000, ": not valid JSON: nested too deeply"),
        "twice.json": (
            good.replace(b"{", b'{"schema": "other", ', 1),
            ": key 'schema': given twice in one object (JSON keeps the last)",
        ),
        "long-number.json": (
            b'{"schema": 1' + b"0" * 5000 + b"}",
            ": not valid JSON: Exceeds the limit (4300 digits) for integer string conversion: "
            "value has 5001 digits; use sys.set_int_max_str_digits() to increase the limit",
        ),
    }
    for name, (data, problem) in corpus.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ProfileFormatError) as caught:
            load_profile(path)
        assert str(caught.value) == f"{path}{problem}"
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + good)
    assert load_profile(bom) == load_profile(PROFILE)


def mutations(doc: Any) -> st.SearchStrategy[Any]:
    """``doc`` with one value somewhere replaced by a random JSON value, or a key dropped."""
    paths: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(value, dict | list):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                walk(child, (*path, key))

    walk(doc, ())

    def apply(path: tuple[Any, ...], replacement: Any, drop: bool) -> Any:
        copy = json.loads(json.dumps(doc))
        if not path:
            return replacement
        parent = copy
        for key in path[:-1]:
            parent = parent[key]
        if drop and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
        return copy

    return st.builds(apply, st.sampled_from(paths), JSON_VALUES, st.booleans())


@FUZZ
@given(data=st.data())
def test_a_mutated_profile_loads_or_raises_profile_format_error(
    tmp_path: Path, data: st.DataObject
) -> None:
    document = data.draw(mutations(json.loads(PROFILE.read_text(encoding="utf-8"))))
    path = tmp_path / "mutated.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    loaded = attempt(load_profile, ProfileFormatError, path)
    if isinstance(loaded, ProfileFormatError):
        assert str(loaded).startswith(f"{path}: "), loaded


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_as_a_profile_raise_profile_format_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "random.json"
    path.write_bytes(data)
    with pytest.raises(ProfileFormatError) as caught:
        load_profile(path)
    assert str(caught.value).startswith(f"{path}: ")


# -- preset TOML -----------------------------------------------------------------------------


def test_preset_toml_corpus(tmp_path: Path) -> None:
    corpus = {
        "deep.toml": (
            b"[batcher]\nbatch_sizes = " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
            ": invalid TOML: arrays or tables nested too deeply",
        ),
        "long-number.toml": (
            b"[batcher]\nmax_batch_size = 1" + b"0" * 5000 + b"\n",
            ": invalid TOML: Exceeds the limit (4300 digits) for integer string conversion: "
            "value has 5001 digits; use sys.set_int_max_str_digits() to increase the limit",
        ),
        "nan.toml": (
            b"[slo]\nlatency_ms = nan\n",
            ": key 'slo.latency_ms': latency_ms must be a finite number > 0, got nan",
        ),
        "utf-16.toml": (
            "[slo]\nlatency_ms = 5\n".encode("utf-16"),
            ": not UTF-8 text (byte 0xff at offset 0); TOML files must be UTF-8",
        ),
    }
    for name, (data, problem) in corpus.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(PresetError) as caught:
            load_preset(path)
        assert str(caught.value) == f"{path}{problem}"
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + PRESET.read_bytes())
    assert load_preset(bom).slo == load_preset(PRESET).slo


@FUZZ
@given(at=st.floats(0.0, 1.0), insert=st.binary(min_size=1, max_size=6), cut=st.integers(0, 6))
def test_a_mutated_preset_loads_or_raises_preset_error(
    tmp_path: Path, at: float, insert: bytes, cut: int
) -> None:
    good = PRESET.read_bytes()
    where = int(at * len(good))
    path = tmp_path / "mutated.toml"
    path.write_bytes(good[:where] + insert + good[where + cut :])
    loaded = attempt(load_preset, PresetError, path)
    if isinstance(loaded, PresetError):
        assert str(loaded).startswith(f"{path}: "), loaded


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["markup.csv", "open-quote.csv", "latin-1.csv", "deep.jsonl"])
def test_the_replay_command_prints_a_bad_trace_as_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Before: rich read a cell like '[/b]' in the message as markup and crashed with a
    traceback; long messages were wrapped over several lines."""
    data, options, problem = TRACE_CORPUS[name]
    path = tmp_path / name
    path.write_bytes(data)
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    status = main(["replay", "--trace", str(path), *flags, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2
    assert err == f"adaptive-batcher replay: {path}{problem}\n"


def test_the_replay_command_prints_a_bad_profile_as_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    status = main(["replay", "--service", str(path), "--out", str(tmp_path / "out")])
    assert status == 2
    err = capsys.readouterr().err
    assert err == f"adaptive-batcher replay: {path}: not valid JSON: nested too deeply\n"
