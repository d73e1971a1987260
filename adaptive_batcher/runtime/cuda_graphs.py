"""CUDA graphs per bucket: a tensor model replayed in one launch instead of one per kernel.

Eager PyTorch launches every kernel from Python. With the split executor (``executor="cuda"``)
those launches run on the event-loop thread: a ResNet-50 forward is 5-6 ms of it on an H200
(measured; docs/benchmarks.md), so at thousands of requests a second the loop itself becomes
the queue. A CUDA graph captured once per batch size replays the whole forward in one launch.
Buckets (``batch_sizes``) make the shapes few and known, which is what graphs need. Source: the
"CUDA Graphs" section of PyTorch's CUDA semantics notes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from adaptive_batcher._validate import check_int

__all__ = ["CudaGraphs", "GraphCapture", "capture_cuda_graph"]

GraphCapture = Callable[[Callable[[], Any], int], tuple[Callable[[], None], Any]]
"""``capture(forward, warmup_calls) -> (replay, output)``: runs ``forward`` ``warmup_calls``
times, captures one call, and returns what replays it and the tensor each replay writes."""


def capture_cuda_graph(
    forward: Callable[[], Any], warmup_calls: int, *, pool: Any = None
) -> tuple[Any, Any]:
    """Capture ``forward()`` as a ``torch.cuda.CUDAGraph`` after ``warmup_calls`` eager calls on
    a side stream (lazy initialisation and cuDNN's choices happen outside the capture), in the
    memory ``pool`` (``torch.cuda.graph_pool_handle()``; None: the graph's own); returns
    ``(graph.replay, output)``. Raises what torch raises (no CUDA, an op that cannot be captured).
    """
    import torch

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_calls):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: a telemetry sampler or another thread may call CUDA meanwhile
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        output = forward()
    return graph.replay, output


@dataclass(frozen=True)
class _Graph:
    replay: Callable[[], None]
    static_input: Any
    output: Any


class CudaGraphs:
    """A tensor model as one captured CUDA graph per batch size.

    Calling it with ``x`` of shape ``[n, *row_shape]`` copies ``x`` into the graph of size ``n``,
    replays it and returns a copy of its output (``[n, ...]``, the caller's to keep: the next
    replay overwrites the graph's own output). Three launches whatever the model's depth. Use it
    inside the batch function, with the batcher's ``batch_sizes`` as the sizes, so that every
    padded batch has its graph. Calls are serialised by a lock (the graphs share their static
    buffers), so a thread executor with several slots stays correct, one replay at a time; the
    split executor (``executor="cuda"``) enqueues them in order on one stream. Gradients are
    off throughout (``torch.no_grad``).

    Args:
        module: the model, ``module(x) -> Tensor`` for ``x`` of shape ``[n, *row_shape]``; it must
            be capturable: no host synchronisation, no shapes that depend on data.
        example: one input of shape ``[1, *row_shape]``, with the dtype, device and memory
            format (channels-last kept) of the real inputs; its values feed the warm-up only.
            Inputs of another dtype or device are refused at the call.
        batch_sizes: the sizes to capture (each an int >= 1), captured largest first.
        warmup_calls: eager calls before each capture, an int >= 1 (default 3).
        capture: how one graph is captured (default :func:`capture_cuda_graph`, every graph
            in one memory pool: replays never overlap, so their intermediates can share it;
            tests pass :class:`~adaptive_batcher.testing.EagerGraphCapture`).

    Raises:
        ValueError: no sizes, a size or ``warmup_calls`` below 1, an example whose first
            dimension is not 1; at a call, a batch size that was not captured, or rows of
            another shape, dtype or device.
        TypeError: a size that is not an int; a module that does not return one tensor.
    """

    def __init__(
        self,
        module: Callable[[Any], Any],
        example: Any,
        batch_sizes: Iterable[int],
        *,
        warmup_calls: int = 3,
        capture: GraphCapture | None = None,
    ) -> None:
        sizes = sorted({check_int("batch size", size, 1) for size in batch_sizes}, reverse=True)
        if not sizes:
            raise ValueError("batch_sizes must name at least one batch size")
        warmup_calls = check_int("warmup_calls", warmup_calls, 1)
        if example.dim() < 1 or example.shape[0] != 1:
            raise ValueError(
                f"example must be one input of shape [1, *row_shape], got {tuple(example.shape)}"
            )
        if capture is None:
            import torch

            capture = functools.partial(capture_cuda_graph, pool=torch.cuda.graph_pool_handle())
        self._row_shape = tuple(example.shape[1:])
        self._dtype, self._device = example.dtype, example.device
        self._lock = threading.Lock()
        self._graphs = {
            size: _capture(module, example, size, warmup_calls, capture) for size in sizes
        }

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The captured batch sizes, ascending."""
        return tuple(sorted(self._graphs))

    def __call__(self, x: Any) -> Any:
        graph = self._graphs.get(int(x.shape[0]))
        if graph is None:
            raise ValueError(
                f"no CUDA graph for a batch of {x.shape[0]}; captured: {self.batch_sizes} "
                "(pass the batcher's batch_sizes)"
            )
        if tuple(x.shape[1:]) != self._row_shape:
            raise ValueError(
                f"rows of shape {tuple(x.shape[1:])} given; the graphs were captured for "
                f"{self._row_shape}"
            )
        if x.dtype != self._dtype or x.device != self._device:
            raise ValueError(
                f"rows of {x.dtype} on {x.device} given; the graphs were captured for "
                f"{self._dtype} on {self._device}"
            )
        import torch

        with self._lock, torch.no_grad():
            graph.static_input.copy_(x)
            graph.replay()
            return graph.output.clone()


def _static_input(example: Any, size: int) -> Any:
    """A tensor of ``size`` rows like ``example``'s (memory format kept), filled with it."""
    import torch

    channels_last = (
        example.dim() == 4
        and not example.is_contiguous()
        and example.is_contiguous(memory_format=torch.channels_last)
    )
    layout = torch.channels_last if channels_last else torch.contiguous_format
    shape = (size, *example.shape[1:])
    static = torch.empty(shape, dtype=example.dtype, device=example.device, memory_format=layout)
    static.copy_(example.expand(shape))
    return static


def _capture(
    module: Callable[[Any], Any],
    example: Any,
    size: int,
    warmup_calls: int,
    capture: GraphCapture,
) -> _Graph:
    import torch

    with torch.no_grad():
        static_input = _static_input(example, size)
        replay, output = capture(lambda: module(static_input), warmup_calls)
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"the module must return one tensor to capture, got {type(output).__name__}"
        )
    return _Graph(replay, static_input, output)
