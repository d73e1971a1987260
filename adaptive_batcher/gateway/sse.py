"""Server-sent events as OpenAI-compatible engines stream them: split a byte stream into events
and read an event's data, keeping each event's bytes for forwarding unchanged.

An event ends at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``); its data is the
``data:`` lines' values (one leading space dropped) joined by ``\\n`` (the WHATWG HTML
standard, section 9.2 "Server-sent events").
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["DONE", "SSESplitter", "event_data"]

DONE: Final = "[DONE]"
"""The data of the event that ends an OpenAI stream."""

_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(r"\r\n|\n|\r")


class SSESplitter:
    """Cut a byte stream into whole events: :meth:`feed` bytes as they arrive, get back the
    events they complete, each with its terminating blank line; :attr:`pending` holds the
    start of an event not yet ended."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event."""
        return self._buffer

    def feed(self, data: bytes) -> list[bytes]:
        """The events that ``data`` completes, in order (raw bytes, blank line included)."""
        buffer = self._buffer + data
        events: list[bytes] = []
        start = 0
        while (match := _END.search(buffer, start)) is not None:
            events.append(buffer[start : match.end()])
            start = match.end()
        self._buffer = buffer[start:]
        return events


def event_data(event: bytes) -> str | None:
    """The data of one raw event, or None when it has no ``data:`` line (a comment or a
    keep-alive).

    Raises:
        UnicodeDecodeError: the event is not UTF-8.
    """
    values = []
    for line in _LINE.split(event.decode("utf-8")):
        if line.startswith("data:"):
            value = line[5:]
            values.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(values) if values else None
