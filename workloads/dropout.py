"""Dropout that draws its masks from a source you give, not from torch's global generator.

Both runners train models with dropout; neither lets it touch the process-wide generator,
so the same seed gives the same masks whatever else the process draws (other peers in the
same process, other threads, the caller's own ``torch.manual_seed``):

- the simulator hashes each peer row's masks from (seed, call, row) under ``vmap``
  (:class:`sim.batched.BatchedPeers`);
- a networked peer's :class:`peer.node.trainer.Trainer` draws them from its own
  ``torch.Generator``.

:class:`SeededDropout` is the one place that knows how ``F.dropout`` and the channel-wise
``F.dropout1d/2d/3d`` turn uniform numbers into a mask: an element (a channel) is kept where
its number is ``>= p`` and scaled by ``1 / (1 - p)``, as torch does. Other random operations
(``AlphaDropout``, ``RReLU``, ``torch.rand`` in a ``forward``) still draw from torch's
generators::

    generator = torch.Generator().manual_seed(0)
    with SeededDropout(lambda shape, device: torch.rand(shape, generator=generator)):
        loss = loss_fn(model(x), y)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

UniformSource = Callable[[Sequence[int], torch.device], Tensor]
"""``(shape, device) -> Tensor`` of that shape, uniform in [0, 1), on ``device``."""

CHANNEL_DROPOUT: dict[Callable[..., Tensor], int] = {
    nn.functional.dropout1d: 1,
    nn.functional.dropout2d: 2,
    nn.functional.dropout3d: 3,
}
"""The channel-wise dropouts and their number of spatial dimensions."""

DROPOUT_MODULES: tuple[type[nn.Module], ...] = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
)
"""The modules whose masks :class:`SeededDropout` draws (they call the functions above)."""

_NAMES = ("input", "p", "training", "inplace")


def has_dropout(module: nn.Module) -> bool:
    """Whether ``module`` holds one of :data:`DROPOUT_MODULES` (a ``forward`` that calls
    ``F.dropout`` itself is not seen: its masks come from :class:`SeededDropout` only where
    the caller enters it anyway)."""
    return any(isinstance(sub, DROPOUT_MODULES) for sub in module.modules())


def mask_shape(func: Callable[..., Tensor], shape: Sequence[int]) -> list[int]:
    """The shape of the numbers one call of ``func`` (``F.dropout`` or a channel-wise one)
    draws for an input of ``shape``: one per element, or one per channel ((N, C, 1, ...),
    (C, 1, ...) for an input without a batch dimension; ``dropout2d`` takes the first two
    dimensions as N, C whatever the input's rank, as torch does)."""
    shape = list(shape)
    spatial = CHANNEL_DROPOUT.get(func)
    if spatial is None:
        return shape
    kept = 2 if spatial == 2 or len(shape) == spatial + 2 else 1
    return shape[:kept] + [1] * (len(shape) - kept)


class SeededDropout(TorchFunctionMode):
    """While active (on the thread that entered it), ``F.dropout`` and
    ``F.dropout1d/2d/3d`` in training draw their masks from ``uniform`` (one call per
    dropout call, in the order of the forward pass); every other function runs as is.

    ``inplace=True`` is honoured as a result, not as a side effect: the masked tensor is
    returned and the input is left as it was (``nn.Dropout(inplace=True)`` uses the result).
    """

    def __init__(self, uniform: UniformSource) -> None:
        super().__init__()
        self.uniform = uniform

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is not nn.functional.dropout and func not in CHANNEL_DROPOUT:
            return func(*args, **kwargs)
        bound = {**dict(zip(_NAMES, args, strict=False)), **kwargs}
        x: Tensor = bound["input"]
        p = float(bound.get("p", 0.5))
        if p < 0.0 or p > 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if not bound.get("training", True) or p == 0.0:
            return x
        uniform = self.uniform(mask_shape(func, x.shape), x.device)
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        return x * ((uniform >= p).to(x.dtype) * scale)
