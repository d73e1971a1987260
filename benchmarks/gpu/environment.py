"""The environment phase: the machine, the driver, the libraries, and what NVML offers."""

from __future__ import annotations

import asyncio
import importlib.metadata
import platform as python_platform
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

import adaptive_batcher
from adaptive_batcher.telemetry import NvmlTelemetry
from benchmarks.gpu.context import Context
from benchmarks.gpu.results import PhaseOutcome, Table

__all__ = ["run_environment"]

PACKAGES = ("numpy", "structlog", "nvidia-ml-py", "torch", "torchvision", "transformers")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown (no git checkout)"


def _loop_name() -> str:
    """The class of the event loop ``asyncio.run`` makes here."""
    loop = asyncio.new_event_loop()
    try:
        return type(loop).__name__
    finally:
        loop.close()


def _nvml_facts(ctx: Context) -> list[tuple[str, str]]:
    nvml = ctx.platform.nvml()
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        facts = [
            ("driver", str(nvml.nvmlSystemGetDriverVersion())),
            ("gpu_name", str(nvml.nvmlDeviceGetName(handle))),
            ("nvml_device_count", str(nvml.nvmlDeviceGetCount())),
        ]
    finally:
        nvml.nvmlShutdown()
    source = NvmlTelemetry()
    reading = source.sample()
    facts += [
        ("nvml_available", str(source.available)),
        ("gpm_enabled", str(source.gpm_enabled)),
        ("energy_counter", str(reading.energy_mj is not None)),
        ("memory_v2", str(reading.mem_reserved_bytes is not None)),
        ("nvml_total_memory_gib", f"{(reading.mem_total_bytes or 0) / 2**30:.2f}"),
    ]
    source.close()
    return facts


def run_environment(ctx: Context) -> PhaseOutcome:
    """Facts, each gathered on its own, so one that fails leaves the others."""
    outcome = PhaseOutcome("environment")
    table = Table("environment")
    outcome.tables.append(table)
    config = ctx.config
    groups: list[tuple[str, Callable[[], list[tuple[str, str]]]]] = [
        (
            "python",
            lambda: [
                ("platform", ctx.platform.name),
                ("python", sys.version.split()[0]),
                ("machine", python_platform.machine()),
                ("adaptive_batcher", adaptive_batcher.__version__),
                ("commit", _commit()),
                ("event_loop", _loop_name()),
            ],
        ),
        ("packages", lambda: [(p, _version(p)) for p in PACKAGES]),
        (
            "torch",
            lambda: [
                ("torch_cuda", str(torch.version.cuda)),
                ("torch_cuda_available", str(torch.cuda.is_available())),
                ("dtype", str(ctx.platform.dtype)),
                ("channels_last", str(config.channels_last)),
            ],
        ),
        ("device", ctx.platform.environment),
        ("nvml", lambda: _nvml_facts(ctx)),
    ]
    for name, gather in groups:
        try:
            for key, value in gather():
                table.add(key=key, value=value)
        except Exception:
            outcome.status = "failed"
            outcome.traceback += f"{name}:\n{traceback.format_exc()}"
    facts = {row["key"]: row["value"] for row in table.rows}
    outcome.detail = f"{facts.get('gpu_name', '?')}, driver {facts.get('driver', '?')}"
    return outcome
