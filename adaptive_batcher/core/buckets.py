"""Allowed batch sizes ("buckets"): validation, the bucket a batch pads up to, warm-up sizes."""

from __future__ import annotations

import math
from collections.abc import Iterable

from adaptive_batcher._validate import check_increasing_ints
from adaptive_batcher.control.types import pad_target

__all__ = ["check_buckets", "pad_target", "warmup_sizes"]


def warmup_sizes(buckets: tuple[int, ...], cap: int) -> tuple[int, ...]:
    """The buckets, or without buckets the powers of two up to ``cap`` and ``cap`` itself."""
    if buckets:
        return buckets
    sizes = [1 << k for k in range(int(math.log2(cap)) + 1)]
    return tuple(sizes) if sizes[-1] == cap else (*sizes, cap)


def check_buckets(batch_sizes: Iterable[int] | None, cap: int) -> tuple[int, ...]:
    """``batch_sizes`` as a tuple (empty for None); the largest must be the cap ``cap``.

    A batch pads up to the next bucket, so a bucket above the cap would pad past it, and a cap
    above the largest bucket would leave a full batch without a bucket to pad to.

    Raises:
        TypeError, ValueError: not a strictly increasing sequence of ints >= 1.
        ValueError: a bucket above ``cap``, or ``cap`` above the largest bucket.
    """
    if batch_sizes is None:
        return ()
    buckets = check_increasing_ints("batch_sizes", batch_sizes, 1)
    above = [b for b in buckets if b > cap]
    if above:
        raise ValueError(
            f"batch_sizes {above} exceed max_batch_size ({cap}), the hard cap: a batch is "
            "never padded past it; drop them or raise max_batch_size"
        )
    if cap > buckets[-1]:
        raise ValueError(
            f"max_batch_size ({cap}) must not exceed the largest of batch_sizes ({buckets[-1]}): "
            f"a full batch would have no bucket to pad to; add {cap} to batch_sizes or lower "
            "max_batch_size"
        )
    return buckets
