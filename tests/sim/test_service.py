"""Service-time and memory models: linear, tables (H200, profiler JSON), noise, cold shapes, OOM."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptive_batcher.profile.format import (
    ProfileFormatError,
    load_profile,
    profile_to_dict,
    write_profile,
)
from adaptive_batcher.profile.knee import Knee
from adaptive_batcher.profile.result import ProfileResult, ProfileRow
from adaptive_batcher.sim.measured_tables import MIB, load_h200_table
from adaptive_batcher.sim.service import (
    H200_MODELS,
    MAX_NOISE_CV,
    ColdShapes,
    LinearService,
    MemoryLimit,
    Noisy,
    ServiceModel,
    Spikes,
    Stalls,
    TableService,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- LinearService ----------------------------------------------------------------------------


def test_linear_time_and_memory() -> None:
    model = LinearService(0.002, 0.0001, memory_fixed_bytes=1e9, memory_per_unit_bytes=1e6)
    assert model.service_s(1, _rng()) == pytest.approx(0.0021)
    assert model.service_s(64, _rng()) == pytest.approx(0.0084)
    assert model.memory_bytes(0) == 1e9
    assert model.memory_bytes(100) == pytest.approx(1.1e9)
    assert model.name == "linear"


def test_linear_memory_unknown_by_default() -> None:
    assert math.isnan(LinearService(0.001, 0.0).memory_bytes(8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fixed_s": -1.0, "per_unit_s": 0.0}, "fixed_s must be a finite number >= 0"),
        ({"fixed_s": 0.0, "per_unit_s": math.inf}, "per_unit_s must be a finite number >= 0"),
        (
            {"fixed_s": 0.0, "per_unit_s": 0.0, "memory_fixed_bytes": -5.0},
            "memory_fixed_bytes must be a finite number >= 0",
        ),
    ],
)
def test_linear_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LinearService(**kwargs)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: TableService([1, 8], [0.01, 1e302]),
            r"latencies_s must be at most 100000 s \(MAX_SERVICE_S\), got \[0.01, 1e\+302\]",
        ),
        (lambda: LinearService(1e302, 0.0), r"fixed_s must be at most 100000 s"),
        (lambda: LinearService(0.0, 1e303), r"per_unit_s must be at most 100000 s"),
        (lambda: Stalls(LinearService(0.0, 0.001), scale_s=1e302), r"scale_s must be at most"),
        (lambda: ColdShapes(LinearService(0.0, 0.001), cold_s=1e302), r"cold_s must be at most"),
    ],
)
def test_service_times_beyond_max_service_s_are_refused_at_construction(
    make: Any, message: str
) -> None:
    # from ~1e302 s a replay raised a bare OverflowError from the latency histogram
    with pytest.raises(ValueError, match=f"^{message}"):
        make()


def test_units_out_of_range() -> None:
    model = LinearService(0.001, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"units must be >= 1, got 0"):
        model.service_s(0, _rng())
    with pytest.raises(ValueError, match=r"units must be >= 0, got -1"):
        model.memory_bytes(-1)


# --- TableService: interpolation ----------------------------------------------------------------


def _table() -> TableService:
    return TableService([2, 4, 8], [0.010, 0.020, 0.040], [100.0, 200.0, 300.0], name="t")


def test_table_exact_points() -> None:
    model = _table()
    assert [model.service_s(n, _rng()) for n in (2, 4, 8)] == [0.010, 0.020, 0.040]
    assert [model.memory_bytes(n) for n in (2, 4, 8)] == [100.0, 200.0, 300.0]


def test_table_interpolates_linearly() -> None:
    model = _table()
    assert model.service_s(3, _rng()) == pytest.approx(0.015)
    assert model.service_s(6, _rng()) == pytest.approx(0.030)
    assert model.memory_bytes(5) == pytest.approx(225.0)


def test_table_flat_below_smallest_size() -> None:
    model = _table()
    assert model.service_s(1, _rng()) == 0.010
    assert model.memory_bytes(1) == 100.0
    assert model.memory_bytes(0) == 100.0  # idle: the smallest measured footprint


def test_table_extrapolates_from_last_two_points() -> None:
    model = _table()
    # slope (0.040 - 0.020) / (8 - 4) = 0.005 s/unit, so 16 -> 0.040 + 8 * 0.005
    assert model.service_s(16, _rng()) == pytest.approx(0.080)
    # memory slope (300 - 200) / 4 = 25 bytes/unit
    assert model.memory_bytes(12) == pytest.approx(400.0)


def test_table_never_extrapolates_below_last_value() -> None:
    model = TableService([1, 2, 4], [0.004, 0.006, 0.005])  # falls on the last segment
    assert model.service_s(4, _rng()) == 0.005
    assert model.service_s(1000, _rng()) == 0.005


def test_one_row_table_is_flat() -> None:
    model = TableService([16], [0.01], [5.0])
    assert model.service_s(1, _rng()) == model.service_s(16, _rng()) == 0.01
    assert model.service_s(500, _rng()) == 0.01
    assert model.memory_bytes(500) == 5.0


def test_table_memory_unknown_is_nan() -> None:
    model = TableService([1, 2], [0.001, 0.002])
    assert math.isnan(model.memory_bytes(1))
    assert model.memory_table_bytes is None


def test_table_arrays_are_read_only() -> None:
    model = _table()
    assert model.sizes.dtype == np.int64
    with pytest.raises(ValueError, match="read-only"):
        model.latencies_s[0] = 1.0


@given(units=st.integers(min_value=1, max_value=10_000))
def test_table_is_between_neighbours_and_monotone_beyond(units: int) -> None:
    model = _table()
    value = model.service_s(units, _rng())
    assert value >= 0.010
    if units <= 8:
        assert value <= 0.040
    else:
        assert value == pytest.approx(0.040 + 0.005 * (units - 8))


@pytest.mark.parametrize(
    ("sizes", "latencies", "memory", "message"),
    [
        ([], [], None, "sizes must be a non-empty 1-D sequence"),
        ([1, 2], [0.1], None, "latencies_s must have 2 values \\(one per size\\), got 1"),
        ([2, 1], [0.1, 0.2], None, "sizes must be strictly increasing"),
        ([1, 1], [0.1, 0.2], None, "sizes must be strictly increasing"),
        ([0, 1], [0.1, 0.2], None, r"sizes must be ints >= 1, got \[0.0, 1.0\]"),
        ([1.5, 2], [0.1, 0.2], None, "sizes must be ints >= 1"),
        ([1, 2], [0.1, -0.2], None, "latencies_s must be finite numbers >= 0, got \\[0.1, -0.2\\]"),
        ([1, 2], [0.1, math.nan], None, "latencies_s must be finite numbers >= 0"),
        ([1, 2], [0.1, 0.2], [1.0], "memory_bytes must have 2 values \\(one per size\\), got 1"),
    ],
)
def test_table_validation(
    sizes: list[float], latencies: list[float], memory: list[float] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TableService(sizes, latencies, memory)


# --- TableService: the shipped H200 tables ------------------------------------------------------


def test_h200_resnet50_matches_the_csv() -> None:
    model = TableService.from_h200("resnet50")
    assert model.name == "h200:resnet50"
    assert model.sizes.tolist() == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert model.service_s(256, _rng()) == pytest.approx(0.016651, abs=1e-12)
    assert model.service_s(512, _rng()) == pytest.approx(0.032228, abs=1e-12)
    assert model.memory_bytes(256) == pytest.approx(1646.6 * MIB)
    # half-way between 256 and 512
    assert model.service_s(384, _rng()) == pytest.approx((0.016651 + 0.032228) / 2)
    # beyond 512: the 256 -> 512 slope, 15.577 ms per 256 images
    assert model.service_s(1024, _rng()) == pytest.approx(0.032228 + 2 * 0.015577)


@pytest.mark.parametrize("model_name", ["resnet50", "bert_base_seq128"])
def test_h200_batch_profile_rows_round_trip(model_name: str) -> None:
    model = TableService.from_h200(model_name)
    rows = [r for r in load_h200_table("batch_profile") if r["model"] == model_name]
    assert len(rows) == 10
    for row in rows:
        batch = int(float(row["batch"]))
        assert model.service_s(batch, _rng()) == pytest.approx(float(row["median_ms"]) / 1e3)
        assert model.memory_bytes(batch) == pytest.approx(float(row["peak_mib"]) * MIB)


def test_h200_bert_and_decode_values() -> None:
    assert TableService.from_h200("bert_base_seq128").service_s(128, _rng()) == pytest.approx(
        0.007364
    )
    decode = TableService.from_h200("llama_1b_decode")
    assert decode.sizes.tolist() == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert decode.service_s(1, _rng()) == pytest.approx(0.049041)
    assert decode.service_s(256, _rng()) == pytest.approx(0.054541)
    assert decode.memory_bytes(256) == pytest.approx(21200.6 * MIB)


def test_h200_prefill_drops_the_cold_batch_one_row() -> None:
    prefill = TableService.from_h200("llama_1b_prefill")
    assert prefill.sizes.tolist() == [2, 4, 8, 16, 32, 64, 128, 256]
    assert prefill.service_s(1, _rng()) == pytest.approx(0.061006)  # not the cold 988.776 ms
    assert prefill.service_s(256, _rng()) == pytest.approx(0.699256)


def test_h200_unknown_model() -> None:
    with pytest.raises(ValueError, match=r"unknown H200 model 'vgg'; available: resnet50, "):
        TableService.from_h200("vgg")


@pytest.mark.parametrize("model_name", H200_MODELS)
def test_every_model_satisfies_the_protocol(model_name: str) -> None:
    table = TableService.from_h200(model_name)
    for model in (table, Noisy(table), ColdShapes(table), LinearService(0.001, 0.0)):
        assert isinstance(model, ServiceModel)
        assert model.service_s(7, _rng()) > 0


# --- TableService: profiler JSON ----------------------------------------------------------------


def _profile_doc(**overrides: Any) -> dict[str, Any]:
    """A profile as the profiler writes it (knee given, so kneed is not needed)."""
    result = ProfileResult(
        (ProfileRow(1, 2.0, 3.0, 500.0, 1000), ProfileRow(4, 5.0, 6.0, 800.0, 4000)),
        None,
        "cpu",
        "mlp",
        20,
    )
    doc = profile_to_dict(result, knee=Knee.at(result.rows[1], "fraction_of_max"))
    doc.update(overrides)
    return doc


def _write(tmp_path: Path, doc: Any, name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_profile_json_reads_rows(tmp_path: Path) -> None:
    model = TableService.from_profile_json(_write(tmp_path, _profile_doc()))
    assert model.name == "mlp"
    assert model.service_s(1, _rng()) == pytest.approx(0.002)
    assert model.service_s(2, _rng()) == pytest.approx(0.003)
    assert model.memory_bytes(4) == 4000.0


def test_profile_json_memory_unknown_when_a_row_lacks_it(tmp_path: Path) -> None:
    doc = _profile_doc()
    doc["rows"][1]["peak_mem_bytes"] = None
    model = TableService.from_profile_json(_write(tmp_path, doc), name="x")
    assert model.name == "x"
    assert math.isnan(model.memory_bytes(1))


def test_profile_json_without_a_model_name_is_named_after_the_file(tmp_path: Path) -> None:
    model = TableService.from_profile_json(_write(tmp_path, _profile_doc(model=""), "gpu.json"))
    assert model.name == "profile:gpu.json"


def test_profile_json_written_by_the_profiler(tmp_path: Path) -> None:
    result = ProfileResult(
        (ProfileRow(1, 3.676, 3.9, 272.0, 318_664_294), ProfileRow(256, 16.651, 16.7, 15374.4)),
        None,
        "cuda:0 (NVIDIA H200)",
        "resnet50",
        20,
    )
    path = write_profile(
        tmp_path / "resnet50.json", result, knee=Knee.at(result.rows[1], "kneedle")
    )
    model = TableService.from_profile_json(path)
    assert model.name == "resnet50"
    assert model.service_s(256, _rng()) == pytest.approx(0.016651)
    assert math.isnan(model.memory_bytes(1))  # the second row has no memory figure


def _row_edit(index: int, key: str, value: Any) -> dict[str, Any]:
    doc = _profile_doc()
    doc["rows"][index][key] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        (_profile_doc(schema="other/1"), "key 'schema': must be 'adaptive_batcher.profile/1'"),
        (_profile_doc(rows=[]), "key 'rows': must not be empty"),
        (_profile_doc(rows={"a": 1}), "key 'rows': must be an array, got an object"),
        (_profile_doc(rows=[3]), "key 'rows[0]': must be an object, got a number"),
        (_row_edit(1, "batch_size", 1), "key 'rows[1].batch_size': must be larger than"),
        (_row_edit(0, "batch_size", 1.5), "key 'rows[0].batch_size': must be an int, got a num"),
        (_row_edit(0, "batch_size", True), "key 'rows[0].batch_size': must be an int, got a boo"),
        (_row_edit(1, "median_ms", "fast"), "key 'rows[1].median_ms': must be a number, got a s"),
        (_row_edit(1, "median_ms", 0), "key 'rows[1]': ProfileRow.median_ms must be a finite"),
        (  # from ~1e302 s a replay raised a bare OverflowError
            _row_edit(1, "median_ms", 1e305),
            "key 'rows[1]': ProfileRow.median_ms must be at most 1e+08 ms (MAX_SERVICE_S), "
            "got 1e+305",
        ),
        (_row_edit(0, "peak_mem_bytes", -1), "key 'rows[0].peak_mem_bytes': must be >= 0, got -1"),
        (_profile_doc(knee=None), "key 'knee': must be an object, got null"),
    ],
)
def test_profile_json_errors_are_the_profile_readers(
    tmp_path: Path, doc: dict[str, Any], problem: str
) -> None:
    path = _write(tmp_path, doc, "bad.json")
    with pytest.raises(ProfileFormatError) as info:
        TableService.from_profile_json(path)
    assert str(info.value).startswith(f"{path}: {problem}")
    with pytest.raises(ProfileFormatError) as same:
        load_profile(path)
    assert str(same.value) == str(info.value)


def test_profile_json_missing_key(tmp_path: Path) -> None:
    doc = _profile_doc()
    del doc["rows"][0]["median_ms"]
    with pytest.raises(ProfileFormatError, match=r"missing key 'rows\[0\].median_ms'$"):
        TableService.from_profile_json(_write(tmp_path, doc))


def test_profile_json_not_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ProfileFormatError, match=r"broken\.json: not valid JSON"):
        TableService.from_profile_json(path)


def test_profile_json_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"model": "caf\xe9"}')
    with pytest.raises(ProfileFormatError, match=r"latin1\.json: not UTF-8 text"):
        TableService.from_profile_json(path)


def test_profile_json_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ProfileFormatError, match=r"list\.json: must hold a JSON object"):
        TableService.from_profile_json(_write(tmp_path, [1, 2], "list.json"))


def test_profile_json_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TableService.from_profile_json(tmp_path / "absent.json")


# --- Stalls -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"probability": 1.5}, ValueError, "probability must be a number in [0, 1], got 1.5"),
        ({"probability": math.nan}, ValueError, "probability must be a number in [0, 1], got nan"),
        ({"probability": "0.1"}, TypeError, "probability must be a number, got str"),
        ({"scale_s": 0.0}, ValueError, "scale_s must be a finite number > 0, got 0.0"),
        ({"alpha": 1.0}, ValueError, "alpha must be a finite number > 1, got 1.0"),
    ],
)
def test_stalls_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        Stalls(LinearService(0.001, 0.0), **kwargs)
    assert str(caught.value) == message


# --- Spikes -------------------------------------------------------------------------------------


def test_spikes_scale_a_share_of_the_batches() -> None:
    model = Spikes(LinearService(0.001, 0.0001), probability=0.2, factor=10.0)
    rng = _rng(5)
    draws = np.array([model.service_s(10, rng) for _ in range(20_000)])
    assert set(np.round(draws, 12)) == {0.002, 0.02}  # the batch's own time, or 10x it
    assert np.mean(draws > 0.002 + 1e-12) == pytest.approx(0.2, abs=0.01)
    assert model.name == "spikes(linear, p=0.2, x10)"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"probability": -0.1}, ValueError, "probability must be a number in [0, 1], got -0.1"),
        ({"factor": 0.5}, ValueError, "factor must be a number in [1, 1000], got 0.5"),
        ({"factor": "2"}, TypeError, "factor must be a number, got str"),
    ],
)
def test_spikes_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        Spikes(LinearService(0.001, 0.0), **kwargs)
    assert str(caught.value) == message


# --- Noisy --------------------------------------------------------------------------------------


def test_noisy_mean_and_cv() -> None:
    model = Noisy(LinearService(0.010, 0.0), cv=0.2)
    rng = _rng(1)
    draws = np.array([model.service_s(8, rng) for _ in range(40_000)])
    assert draws.mean() == pytest.approx(0.010, rel=0.01)  # standard error 0.1 %
    assert draws.std() / draws.mean() == pytest.approx(0.2, rel=0.05)
    assert np.all(draws > 0)


def test_noisy_is_deterministic_for_a_seed() -> None:
    model = Noisy(TableService.from_h200("resnet50"))
    a, b = _rng(7), _rng(7)
    first = [model.service_s(n, a) for n in (1, 64, 256, 256, 512)]
    second = [model.service_s(n, b) for n in (1, 64, 256, 256, 512)]
    assert first == second
    assert first[2] != first[3]  # fresh noise on each call


def test_noisy_zero_cv_draws_nothing() -> None:
    model = Noisy(LinearService(0.01, 0.0), cv=0.0)
    rng = _rng(3)
    assert model.service_s(4, rng) == 0.01
    assert rng.random() == _rng(3).random()


def test_noisy_delegates_memory_and_names() -> None:
    inner = LinearService(0.01, 0.0, 5.0, 1.0, name="lin")
    model = Noisy(inner, cv=0.1)
    assert model.memory_bytes(10) == 15.0
    assert model.name == "noisy(lin, cv=0.1)"
    with pytest.raises(ValueError, match=r"^cv must be a number in \[0, 10\], got -0.1$"):
        Noisy(inner, cv=-0.1)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda n: Noisy(LinearService(0.01, 0.0), cv=n(3, 10)), "noisy(linear, cv=0.3)"),
        (
            lambda n: Stalls(
                LinearService(0.01, 0.0), probability=n(1, 20), scale_s=n(1, 200), alpha=n(3, 2)
            ),
            "stalls(linear, p=0.05, scale=5 ms, alpha=1.5)",
        ),
        (
            lambda n: Spikes(LinearService(0.01, 0.0), probability=n(1, 20), factor=n(10, 1)),
            "spikes(linear, p=0.05, x10)",
        ),
        (lambda n: ColdShapes(LinearService(0.01, 0.0), cold_s=n(3, 10)), "cold(linear, +0.3s)"),
    ],
)
@pytest.mark.parametrize(
    "number",
    [Fraction, lambda a, b: np.float32(a / b), lambda a, b: a / b],
    ids=["Fraction", "float32", "float"],
)
def test_names_show_any_number_type_as_the_float_it_was_checked_as(
    build: Callable[[Callable[[int, int], object]], ServiceModel],
    name: str,
    number: Callable[[int, int], object],
) -> None:
    """Before: a Fraction (accepted: it is a real number) made ``name`` raise TypeError on
    Python 3.11 (``format(Fraction(3, 10), "g")``), and the field kept the Fraction."""
    model = build(number)
    assert model.name == name
    assert "Fraction" not in repr(model) and "float32" not in repr(model)


@pytest.mark.parametrize("cv", [10.000001, 1e6, 1e200, math.inf, math.nan])
def test_noisy_refuses_a_cv_above_its_bound(cv: float) -> None:
    """Before: accepted while finite; from cv ~1.3e154 on every factor was NaN, and a replay
    with such a model never returned."""
    with pytest.raises(ValueError, match=r"^cv must be a number in \[0, 10\], got "):
        Noisy(LinearService(0.01, 0.0), cv=cv)


def test_noisy_at_its_largest_cv_draws_finite_positive_times() -> None:
    model = Noisy(LinearService(0.01, 0.0), cv=MAX_NOISE_CV)
    rng = _rng()
    times = np.array([model.service_s(1, rng) for _ in range(20_000)])
    assert np.all(np.isfinite(times)) and np.all(times > 0)
    assert np.median(times) == pytest.approx(0.01 / math.sqrt(101), rel=0.05)


# --- ColdShapes ---------------------------------------------------------------------------------


def test_cold_shapes_costs_once_per_size() -> None:
    model = ColdShapes(LinearService(0.001, 0.0), cold_s=0.3)
    rng = _rng()
    assert model.service_s(8, rng) == pytest.approx(0.301)
    assert model.service_s(8, rng) == pytest.approx(0.001)
    assert model.service_s(16, rng) == pytest.approx(0.301)
    assert model.service_s(8, rng) == pytest.approx(0.001)
    assert model.warm_sizes == frozenset({8, 16})


def test_cold_shapes_prewarmed_and_reset() -> None:
    model = ColdShapes(LinearService(0.001, 0.0), cold_s=0.5, warmed=[32, 64])
    rng = _rng()
    assert model.is_warm(32) and not model.is_warm(8)
    assert model.service_s(32, rng) == pytest.approx(0.001)
    assert model.service_s(8, rng) == pytest.approx(0.501)
    model.reset()
    assert model.warm_sizes == frozenset({32, 64})
    assert model.service_s(8, rng) == pytest.approx(0.501)
    model.warm([128])
    assert model.service_s(128, rng) == pytest.approx(0.001)


def test_cold_shapes_validation_and_delegation() -> None:
    inner = LinearService(0.001, 0.0, 10.0, 2.0, name="lin")
    assert ColdShapes(inner).memory_bytes(5) == 20.0
    assert ColdShapes(inner, cold_s=0.25).name == "cold(lin, +0.25s)"
    with pytest.raises(ValueError, match="cold_s must be a finite number >= 0"):
        ColdShapes(inner, cold_s=-1.0)
    with pytest.raises(ValueError, match=r"warmed\[1\] must be >= 1, got 0"):
        ColdShapes(inner, warmed=[4, 0])


@pytest.mark.parametrize(
    ("sizes", "error", "message"),
    [
        ([0, -3, 1.7], ValueError, r"^sizes\[0\] must be >= 1, got 0$"),
        ([4, -3], ValueError, r"^sizes\[1\] must be >= 1, got -3$"),
        ([4, 1.7], TypeError, r"^sizes\[1\] must be an int, got float$"),
        ([True], TypeError, r"^sizes\[0\] must be an int, got bool$"),
        (8, TypeError, r"^sizes must be a sequence of ints, got int$"),
        ("16", TypeError, r"^sizes must be a sequence of ints, got str$"),
    ],
)
def test_cold_shapes_warm_checks_sizes_as_the_constructor_does(
    sizes: Any, error: type[Exception], message: str
) -> None:
    """Before: ``warm([0, -3, 1.7])`` marked 0, -3 and 1 warm, sizes the constructor refuses."""
    model = ColdShapes(LinearService(0.001, 0.0), warmed=[32])
    with pytest.raises(error, match=message):
        model.warm(sizes)
    assert model.warm_sizes == frozenset({32})  # nothing marked
    with pytest.raises(error, match=message.replace("sizes", "warmed")):
        ColdShapes(LinearService(0.001, 0.0), warmed=sizes)
    model.warm(np.array([64, 128]))  # numpy ints are ints
    assert model.warm_sizes == frozenset({32, 64, 128})


@pytest.mark.parametrize("wrapper", [Noisy, Stalls, Spikes, ColdShapes])
def test_a_wrapper_refuses_an_inner_model_that_is_no_instance(wrapper: Any) -> None:
    """Before: accepted, and the run failed at its first batch (``TableService.service_s()
    missing 1 required positional argument: 'rng'``; ``'str' object has no attribute
    'service_s'``)."""
    with pytest.raises(
        TypeError, match=r"^inner must be an instance of TableService, got the class$"
    ):
        wrapper(TableService)
    with pytest.raises(
        TypeError, match=r"^inner must be a ServiceModel \(name, service_s, .* got str$"
    ):
        wrapper("resnet50")
    assert isinstance(wrapper(LinearService(0.001, 0.0)), ServiceModel)


# --- MemoryLimit --------------------------------------------------------------------------------


def _mem_model() -> LinearService:
    return LinearService(0.001, 0.0, memory_fixed_bytes=1000.0, memory_per_unit_bytes=10.0)


def test_memory_limit_threshold() -> None:
    limit = MemoryLimit(2000.0)
    model = _mem_model()
    assert not limit.is_oom(model, 100, 0.0)  # exactly 2000 bytes fits
    assert limit.is_oom(model, 101, 0.0)


def test_memory_limit_squeeze_at_time() -> None:
    limit = MemoryLimit(2000.0, squeezes=[(5.0, 1500.0), (9.0, 3000.0)])
    model = _mem_model()
    assert limit.capacity_at(0.0) == 2000.0
    assert limit.capacity_at(4.999) == 2000.0
    assert limit.capacity_at(5.0) == 1500.0
    assert limit.capacity_at(100.0) == 3000.0
    assert not limit.is_oom(model, 51, 4.999)
    assert limit.is_oom(model, 51, 5.0)
    assert not limit.is_oom(model, 50, 5.0)
    assert not limit.is_oom(model, 150, 9.0)


def test_memory_limit_sorts_squeezes_and_later_entry_wins() -> None:
    limit = MemoryLimit(100.0, squeezes=[(3.0, 50.0), (1.0, 80.0), (3.0, 60.0)])
    assert limit.squeezes == ((1.0, 80.0), (3.0, 50.0), (3.0, 60.0))
    assert limit.capacity_at(2.0) == 80.0
    assert limit.capacity_at(3.0) == 60.0


def test_memory_limit_free_fraction() -> None:
    limit = MemoryLimit(2000.0, squeezes=[(1.0, 1000.0)])
    model = _mem_model()
    assert limit.free_fraction(model, 0, 0.0) == pytest.approx(0.5)
    assert limit.free_bytes(model, 50, 0.0) == pytest.approx(500.0)
    assert limit.free_fraction(model, 50, 0.0) == pytest.approx(0.25)
    assert limit.free_fraction(model, 50, 1.0) == 0.0  # over the squeezed capacity: clamped
    unknown = LinearService(0.001, 0.0)
    assert limit.free_fraction(unknown, 5, 0.0) is None
    assert limit.free_bytes(unknown, 5, 0.0) is None
    assert not limit.is_oom(unknown, 10**9, 0.0)


def test_memory_limit_with_h200_resnet50() -> None:
    limit = MemoryLimit(1024 * MIB, squeezes=[(60.0, 512 * MIB)])
    model = TableService.from_h200("resnet50")
    assert not limit.is_oom(model, 128, 0.0)  # 972.4 MiB
    assert limit.is_oom(model, 256, 0.0)  # 1646.6 MiB
    assert limit.is_oom(model, 128, 60.0)
    assert not limit.is_oom(model, 32, 60.0)  # 470.1 MiB


@pytest.mark.parametrize(
    ("capacity", "squeezes", "message"),
    [
        (0.0, (), "capacity_bytes must be a finite number > 0, got 0.0"),
        (math.inf, (), "capacity_bytes must be a finite number > 0, got inf"),
        (1.0, ((math.nan, 1.0),), r"squeezes\[0\] time_s must be a finite number >= 0, got nan"),
        (1.0, ((1.0, 2.0), (-1.0, 1.0)), r"squeezes\[1\] time_s must be a finite number >= 0"),
        (
            1.0,
            ((1.0, -1.0),),
            r"squeezes\[0\] capacity_bytes must be a finite number > 0, got -1.0",
        ),
    ],
)
def test_memory_limit_validation(
    capacity: float, squeezes: tuple[tuple[float, float], ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryLimit(capacity, squeezes)
