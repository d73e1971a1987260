"""The library's log events: silent below WARNING until the application configures structlog."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio
from adaptive_batcher import AdaptiveBatcher
from adaptive_batcher._log import get_logger
async def main():
    async with AdaptiveBatcher(lambda b: b, max_batch_size=4, window_ms=0) as batcher:
        await batcher.submit_many(range(40))  # ten batches: ten batch.dispatched debug events
    get_logger().warning("test.warning_still_shown", code=7)
{configure}
asyncio.run(main())
"""


def run(configure: str) -> str:
    code = SCRIPT.format(configure=configure)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout


def test_an_unconfigured_application_sees_only_warnings() -> None:
    out = run("")
    assert "batch.dispatched" not in out
    assert "batcher.closing" not in out  # an info event
    assert "test.warning_still_shown" in out


def test_a_configured_application_gets_every_event() -> None:
    out = run("import structlog; structlog.configure()")
    assert out.count("batch.dispatched") == 10
    assert "test.warning_still_shown" in out


def test_describe_bounds_what_an_exception_puts_in_a_log_line() -> None:
    from adaptive_batcher.errors import DESCRIBE_MAX_CHARS, describe

    short = ValueError("short")
    assert describe(short) == "ValueError('short')"
    long = ValueError("SECRET-" + "a" * 100_000)
    text = describe(long)
    assert len(text) < DESCRIBE_MAX_CHARS + 40
    assert text.startswith("ValueError('SECRET-aaa") and text.endswith("more characters)")

    class BadReprError(Exception):
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert describe(BadReprError()) == "<BadReprError: repr() failed>"
