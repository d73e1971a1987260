"""Real servers for the gateway's end-to-end tests, all on 127.0.0.1 and a free port: an ASGI
app under uvicorn in the test's own event loop, and the fake engine in a child process (so
that it can be killed), stopped by its PID."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn

from adaptive_batcher.gateway.listener import tcp_listener

ROOT = Path(__file__).parents[2]
STOP_TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in this loop; yields its base URL. The socket listens before
    the URL is yielded, so connections wait in its backlog until uvicorn accepts them."""
    listener = tcp_listener("127.0.0.1", 0, backlog=128)
    port = listener.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    )
    task = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
        except TimeoutError:
            server.force_exit = True
            await task
        listener.close()


class FakeProcess:
    """The fake engine in a child process (``python -m tests.gateway.fake_openai``)."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self, port: int = 0) -> str:
        """Start it (on ``port``, 0: a free one); returns its URL once it listens."""
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.gateway.fake_openai",
            "--port",
            str(port),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        async with asyncio.timeout(60):
            line = (await self.process.stdout.readline()).decode()
        assert line.startswith("fake engine on port "), line
        self.port = int(line.split()[-1])
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def kill(self) -> None:
        """SIGKILL by PID, and reap it."""
        if self.process is not None and self.process.returncode is None:
            os.kill(self.process.pid, signal.SIGKILL)
            await self.process.wait()

    async def stop(self) -> None:
        """SIGTERM by PID (SIGKILL after a bound), and reap it."""
        if self.process is None or self.process.returncode is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await self.process.wait()
        except TimeoutError:
            await self.kill()
