"""The two models of the GPU check, with random weights: a ResNet and a Llama-shaped decoder.

``torchvision.models.resnet50`` and ``transformers.LlamaForCausalLM`` are used where they import
(both are on the H200 machine); otherwise, and for the tiny shapes of the dry run, the models
below are built from ``torch.nn``: a ResNet with bottleneck blocks (He et al., "Deep Residual
Learning for Image Recognition", 2015; ResNet-50 is 3, 4, 6, 3 blocks from a 64-channel stem)
and a decoder with Llama's layer shape (RMSNorm, grouped-query attention with rotary position
embeddings, a SwiGLU MLP; Touvron et al., "LLaMA", 2023) and a key-value cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from adaptive_batcher.runtime.cuda_graphs import CudaGraphs

__all__ = [
    "Decoder",
    "DecoderShape",
    "ResNet",
    "build_decoder",
    "build_resnet",
    "resnet_forward",
    "tokens",
]


# -- ResNet ----------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4, plus the shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """A bottleneck ResNet: ``layers`` blocks per stage, ``width`` stem channels, 1000 classes."""

    def __init__(self, layers: Sequence[int], width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages: list[nn.Module] = []
        channels = width
        for index, blocks in enumerate(layers):
            stage_width = width * 2**index
            for block in range(blocks):
                stride = 2 if index > 0 and block == 0 else 1
                stages.append(Bottleneck(channels, stage_width, stride))
                channels = stage_width * Bottleneck.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        logits: torch.Tensor = self.head(torch.flatten(functional.adaptive_avg_pool2d(x, 1), 1))
        return logits


def build_resnet(
    layers: Sequence[int],
    width: int,
    device: torch.device,
    dtype: torch.dtype,
    *,
    prefer_torchvision: bool,
    channels_last: bool,
) -> tuple[nn.Module, str]:
    """The model in eval mode on ``device``, and where it came from (``torchvision`` or
    ``torch.nn``); torchvision's resnet50 only for ResNet-50's shape."""
    torch.manual_seed(0)
    model: nn.Module | None = None
    source = "torch.nn"
    if prefer_torchvision and tuple(layers) == (3, 4, 6, 3) and width == 64:
        try:
            from torchvision.models import resnet50  # type: ignore[import-not-found, unused-ignore]

            model, source = resnet50(weights=None), "torchvision"
        except ImportError:
            model = None
    if model is None:
        model = ResNet(layers, width)
    model = model.to(device=device, dtype=dtype).eval()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model, source


def resnet_forward(model: nn.Module, inputs: torch.Tensor) -> Callable[[list[Any]], list[Any]]:
    """The batch model: request ``i`` of a batch of ``n`` reads row ``i`` of ``inputs[:n]``
    (images already on the device: no host copy is timed) and gets its own row of logits."""

    def forward(items: list[Any]) -> list[Any]:
        with torch.inference_mode():
            logits = model(inputs[: len(items)])
        return list(logits.unbind(0))

    return forward


def graphed_forward(
    model: nn.Module, inputs: torch.Tensor, buckets: Sequence[int], capture: Any
) -> Callable[[list[Any]], list[Any]]:
    """:func:`resnet_forward` with the model captured as one CUDA graph per bucket
    (:class:`~adaptive_batcher.runtime.cuda_graphs.CudaGraphs`; ``capture`` None: the real
    capture); the batches it is given must be padded to a bucket."""
    graphs = CudaGraphs(model, inputs[:1], buckets, capture=capture)

    def forward(items: list[Any]) -> list[Any]:
        return list(graphs(inputs[: len(items)]).unbind(0))

    return forward


# -- Llama-shaped decoder --------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderShape:
    """The decoder's dimensions."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def _rotate(x: torch.Tensor, start: int) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, tokens, dim) from position ``start``."""
    dim = x.shape[-1]
    inverse = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=x.device).float() / dim))
    positions = torch.arange(start, start + x.shape[-2], device=x.device).float()
    angles = torch.outer(positions, inverse)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class _Layer(nn.Module):
    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.heads, self.kv_heads = shape.heads, shape.kv_heads
        self.head_dim = shape.hidden // shape.heads
        kv = self.kv_heads * self.head_dim
        self.attn_norm = _RMSNorm(shape.hidden)
        self.q = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.k = nn.Linear(shape.hidden, kv, bias=False)
        self.v = nn.Linear(shape.hidden, kv, bias=False)
        self.o = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.mlp_norm = _RMSNorm(shape.hidden)
        self.gate = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        batch, tokens, _ = x.shape
        h = self.attn_norm(x)
        start = 0 if past is None else past[0].shape[-2]
        q = self.q(h).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, start), _rotate(k, start)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        repeat = self.heads // self.kv_heads
        attended = functional.scaled_dot_product_attention(
            q,
            k.repeat_interleave(repeat, dim=1),
            v.repeat_interleave(repeat, dim=1),
            is_causal=past is None and tokens > 1,
        )
        x = x + self.o(attended.transpose(1, 2).reshape(batch, tokens, -1))
        h = self.mlp_norm(x)
        return x + self.down(functional.silu(self.gate(h)) * self.up(h)), (k, v)


