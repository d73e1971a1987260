"""The README's examples run as the README says to run them: the "Use it" script with
``python quickstart.py``, and the FastAPI service with ``uvicorn app:app`` (the packages it
names to install are this project's dev dependencies)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def block_after(heading: str) -> str:
    """The first ```python block after ``heading`` in the README."""
    found = re.search(
        rf"^{re.escape(heading)}\n.*?^```python\n(.*?)^```", README, re.MULTILINE | re.DOTALL
    )
    assert found is not None, f"README.md has no python block after {heading!r}"
    return found.group(1)


def test_the_use_it_example_runs_as_a_script(tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(block_after("## Use it"), encoding="utf-8")
    assert "Save it as `quickstart.py` and run `python quickstart.py`" in README
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[11.0, 1.0] [[1.0, 0.0], [3.0, 1.0]]"  # as its comment says
    assert lines[1].startswith("BatcherStats(name=")
    assert "completed=3" in lines[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.slow
def test_the_fastapi_example_serves_under_uvicorn_as_the_readme_says(tmp_path: Path) -> None:
    section = README[README.index("### In a FastAPI service") :]
    assert "Save it as `app.py`, then `pip install fastapi uvicorn prometheus-client`" in section
    assert "`uvicorn app:app`" in section
    (tmp_path / "app.py").write_text(block_after("### In a FastAPI service"), encoding="utf-8")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "info"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        answer = None
        deadline = time.monotonic() + 120
        while answer is None and time.monotonic() < deadline and server.poll() is None:
            try:
                answer = httpx.post(f"{url}/predict", json=[0.5] * 256, timeout=30)
            except httpx.TransportError:  # not listening yet
                time.sleep(0.2)
        assert answer is not None, "uvicorn did not serve app:app"
        assert answer.status_code == 200
        assert len(answer.json()) == 10  # torch.nn.Linear(256, 10)
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert 'adaptive_batcher_requests_submitted_total{batcher="linear"} 1.0' in metrics
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    # on SIGTERM uvicorn runs the lifespan's exit (the batcher drains), then re-raises the signal
    assert server.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete." in output
    assert "Traceback" not in output
