"""A small torch MLP with random weights: the model behind ``adaptive-batcher demo``.

Needs the ``torch`` extra. Built from ``torch.nn`` only (no downloads, no torchvision).
"""

from __future__ import annotations

from typing import Any

__all__ = ["IN_FEATURES", "make_input", "make_mlp", "mlp_batch_fn"]

IN_FEATURES = 256


def make_mlp(
    in_features: int = IN_FEATURES, hidden: int = 1024, out_features: int = 64, seed: int = 0
) -> Any:
    """A 3-layer MLP ``(n, in_features) -> (n, out_features)`` in eval mode, weights seeded."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, out_features),
    )
    return model.eval()


def make_input(in_features: int = IN_FEATURES, seed: int | None = None) -> Any:
    """One input sample: a float32 tensor of shape ``(in_features,)``."""
    import torch

    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return torch.randn(in_features, generator=generator)


def mlp_batch_fn(model: Any | None = None) -> Any:
    """``fn(x: (n, in_features)) -> (n, out_features)`` under ``torch.inference_mode``."""
    import torch

    net = make_mlp() if model is None else model

    def forward(x: Any) -> Any:
        with torch.inference_mode():
            return net(x)

    return forward
