"""vLLM's OpenAI-compatible server on CPU for the real-engine tests: started in its own venv
(scripts/vllm_cpu_env.sh; ``ADAPTIVE_BATCHER_VLLM_PYTHON`` names its Python) on 127.0.0.1, in
its own process group, and stopped by its PID (the API server and its engine-core child
together). Settings from ../shared/llm/README.md, section 6.

The group stays in the tests' session: a new session (``setsid``) is a new scheduler
autogroup on Linux, and with the engine's worker pinned to one core the tests' own group then
went unscheduled for 1-5 s at a time (docs/llm.md, "The real-engine tests")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).parents[2]
START_TIMEOUT_S = 300.0  # 30-50 s on a quiet 2-core machine; CI may be busier
STOP_TIMEOUT_S = 20.0
MAX_NUM_SEQS = 32
MODEL_NAME = "tiny"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_tiny_model(python: str, directory: Path, hidden: int = 256, layers: int = 4) -> None:
    """The tests' model, written by the engine's Python (tests/llm_engine/tiny_model.py)."""
    command = [
        python, "-m", "tests.llm_engine.tiny_model", str(directory),
        "--hidden", str(hidden), "--layers", str(layers),
    ]  # fmt: skip
    subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
        timeout=120,
    )


class VLLMServer:
    """One vLLM API server; ``start`` and ``stop`` may be repeated (the same port again)."""

    def __init__(
        self, python: str, model_dir: Path, log_path: Path, max_num_seqs: int = MAX_NUM_SEQS
    ) -> None:
        self.python = python
        self.max_num_seqs = max_num_seqs
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> str:
        """Start it (on ``port``, 0: a free one); returns its URL once ``/health`` answers.

        Raises:
            RuntimeError: it exited or did not answer within START_TIMEOUT_S (its log's tail).
        """
        self.port = port or free_port()
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
        command = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", "1024",
            "--max-num-seqs", str(self.max_num_seqs), "--enforce-eager",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            # Popen, not asyncio's: the server outlives the loop that starts it
            self.process = subprocess.Popen(  # noqa: ASYNC220
                command, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0
            )
        await self._wait_healthy()
        return self.url

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(f"vLLM exited ({self.process.returncode}):\n{self.log()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                await asyncio.sleep(0.5)
        await self.kill()
        raise RuntimeError(f"vLLM did not answer within {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def kill(self) -> None:
        """SIGKILL its process group, and reap it."""
        await self._signal(signal.SIGKILL, STOP_TIMEOUT_S)

    async def stop(self) -> None:
        """SIGTERM its process group (SIGKILL after a bound), and reap it."""
        if not await self._signal(signal.SIGTERM, STOP_TIMEOUT_S):
            await self.kill()

    async def _signal(self, number: int, bound_s: float) -> bool:
        """Signal the group; True once the server exited within ``bound_s``."""
        process = self.process
        if process is None:
            return True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, number)
        deadline = time.monotonic() + bound_s
        while process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (polled)
            await asyncio.sleep(0.1)
        if process.poll() is None:
            return False
        with contextlib.suppress(ProcessLookupError):  # the engine core, if it outlived it
            os.killpg(process.pid, signal.SIGKILL)
        return True

    async def metrics(self) -> dict[str, float]:
        """vLLM's own Prometheus samples, summed over label sets (name -> value)."""
        async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
            page = (await client.get(f"{self.url}/metrics")).text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
        return samples
