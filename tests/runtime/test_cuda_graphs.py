"""CudaGraphs: one graph per bucket, copies in and out, typed errors; run on the CPU through
EagerGraphCapture (the real capture runs in benchmarks/gpu on a GPU)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from adaptive_batcher import AdaptiveBatcher  # noqa: E402
from adaptive_batcher.runtime.cuda_graphs import CudaGraphs  # noqa: E402
from adaptive_batcher.testing import EagerGraphCapture, FakeCudaEvent  # noqa: E402

BUCKETS = (1, 2, 4, 8)


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def graphs(module: Any, capture: EagerGraphCapture, sizes: tuple[int, ...] = BUCKETS) -> Any:
    return CudaGraphs(module, torch.zeros(1, 6), sizes, capture=capture)


@pytest.mark.parametrize("size", BUCKETS)
def test_a_replay_gives_what_the_model_gives(size: int) -> None:
    module, capture = model(), EagerGraphCapture()
    graphed = graphs(module, capture)
    x = torch.randn(size, 6)
    with torch.no_grad():
        expected = module(x)
    assert torch.allclose(graphed(x), expected)
    assert capture.replays == 1


def test_one_graph_per_size_captured_largest_first_after_the_warmup() -> None:
    seen: list[int] = []
    capture = EagerGraphCapture()

    def module(x: Any) -> Any:
        seen.append(int(x.shape[0]))
        return x * 2.0

    graphed = CudaGraphs(module, torch.zeros(1, 6), [4, 1, 2, 4], warmup_calls=2, capture=capture)
    assert graphed.batch_sizes == (1, 2, 4)
    assert capture.captures == 3
    assert seen == [4, 4, 4, 2, 2, 2, 1, 1, 1]  # two warm-up calls, then the captured one


def test_the_result_is_the_callers_to_keep() -> None:
    graphed = graphs(model(), EagerGraphCapture())
    first_input = torch.randn(2, 6)
    first = graphed(first_input)
    kept = first.clone()
    graphed(torch.randn(2, 6))  # the same graph again: its own output is overwritten
    assert torch.equal(first, kept)


def test_an_uncaptured_size_or_row_shape_is_a_clear_error() -> None:
    graphed = graphs(model(), EagerGraphCapture())
    with pytest.raises(
        ValueError, match=r"no CUDA graph for a batch of 3; captured: \(1, 2, 4, 8\)"
    ):
        graphed(torch.zeros(3, 6))
    with pytest.raises(ValueError, match=r"rows of shape \(7,\) given.*\(6,\)"):
        graphed(torch.zeros(2, 7))


@pytest.mark.parametrize(
    ("sizes", "warmup_calls", "error", "match"),
    [
        ((), 3, ValueError, "at least one batch size"),
        ((0, 2), 3, ValueError, "batch size"),
        ((1.5,), 3, TypeError, "batch size"),
        ((2,), 0, ValueError, "warmup_calls"),
    ],
)
def test_bad_arguments_are_refused(
    sizes: tuple[Any, ...], warmup_calls: int, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        CudaGraphs(
            model(),
            torch.zeros(1, 6),
            sizes,
            warmup_calls=warmup_calls,
            capture=EagerGraphCapture(),
        )


def test_a_channels_last_example_gives_channels_last_static_inputs() -> None:
    example = torch.zeros(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    formats: list[bool] = []

    def module(x: Any) -> Any:
        formats.append(x.is_contiguous(memory_format=torch.channels_last))
        return x.sum(dim=(2, 3))

    graphed = CudaGraphs(module, example, (2,), warmup_calls=1, capture=EagerGraphCapture())
    x = torch.randn(2, 3, 4, 4)
    assert torch.allclose(graphed(x), x.sum(dim=(2, 3)))
    assert all(formats)


async def test_behind_the_batcher_with_buckets_every_caller_gets_its_row() -> None:
    module, capture = model(), EagerGraphCapture()
    graphed = graphs(module, capture)

    def batch(items: list[Any]) -> list[Any]:
        return list(graphed(torch.stack(items)).unbind(0))

    async with AdaptiveBatcher(
        batch,
        executor="cuda",
        cuda_event_factory=FakeCudaEvent,
        batch_sizes=BUCKETS,
        max_batch_size=8,
        window_ms=2,
    ) as batcher:
        rows = [torch.randn(6) for _ in range(11)]
        results = await batcher.submit_many(rows)
    with torch.no_grad():
        expected = module(torch.stack(rows))
    assert torch.allclose(torch.stack(list(results)), expected, atol=1e-6)
    assert capture.replays >= 2  # 11 rows need two batches at least


def test_inputs_of_another_dtype_are_refused() -> None:
    graphed = graphs(model(), EagerGraphCapture())
    with pytest.raises(ValueError, match=r"rows of torch.float64 on cpu given.*torch.float32"):
        graphed(torch.zeros(2, 6, dtype=torch.float64))


def test_an_example_of_more_than_one_row_is_refused() -> None:
    with pytest.raises(ValueError, match=r"shape \[1, \*row_shape\], got \(2, 6\)"):
        CudaGraphs(model(), torch.zeros(2, 6), BUCKETS, capture=EagerGraphCapture())


def test_a_module_that_returns_a_tuple_is_refused_when_captured() -> None:
    def pair(x: Any) -> Any:
        return x, x

    with pytest.raises(TypeError, match="must return one tensor to capture, got tuple"):
        CudaGraphs(pair, torch.zeros(1, 6), BUCKETS, capture=EagerGraphCapture())


async def test_two_slots_in_threads_share_the_graphs_safely() -> None:
    """The graphs' buffers are shared: calls from two worker threads are serialised."""
    module = model()
    graphed = graphs(module, EagerGraphCapture(), (1, 2, 4, 8, 16, 32))

    def batch(items: list[Any]) -> list[Any]:
        return list(graphed(torch.stack(items)).unbind(0))

    rows = [torch.randn(6) for _ in range(400)]
    async with AdaptiveBatcher(
        batch,
        executor="thread",
        max_concurrent_batches=2,
        batch_sizes=(1, 2, 4, 8, 16, 32),
        max_batch_size=32,
        window_ms=1,
    ) as batcher:
        results = await asyncio.gather(*(batcher.submit(row) for row in rows))
    with torch.no_grad():
        expected = module(torch.stack(rows))
    assert torch.allclose(torch.stack(list(results)), expected, atol=1e-6)
