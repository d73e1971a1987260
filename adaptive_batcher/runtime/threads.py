"""Threads for a model that computes in a worker thread, and a check that it leaves the event
loop a core.

The loop forms the batches, scatters the results and parses the requests; a torch model in a
worker thread computes with torch's intra-op threads, one per core by default. With every core
busy in the model, the loop waits for a core on each request (see docs/tuning.md, "Threads").
"""

from __future__ import annotations

from typing import Any

from adaptive_batcher._threads import available_cores, current_torch_threads

__all__ = ["check_threads", "serving_threads"]


def serving_threads() -> int:
    """Intra-op threads for a model in a worker thread: the cores this process may use
    (its CPU affinity) less one for the event loop, at least 1; for
    ``torch.set_num_threads(serving_threads())``."""
    return max(1, (available_cores() or 1) - 1)


def check_threads(log: Any, batcher: str) -> None:
    """Warn (``batcher.threads_oversubscribed``) when torch, already imported, computes with as
    many intra-op threads as this process has cores (and it has several): the loop gets none."""
    threads, cores = current_torch_threads(), available_cores() or 1
    if threads is not None and cores > 1 and threads.intra_op >= cores:
        log.warning(
            "batcher.threads_oversubscribed",
            batcher=batcher,
            torch_threads=threads.intra_op,
            cores=cores,
            advice=f"torch.set_num_threads({serving_threads()}): leave the event loop a core",
        )
