"""The measured H200 and CPU tables shipped as package data."""

from __future__ import annotations

from importlib import resources

import pytest

from adaptive_batcher.sim.measured_tables import H200_TABLES, list_h200_tables, load_h200_table

EXPECTED_COLUMNS = {
    "batch_profile": ["model", "batch", "median_ms", "p90_ms", "items_per_s", "peak_mib"],
    "bert_seq": ["batch", "seq", "tokens", "median_ms", "tokens_per_s", "peak_mib"],
    "decoder_profile": [
        "model",
        "phase",
        "batch",
        "ctx",
        "median_ms",
        "tokens_per_s",
        "peak_mib",
    ],
    "llama_kv": [
        "batch",
        "ctx",
        "prefill_ms",
        "decode_median_ms",
        "decode_tokens_per_s",
        "peak_mib_after_prefill_and_decode",
    ],
}
EXPECTED_ROWS = {"batch_profile": 20, "bert_seq": 15, "decoder_profile": 18, "llama_kv": 8}


def test_lists_the_four_tables() -> None:
    assert list_h200_tables() == H200_TABLES == tuple(EXPECTED_COLUMNS)


@pytest.mark.parametrize("name", H200_TABLES)
def test_each_table_loads_with_its_columns(name: str) -> None:
    rows = load_h200_table(name)
    assert len(rows) == EXPECTED_ROWS[name]
    assert all(list(row) == EXPECTED_COLUMNS[name] for row in rows)
    assert all(isinstance(row["batch"], float) for row in rows)


def test_values_are_parsed() -> None:
    rows = load_h200_table("batch_profile.csv")
    resnet_256 = next(r for r in rows if r["model"] == "resnet50" and r["batch"] == 256)
    assert resnet_256["median_ms"] == 16.651
    assert resnet_256["peak_mib"] == 1646.6
    kv = load_h200_table("llama_kv")
    assert kv[-1]["peak_mib_after_prefill_and_decode"] == 51296.6


def test_unknown_table() -> None:
    with pytest.raises(ValueError, match=r"unknown H200 table 'nvml_calls'; available: "):
        load_h200_table("nvml_calls")


def test_readme_ships_with_the_tables() -> None:
    readme = resources.files("adaptive_batcher.data") / "h200" / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert "NVIDIA H200" in text and "2026-11-29" in text and "2.11.0+cu130" in text


def test_shipped_cpu_profile_drives_the_simulator() -> None:
    import numpy as np

    from adaptive_batcher.sim.measured_tables import cpu_profile_path
    from adaptive_batcher.sim.service import TableService
    from adaptive_batcher.sim.simulator import SimConfig, Simulator
    from adaptive_batcher.sim.workloads import Poisson

    service = TableService.from_profile_json(cpu_profile_path("mlp_epyc_2core"))
    assert service.service_s(1, np.random.default_rng(0)) < service.service_s(
        256, np.random.default_rng(0)
    )
    arrivals = Poisson(5000.0).generate(2.0, np.random.default_rng(0))
    result = Simulator(service, SimConfig(128, 1.0)).run(arrivals)
    assert result.completed == result.requests
    with pytest.raises(ValueError, match="unknown CPU profile 'gpu'"):
        cpu_profile_path("gpu")