class _Decoder(nn.Module):
    def __init__(self, shape: DecoderShape) -> None:
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(_Layer(shape) for _ in range(shape.layers))
        self.norm = _RMSNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(
        self, ids: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        x = self.embed(ids)
        new_cache = []
        for index, layer in enumerate(self.layers):
            x, kv = layer(x, None if cache is None else cache[index])
            new_cache.append(kv)
        return self.head(self.norm(x[:, -1:])), new_cache


@dataclass
class Decoder:
    """``prefill(ids) -> cache`` and ``decode(ids, cache) -> cache``; ``impl`` says whose."""

    impl: str
    prefill: Callable[[torch.Tensor], Any]
    decode: Callable[[torch.Tensor, Any], Any]
    vocab: int


def build_decoder(
    shape: DecoderShape, device: torch.device, dtype: torch.dtype, *, prefer_transformers: bool
) -> tuple[Decoder, str]:
    """The decoder (random weights, eval, ``dtype`` on ``device``) and a note: empty, or why
    ``transformers`` was not used."""
    note = ""
    if prefer_transformers:
        try:
            return _transformers_decoder(shape, device, dtype), note
        except ImportError:
            note = "transformers is not installed: the torch.nn decoder is used"
        except Exception as exc:  # an API change in transformers must not lose the table
            note = f"transformers failed ({type(exc).__name__}: {exc}): the torch.nn decoder"
    torch.manual_seed(0)
    model = _Decoder(shape).to(device=device, dtype=dtype).eval()

    def prefill(ids: torch.Tensor) -> Any:
        with torch.inference_mode():
            return model(ids, None)[1]

    def decode(ids: torch.Tensor, cache: Any) -> Any:
        with torch.inference_mode():
            return model(ids, cache)[1]

    return Decoder("torch.nn", prefill, decode, shape.vocab), note


def _transformers_decoder(shape: DecoderShape, device: torch.device, dtype: torch.dtype) -> Decoder:
    """``transformers.LlamaForCausalLM`` with random weights; one trial call checks the API."""
    from transformers import (  # type: ignore[import-not-found, unused-ignore]
        LlamaConfig,
        LlamaForCausalLM,
    )

    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
    )
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype).eval()

    def call(ids: torch.Tensor, cache: Any) -> Any:
        with torch.inference_mode():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.past_key_values

    decoder = Decoder("transformers", lambda ids: call(ids, None), call, shape.vocab)
    trial = torch.zeros((1, 2), dtype=torch.long, device=device)
    decoder.decode(trial[:, :1], decoder.prefill(trial))
    return decoder


def tokens(batch: int, length: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Random token ids, (batch, length)."""
    return torch.randint(0, vocab, (batch, length), device=device)
