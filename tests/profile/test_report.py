"""JSON round trip and loader errors, the markdown report, the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adaptive_batcher import SLO
from adaptive_batcher.profile import (
    SCHEMA,
    ProfileFormatError,
    ProfileResult,
    ProfileRow,
    Recommendation,
    find_knee,
    load_profile,
    markdown_report,
    markdown_table,
    noise_warnings,
    plot_profile,
    profile_to_dict,
    recommend,
    write_profile,
)
from tests.profile.fakes import RESNET50_H200, table_result

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_json_round_trip(resnet50: ProfileResult, tmp_path: Path) -> None:
    rec = recommend(resnet50, SLO(latency_ms=10.0, preprocess_ms=2.0))
    path = write_profile(tmp_path / "profile.json", resnet50, recommendation=rec)
    assert path == tmp_path / "profile.json"
    loaded, loaded_rec = load_profile(path)
    assert loaded == resnet50
    assert loaded_rec == rec
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary left over


def test_json_round_trip_without_recommendation_and_with_oom(tmp_path: Path) -> None:
    rows = (ProfileRow(1, 0.5, 0.75, 2000.0, None), ProfileRow(2, 0.625, 1, 3200.0, None))
    result = ProfileResult(rows, 8, "cpu", "m", 3)
    write_profile(tmp_path / "p.json", result)
    loaded, rec = load_profile(tmp_path / "p.json")
    assert loaded == result
    assert rec is None


def test_json_schema_is_exactly_the_documented_one(resnet50: ProfileResult, tmp_path: Path) -> None:
    rec = recommend(resnet50)
    write_profile(tmp_path / "p.json", resnet50, recommendation=rec)
    doc = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert list(doc) == [
        "schema", "model", "device", "repeats", "max_repeats", "cv_threshold", "torch_threads",
        "torch_interop_threads", "available_cores", "noisy", "warnings", "rows", "oom_batch_size",
        "knee", "recommendation",
    ]  # fmt: skip
    assert doc["schema"] == SCHEMA == "adaptive_batcher.profile/1"
    assert doc["model"] == "resnet50"
    assert doc["device"] == "cuda:0 (NVIDIA H200)"
    assert doc["repeats"] == 20
    assert doc["oom_batch_size"] is None
    for key in ("max_repeats", "cv_threshold", "torch_threads", "torch_interop_threads"):
        assert doc[key] is None  # a hand-made result: not recorded
    assert doc["available_cores"] is None
    assert doc["noisy"] is False
    assert doc["warnings"] == []
    assert doc["rows"][7] == {
        "batch_size": 128,
        "median_ms": 8.778,
        "p99_ms": 8.807,
        "items_per_s": 14581.9,
        "peak_mem_bytes": round(972.4 * 1024 * 1024),
        "repeats": None,
        "cv": None,
        "robust_cv": None,
    }
    assert doc["knee"] == {
        "batch_size": 128,
        "median_ms": 8.778,
        "p99_ms": 8.807,
        "items_per_s": 14581.9,
        "method": "kneedle",
    }
    assert doc["recommendation"] == {
        "max_batch_size": 128,
        "window_ms": rec.window_ms,
        "slo_p99_ms": None,
        "meets_slo": True,
        "reasons": list(rec.reasons),
        "noisy": False,
        "warnings": [],
    }
    assert profile_to_dict(resnet50, recommendation=rec) == doc


def test_explicit_knee_is_written(resnet50: ProfileResult) -> None:
    knee = find_knee(resnet50.rows[:3])
    assert profile_to_dict(resnet50, knee=knee)["knee"]["batch_size"] == knee.batch_size


def test_a_profile_without_rows_cannot_be_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^cannot write") as info:
        write_profile(tmp_path / "p.json", ProfileResult((), 1, "cpu", "m", 1))
    assert str(info.value) == (
        "cannot write a profile with no rows (batch size 1 already ran out of memory)"
    )


# --- loader errors: each names the file and the key ---


def _good_doc(resnet50: ProfileResult) -> dict[str, Any]:
    return profile_to_dict(resnet50, recommendation=recommend(resnet50, SLO(latency_ms=50.0)))


def _set(doc: dict[str, Any], key: str, value: Any) -> None:
    """Set a key given as a path like ``rows[1].median_ms``; ``...`` deletes it."""
    parts = key.replace("[", ".").replace("]", "").split(".")
    target: Any = doc
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last: Any = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    if value is ...:
        del target[last]
    else:
        target[last] = value


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("schema", "other/2", "key 'schema': must be 'adaptive_batcher.profile/1', got 'other/2'"),
        ("model", ..., "missing key 'model'"),
        ("repeats", "20", "key 'repeats': must be an int, got a string"),
        ("repeats", 0, "key 'repeats': must be >= 1, got 0"),
        ("device", None, "key 'device': must be a string, got null"),
        ("rows", {}, "key 'rows': must be an array, got an object"),
        ("rows", [], "key 'rows': must not be empty"),
        ("rows[1]", 3, "key 'rows[1]': must be an object, got a number"),
        ("rows[1].median_ms", ..., "missing key 'rows[1].median_ms'"),
        ("rows[1].median_ms", "6.3", "key 'rows[1].median_ms': must be a number, got a string"),
        ("rows[2].batch_size", True, "key 'rows[2].batch_size': must be an int, got a boolean"),
        (
            "rows[2].batch_size",
            2,
            "key 'rows[2].batch_size': must be larger than the previous row's (2): "
            "rows are in strictly increasing batch size",
        ),
        (
            "rows[0].peak_mem_bytes",
            1.5,
            "key 'rows[0].peak_mem_bytes': must be an int or null, got a number",
        ),
        (
            "rows[0].p99_ms",
            1.0,
            "key 'rows[0]': ProfileRow.p99_ms (1.0) must be >= median_ms (3.676)",
        ),
        (
            "oom_batch_size",
            512,
            "key 'oom_batch_size': must be larger than every row's batch size (largest: 512), "
            "got 512",
        ),
        ("knee", ..., "missing key 'knee'"),
        ("knee.batch_size", ..., "missing key 'knee.batch_size'"),
        (
            "knee.batch_size",
            100,
            "key 'knee.batch_size': 100 is not among the rows' batch sizes "
            "[1, 2, 4, 8, 16, 32, 64, 128, 256, 512]",
        ),
        ("recommendation", ..., "missing key 'recommendation'"),
        ("recommendation", [], "key 'recommendation': must be an object, got an array"),
        ("recommendation.window_ms", ..., "missing key 'recommendation.window_ms'"),
        (
            "recommendation.meets_slo",
            "yes",
            "key 'recommendation.meets_slo': must be true or false, got a string",
        ),
        (
            "recommendation.slo_p99_ms",
            "50",
            "key 'recommendation.slo_p99_ms': must be a number or null, got a string",
        ),
        (
            "recommendation.reasons[0]",
            7,
            "key 'recommendation.reasons[0]': must be a string, got a number",
        ),
        (
            "recommendation.window_ms",
            -1,
            "key 'recommendation': Recommendation.window_ms must be a finite number >= 0, got -1.0",
        ),
    ],
)
def test_loader_errors_name_the_file_and_the_key(
    resnet50: ProfileResult, tmp_path: Path, key: str, value: Any, problem: str
) -> None:
    doc = _good_doc(resnet50)
    _set(doc, key, value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ProfileFormatError) as info:
        load_profile(path)
    assert str(info.value) == f"{path}: {problem}"
    assert info.value.path == path
    assert isinstance(info.value, ValueError)


def test_loader_error_key_attribute(resnet50: ProfileResult, tmp_path: Path) -> None:
    doc = _good_doc(resnet50)
    doc["rows"][1]["median_ms"] = "x"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ProfileFormatError) as info:
        load_profile(path)
    assert info.value.key == "rows[1].median_ms"


def test_loader_rejects_invalid_json_and_non_objects(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ProfileFormatError, match=r"p\.json: not valid JSON: Expecting"):
        load_profile(path)
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ProfileFormatError) as info:
        load_profile(path)
    assert str(info.value) == f"{path}: must hold a JSON object, got an array"
    assert info.value.key is None


def test_loader_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        load_profile(tmp_path / "nope.json")


def test_loader_ignores_unknown_keys(resnet50: ProfileResult, tmp_path: Path) -> None:
    doc = _good_doc(resnet50)
    doc["extra"] = {"anything": 1}
    doc["rows"][0]["p90_ms"] = 3.8
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    loaded, _ = load_profile(path)
    assert loaded == resnet50


# --- markdown ---


def test_markdown_table(resnet50: ProfileResult) -> None:
    knee = find_knee(resnet50)
    rec = recommend(resnet50, SLO(latency_ms=10.0, preprocess_ms=2.0), knee=knee)
    table = markdown_table(resnet50, knee=knee, recommendation=rec)
    lines = table.splitlines()
    assert lines[0] == (
        "| batch | median ms | p99 ms | items/s | peak mem MiB | CV % | robust CV % | calls "
        "| note |"
    )
    assert lines[1] == "|---:|---:|---:|---:|---:|---:|---:|---:|:---|"
    assert len(lines) == 2 + len(RESNET50_H200)
    assert lines[2] == "| 1 | 3.676 | 3.818 | 272 | 303.9 | n/a | n/a | n/a |  |"
    assert lines[8] == "| 64 | 7.219 | 7.452 | 8,866 | 635.5 | n/a | n/a | n/a | recommended cap |"
    assert lines[9] == "| 128 | 8.778 | 8.807 | 14,582 | 972.4 | n/a | n/a | n/a | knee |"


def test_markdown_table_marks_oom_and_missing_memory() -> None:
    result = ProfileResult((ProfileRow(1, 1.0, 2.0, 1000.0, None),), 4, "cpu", "m", 1)
    table = markdown_table(result)
    assert "| 1 | 1.000 | 2.000 | 1,000 | n/a | n/a | n/a | n/a |  |" in table
    assert table.endswith("\n\nBatch 4: out of memory (the sweep stopped there).\n")


def test_markdown_report(resnet50: ProfileResult) -> None:
    knee = find_knee(resnet50)
    rec = recommend(resnet50, SLO(latency_ms=3.0), knee=knee)
    report = markdown_report(resnet50, knee=knee, recommendation=rec)
    assert report.startswith("# Profile of `resnet50`\n")
    assert "| batch | median ms |" in report
    assert "- batch cap (max_batch_size): **1**" in report
    assert "- batching window (window_ms): **0.00 ms**" in report
    assert "- SLO: p99 <= 3 ms, **cannot be met**" in report
    assert "1. SLO cannot be met: even batch 1" in report
    report = markdown_report(resnet50, knee=knee, recommendation=recommend(resnet50))
    assert "- SLO: none given" in report
    assert "## Recommendation" not in markdown_report(resnet50)


# --- PNG ---


def test_plot_writes_a_png(resnet50: ProfileResult, tmp_path: Path) -> None:
    slo = SLO(latency_ms=10.0, preprocess_ms=2.0)
    knee = find_knee(resnet50)
    rec = recommend(resnet50, slo, knee=knee)
    path = plot_profile(resnet50, tmp_path / "p.png", knee=knee, recommendation=rec, slo=slo)
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000


def test_plot_without_markers_and_with_the_slo_from_the_recommendation(
    resnet50: ProfileResult, tmp_path: Path
) -> None:
    bare = plot_profile(resnet50, tmp_path / "bare.png")
    assert bare.read_bytes().startswith(PNG_SIGNATURE)
    rec = recommend(resnet50, SLO(latency_ms=50.0))
    marked = plot_profile(table_result(RESNET50_H200[:1]), tmp_path / "one.png", recommendation=rec)
    assert marked.read_bytes().startswith(PNG_SIGNATURE)
    assert bare.read_bytes() != marked.read_bytes()


def test_plot_needs_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^cannot plot a profile with no rows$"):
        plot_profile(ProfileResult((), 1, "cpu", "m", 1), tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


# --- the spread, thread and noise fields ---

# A file as the profiler wrote it before the spread, thread and noise fields existed.
OLD_FORMAT_FILE = {
    "schema": "adaptive_batcher.profile/1",
    "model": "adaptive_batcher.examples.mlp:mlp_batch_fn",
    "device": "cpu",
    "repeats": 20,
    "rows": [
        {"batch_size": 1, "median_ms": 0.16, "p99_ms": 0.4, "items_per_s": 6250.0,
         "peak_mem_bytes": 0},
        {"batch_size": 4, "median_ms": 40.0, "p99_ms": 41.0, "items_per_s": 100.0,
         "peak_mem_bytes": 4096},
        {"batch_size": 8, "median_ms": 0.52, "p99_ms": 0.6, "items_per_s": 15384.6,
         "peak_mem_bytes": None},
    ],
    "oom_batch_size": None,
    "knee": {"batch_size": 8, "median_ms": 0.52, "p99_ms": 0.6, "items_per_s": 15384.6,
             "method": "fraction_of_max"},
    "recommendation": {"max_batch_size": 8, "window_ms": 0.416, "slo_p99_ms": None,
                       "meets_slo": True, "reasons": ["cap = the knee: 8"]},
}  # fmt: skip


def test_a_file_in_the_old_format_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps(OLD_FORMAT_FILE), encoding="utf-8")
    result, rec = load_profile(path)
    assert result.batch_sizes == (1, 4, 8)
    assert result.rows[1] == ProfileRow(4, 40.0, 41.0, 100.0, 4096)
    assert [(row.repeats, row.cv, row.robust_cv) for row in result.rows] == [(None,) * 3] * 3
    assert (result.max_repeats, result.cv_threshold) == (None, None)
    assert (result.torch_threads, result.torch_interop_threads, result.available_cores) == (
        None, None, None,
    )  # fmt: skip
    assert (result.noisy, result.warnings) == (False, ())  # never checked when it was written
    assert rec == Recommendation(8, 0.416, None, True, ("cap = the knee: 8",))
    assert (rec.noisy, rec.warnings) == (False, ())
    # its rows can still be checked: 8 is faster than 4, with no recorded spread
    assert [w.split(" (")[0] for w in noise_warnings(result.rows)] == [
        "latency not monotone: batch 8"
    ]


def _noisy_result() -> ProfileResult:
    rows = (
        ProfileRow(1, 0.2, 0.25, 5000.0, 0, 20, 0.05, 0.02),
        ProfileRow(4, 40.0, 44.0, 100.0, 4096, 100, 0.31, 0.12),
        ProfileRow(8, 0.52, 0.6, 15384.6, None, 20, 0.04, 0.01),
    )
    warnings = noise_warnings(rows)
    return ProfileResult(
        rows, None, "cpu", "m", 20, max_repeats=100, cv_threshold=0.1, torch_threads=2,
        torch_interop_threads=2, available_cores=2, warnings=warnings, noisy=True,
    )  # fmt: skip


def test_json_round_trip_keeps_the_spread_threads_and_warnings(tmp_path: Path) -> None:
    result = _noisy_result()
    assert len(result.warnings) == 2  # batch 4 unsettled; 8 faster than 4
    rec = recommend(result)
    path = write_profile(tmp_path / "p.json", result, recommendation=rec)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["rows"][1]["repeats"] == 100
    assert doc["rows"][1]["cv"] == 0.31
    assert doc["rows"][1]["robust_cv"] == 0.12
    assert (doc["torch_threads"], doc["torch_interop_threads"], doc["available_cores"]) == (2,) * 3
    assert (doc["max_repeats"], doc["cv_threshold"]) == (100, 0.1)
    assert doc["noisy"] is True and doc["warnings"] == list(result.warnings)
    assert doc["recommendation"]["noisy"] is True
    assert doc["recommendation"]["warnings"] == list(result.warnings)
    loaded, loaded_rec = load_profile(path)
    assert loaded == result
    assert loaded_rec == rec


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("rows[0].cv", "0.1", "key 'rows[0].cv': must be a number or null, got a string"),
        ("rows[0].repeats", 0, "key 'rows[0].repeats': must be >= 1, got 0"),
        ("rows[0].robust_cv", -1, "key 'rows[0]': ProfileRow.robust_cv must be a finite "
         "number >= 0, got -1.0"),
        ("noisy", "yes", "key 'noisy': must be true or false, got a string"),
        ("warnings", "x", "key 'warnings': must be an array, got a string"),
        ("warnings", [3], "key 'warnings[0]': must be a string, got a number"),
        ("max_repeats", 5, "key 'max_repeats': must be >= 20, got 5"),
        ("torch_threads", 0, "key 'torch_threads': must be >= 1, got 0"),
        ("cv_threshold", 0, "ProfileResult.cv_threshold must be a finite number > 0, got 0.0"),
        ("recommendation.noisy", 1, "key 'recommendation.noisy': must be true or false, "
         "got a number"),
        ("recommendation.warnings[0]", None, "key 'recommendation.warnings[0]': must be a "
         "string, got null"),
    ],
)  # fmt: skip
def test_loader_errors_on_the_new_keys(tmp_path: Path, key: str, value: Any, problem: str) -> None:
    result = _noisy_result()
    doc = profile_to_dict(result, recommendation=recommend(result))
    _set(doc, key, value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ProfileFormatError) as info:
        load_profile(path)
    assert str(info.value) == f"{path}: {problem}"


def test_markdown_report_of_a_noisy_sweep() -> None:
    result = _noisy_result()
    rec = recommend(result)
    report = markdown_report(result, recommendation=rec)
    assert (
        "Device: cpu. Latency of one batch call: median and p99 of the timed calls per batch "
        "size (column calls), timed in rounds of 20 until the robust CV (1.4826 x MAD / median) "
        "was at most 10 %, or 100 calls.\n\n"
        "Threads: torch intra-op 2, inter-op 2; 2 CPU cores available to the process.\n"
    ) in report
    assert "| 4 | 40.000 | 44.000 | 100 | 0.0 | 31.0 | 12.0 | 100 |  |" in report
    warnings = "## Warnings\n\n" + "".join(f"- {w}\n" for w in result.warnings)
    assert warnings in report
    assert rec.noise_message is not None
    assert f"## Recommendation\n\n**{rec.noise_message}**\n\n- batch cap" in report
    assert report.index("## Warnings") < report.index("## Recommendation")


def test_markdown_report_of_a_clean_sweep_has_no_warnings_section() -> None:
    row = ProfileRow(1, 1.0, 1.1, 1000.0, None, 20, 0.01, 0.01)
    result = ProfileResult((row,), None, "cpu", "m", 20, max_repeats=100, cv_threshold=0.1,
                           available_cores=2)  # fmt: skip
    report = markdown_report(result, recommendation=recommend(result))
    assert "Threads: torch not in use; 2 CPU cores available to the process." in report
    assert "## Warnings" not in report
    assert "NOT RELIABLE" not in report


def test_recommendation_field_validation() -> None:
    with pytest.raises(TypeError, match=r"^Recommendation.noisy must be a bool, got str$"):
        Recommendation(1, 0.0, None, True, (), "no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^Recommendation.warnings must be a sequence of str"):
        Recommendation(1, 0.0, None, True, (), False, "one")
