"""An engine in the same process: any ``async`` function that yields a request's pieces.

:class:`InProcessEngine` turns ``generate(request)``, an async iterator of
:class:`~adaptive_batcher.gateway.types.Chunk` objects or strings (a string is one token's
text), into an :class:`~adaptive_batcher.gateway.types.Engine` for
:class:`~adaptive_batcher.gateway.shell.LLMGate`. Closing a stream before its end closes
``generate``'s iterator and then calls ``abort(request)``, once.

vLLM's ``AsyncLLM`` fits with a thin wrapper (a sketch, not run here: vLLM needs a GPU or its
CPU build; ``RequestOutputKind.DELTA`` makes each output carry only the new text and tokens)::

    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    async def generate(request: LLMRequest) -> AsyncIterator[Chunk]:
        body = request.payload  # e.g. {"request_id": "...", "prompt": "...", "temperature": 0}
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=body.get("temperature", 1.0),
            output_kind=RequestOutputKind.DELTA,
        )
        completion = 0
        async for output in llm.generate(body["prompt"], params, request_id=body["request_id"]):
            piece = output.outputs[0]
            completion += len(piece.token_ids)
            usage = None
            if output.finished:
                usage = Usage(len(output.prompt_token_ids or ()), completion)
            yield Chunk(piece.text, tokens=len(piece.token_ids), usage=usage)

    async def abort(request: LLMRequest) -> None:
        await llm.abort(request.payload["request_id"])

    engine = InProcessEngine(generate, abort=abort)

(vLLM also aborts a request whose ``generate`` iterator is closed; the ``abort`` callback makes
that explicit for engines that do not.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from adaptive_batcher._validate import check_callable
from adaptive_batcher.gateway.errors import UpstreamUnavailableError
from adaptive_batcher.gateway.types import Chunk, LLMRequest

__all__ = ["InProcessEngine"]

Generate = Callable[[LLMRequest], AsyncIterator[Chunk | str]]
AbortCallback = Callable[[LLMRequest], Awaitable[None]]

_NEW: Final = 0
_OPEN: Final = 1  # generate() was called and has neither ended nor failed
_ENDED: Final = 2  # it ended (exhausted, or raised an Exception)
_CLOSED: Final = 3


class InProcessEngine:
    """An :class:`~adaptive_batcher.gateway.types.Engine` over an async generator function.

    Args:
        generate: ``generate(request)`` -> an async iterator of ``Chunk`` or ``str`` (one
            token's text: ``Chunk(text, tokens=1)``); called at the stream's first read. Its
            exceptions reach the gate as they are (the caller gets a
            :class:`~adaptive_batcher.llm.errors.RequestFailedError` whose ``cause`` it is).
        abort: ``async abort(request)``, awaited once when a stream that ``generate`` started
            is closed before its end (not after it ended or failed), or None.

    Raises:
        TypeError: ``generate`` or ``abort`` is not callable.
    """

    def __init__(self, generate: Generate, *, abort: AbortCallback | None = None) -> None:
        self._generate: Generate = check_callable("generate", generate)
        self._abort: AbortCallback | None = (
            None if abort is None else check_callable("abort", abort)
        )
        self._closed = False

    def stream(self, request: LLMRequest) -> AsyncIterator[Chunk]:
        """The request's chunks; ``aclose()`` before the end aborts it (see the class)."""
        return _InProcessStream(self, request)

    async def aclose(self) -> None:
        """Refuse new streams (their first read raises
        :class:`~adaptive_batcher.gateway.errors.UpstreamUnavailableError`); streams already
        open run on. Idempotent."""
        self._closed = True

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed


class _InProcessStream:
    """One request's stream over ``generate``; see :class:`InProcessEngine`."""

    __slots__ = ("_engine", "_iterator", "_request", "_state")

    def __init__(self, engine: InProcessEngine, request: LLMRequest) -> None:
        self._engine = engine
        self._request = request
        self._iterator: AsyncIterator[Any] | None = None
        self._state = _NEW

    def __aiter__(self) -> _InProcessStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._state >= _ENDED:
            raise StopAsyncIteration
        iterator = self._iterator
        if iterator is None:
            if self._engine.closed:
                self._state = _ENDED
                raise UpstreamUnavailableError("the in-process engine is closed")
            iterator = self._start()
        try:
            item = await iterator.__anext__()
        except StopAsyncIteration:
            self._state = _ENDED
            raise
        except Exception:
            self._state = _ENDED  # the engine failed it: nothing left to abort
            raise
        return _as_chunk(item)

    def _start(self) -> AsyncIterator[Any]:
        self._state = _ENDED  # until generate() gave an iterator
        produced = self._engine._generate(self._request)
        if not hasattr(produced, "__anext__"):
            kind = type(produced).__name__
            raise TypeError(f"generate must return an async iterator, got {kind}")
        self._iterator = produced
        self._state = _OPEN
        return produced

    async def aclose(self) -> None:
        """Close ``generate``'s iterator; abort the request when it had not ended."""
        if self._state == _CLOSED:
            return
        early = self._state == _OPEN
        self._state = _CLOSED
        close = getattr(self._iterator, "aclose", None)
        abort = self._engine._abort
        try:
            if close is not None:
                await close()
        finally:
            if early and abort is not None:
                await abort(self._request)


def _as_chunk(item: object) -> Chunk:
    if isinstance(item, Chunk):
        return item
    if isinstance(item, str):
        return Chunk(item, tokens=1)
    raise TypeError(f"generate must yield Chunk or str items, got {type(item).__name__}")
