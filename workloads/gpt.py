"""A small decoder-only transformer (GPT-like) for byte-level language modelling, and text
generation from any such model.

``gpt:layers=2,width=128,heads=4`` (``MODELS``; ``context`` defaults to the data set's
context length): token embedding plus a learned positional embedding, ``layers`` pre-norm
blocks ``h <- h + Attn(LN(h))``, ``h <- h + MLP(LN(h))`` (Radford et al. 2019, GPT-2), a
final LayerNorm, and the output layer tied to the input embedding (Press & Wolf 2017):
``logits = LN(h) E^T``, ``[B, L, V]``.

- Attention: causal multi-head self-attention, ``softmax(Q K^T / sqrt(d) + M) V`` with
  ``M[s, t] = -inf`` for ``t > s`` (position s never sees a later one), written out with
  matmuls rather than ``F.scaled_dot_product_attention``: torch.func has no batching rule
  for the latter on the CPU and runs it one peer at a time, while the matmuls batch over
  the simulator's peers.
- MLP: ``Linear(w, 4w)``, GELU, ``Linear(4w, w)``. No dropout.
- Initialisation (GPT-2's): weights N(0, 0.02), the residual projections N(0, 0.02 /
  sqrt(2 layers)), biases 0, LayerNorms 1 and 0; drawn from the generator that
  :func:`workloads.build_model` seeds, so the same seed gives the same weights.

Sizes with a 256-byte vocabulary and context 128: the defaults 447,232 parameters;
``width=64`` 120,832; ``layers=4,width=256,heads=8`` 3.2M.

:func:`generate` continues a prompt with a trained model (this one or your own that maps
``[B, L]`` tokens to ``[B, L, V]`` logits)::

    >>> from workloads import build_model, generate
    >>> model = build_model("gpt:width=32,heads=2", (16,), 256, seed=0)
    >>> len(generate(model, "def ", 8, seed=0).encode("utf-8", "surrogateescape"))
    8
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from workloads._registry import Entry, Param
from workloads.models import MODELS

__all__ = ["GPT", "causal_attention", "generate"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position s attends to positions 0..s only."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, h: Tensor) -> Tensor:
        return self.proj(causal_attention(self.qkv(h), self.heads))


def causal_attention(qkv: Tensor, heads: int) -> Tensor:
    """Causal multi-head self-attention of ``qkv [..., L, 3w]`` (queries, keys and values side
    by side, as :class:`CausalSelfAttention`'s ``qkv`` layer writes them) -> ``[..., L, w]``:
    ``softmax(Q K^T / sqrt(d) + M) V`` per head, ``M[s, t] = -inf`` for ``t > s``. Any
    leading dimensions (a batch; the simulator's peers, ``sim.gpt_kernel``)."""
    *batch, length, triple = qkv.shape
    width = triple // 3
    head = width // heads
    q, k, v = (
        part.reshape(*batch, length, heads, head).transpose(-3, -2)
        for part in qkv.split(width, dim=-1)
    )  # [..., heads, L, head]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head))
    future = torch.ones(length, length, dtype=torch.bool, device=qkv.device).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return (weights @ v).transpose(-3, -2).reshape(*batch, length, width)


class Block(nn.Module):
    """One pre-norm transformer block: attention, then a 4x MLP, each around a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.attention(self.norm1(h))
        return h + self.mlp(self.norm2(h))


class GPT(nn.Module):
    """A decoder-only transformer: tokens ``[B, L]`` (``L <= context``) -> logits ``[B, L, V]``.

    ``input_shape`` is ``(L,)``, a data set's context length; ``num_classes`` is the
    vocabulary size V; ``context`` (default ``L``) is the longest sequence the positional
    embedding covers.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        layers: int = 2,
        width: int = 128,
        heads: int = 4,
        context: int | None = None,
    ) -> None:
        super().__init__()
        shape = tuple(input_shape)
        if len(shape) != 1:
            raise ValueError(
                f"gpt: input_shape must be (context length,) of token contexts, got {shape}; "
                "allowed: a language model's data set such as text"
            )
        length = context if context is not None else shape[0]
        for name, value in (("layers", layers), ("width", width), ("heads", heads)):
            if value < 1:
                raise ValueError(f"gpt: {name} must be >= 1, got {value}")
        if width % heads:
            raise ValueError(f"gpt: width ({width}) must be a multiple of heads ({heads})")
        if length < shape[0]:
            raise ValueError(
                f"gpt: context ({length}) must be >= the data set's context length {shape[0]}"
            )
        self.context = length
        self.embedding = nn.Embedding(num_classes, width)
        self.position = nn.Parameter(torch.empty(length, width))
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.embedding.weight, std=0.02)
        nn.init.normal_(self.position, std=0.02)
        for block in self.blocks:
            assert isinstance(block, Block)
            for projection in (block.attention.proj, block.mlp[2]):
                assert isinstance(projection, nn.Linear)
                nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[-1]
        if length > self.context:
            raise ValueError(f"gpt: {length} tokens exceed the model's context {self.context}")
        h = self.embedding(tokens) + self.position[:length]
        h = self.norm(self.blocks(h))
        return nn.functional.linear(h, self.embedding.weight)  # tied: logits = h E^T


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: str | bytes,
    n: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    context: int | None = None,
) -> str:
    """The ``n`` bytes ``model`` writes after ``prompt``, decoded as UTF-8 (invalid bytes
    kept as surrogates, so ``.encode("utf-8", "surrogateescape")`` gives them back).

    Each step feeds the last ``context`` tokens (default: the model's ``context`` attribute,
    else everything so far) and takes the next byte from the last position's logits ``z``:
    ``argmax z`` when ``temperature`` is 0 (greedy), else a draw from ``softmax(z /
    temperature)`` by a generator seeded with ``seed`` (same seed, same text). Runs in eval
    mode on the model's device and restores the mode.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: must be an integer >= 0, got {n!r}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature: must be >= 0, got {temperature}")
    raw = prompt.encode("utf-8", "surrogateescape") if isinstance(prompt, str) else prompt
    if not raw:
        raw = b"\n"  # a model needs at least one token to condition on
    window = context if context is not None else getattr(model, "context", None)
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    tokens = torch.tensor(list(raw), dtype=torch.int64, device=device).unsqueeze(0)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    training = model.training
    model.eval()
    try:
        for _ in range(n):  # autoregressive: each byte needs the one before
            visible = tokens if window is None else tokens[:, -int(window) :]
            logits = model(visible)[0, -1].float().cpu()
            if temperature == 0.0:
                following = int(logits.argmax())
            else:
                probabilities = (logits / temperature).softmax(dim=-1)
                following = int(torch.multinomial(probabilities, 1, generator=generator))
            tokens = torch.cat((tokens, tokens.new_tensor([[following]])), dim=1)
    finally:
        model.train(training)
    produced = tokens[0, len(raw) :].tolist()
    if any(token > 255 for token in produced):
        raise ValueError(
            f"generate: the model wrote token {max(produced)}; generate decodes bytes, so the "
            "model's vocabulary must be the 256 byte values"
        )
    written = bytes(produced)
    return written.decode("utf-8", "surrogateescape")


MODELS["gpt"] = Entry(
    "gpt",
    GPT,
    {
        "layers": Param(int, 2, "transformer blocks"),
        "width": Param(int, 128, "embedding width"),
        "heads": Param(int, 4, "attention heads (width must be a multiple)"),
        "context": Param(int, None, "longest sequence (default: the data set's context)", True),
    },
    "decoder-only transformer: causal attention, pre-norm, tied embeddings (language models)",
)
