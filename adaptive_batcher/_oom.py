"""Whether an exception says an allocator ran out of memory: the package's one test."""

from __future__ import annotations

from typing import Final

__all__ = ["OOM_MESSAGES", "is_out_of_memory"]

OOM_MESSAGES: Final = ("out of memory", "can't allocate memory", "not enough memory")
"""What a ``RuntimeError``'s message says when an allocator ran out: CUDA's and most others'
"out of memory", torch's CPU allocator's "can't allocate memory" (2.x) and "not enough memory"
(earlier releases)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """True for ``MemoryError``, any ``OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``,
    ``torch.OutOfMemoryError``, by name) and a ``RuntimeError`` whose message says an allocator
    ran out (:data:`OOM_MESSAGES`)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    if not isinstance(exc, RuntimeError):
        return False
    message = str(exc).lower()
    return any(words in message for words in OOM_MESSAGES)
