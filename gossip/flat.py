"""A model's parameters as one contiguous vector, with views back into the module.

Gossip mixes whole models: ``x_i <- sum_j W_ij x_j``. Done per tensor that is a Python loop
per parameter and a serialization per tensor; done on one flat buffer it is one vector
operation and one memory block on the wire. :class:`FlatParameters` moves every parameter
(and, on request, every floating-point buffer such as BatchNorm running statistics) of a
module into one contiguous tensor and points the module's tensors at slices of it, so the
module keeps working unchanged while gossip code reads and writes the flat vector.

Which buffers travel is one rule, :func:`averageable`: a buffer is mixed with the model
only if it is floating point and every value is finite (running statistics). Integer
buffers (counters such as BatchNorm's ``num_batches_tracked``) and buffers holding
infinities or NaN (a causal mask from ``nn.Transformer.generate_square_subsequent_mask``,
``-inf`` above the diagonal) are constants of the model: each peer keeps its own, and
they are never averaged or sent. The simulator keeps every buffer as a constant of the
shared template (``sim.batched``), so the two runners agree on such models; the model
file's average (``peer.app.model_average``) applies the same rule.

Gradients get the same treatment: each trainable parameter's ``.grad`` is a view into one
flat gradient buffer, and :attr:`FlatParameters.parameter` is a single ``nn.Parameter`` whose
``.grad`` is that buffer, so any torch optimizer steps the whole model in one call. Frozen
parameters (``requires_grad=False``) come after the trainable ones, outside that view: an
optimizer never touches them (no weight decay, no momentum), but they stay in the flat
vector, so they are shipped and mixed with the model (a no-op while every peer holds the
same frozen values)::

    flat = FlatParameters(model)
    optimizer = torch.optim.SGD([flat.parameter], lr=0.1, momentum=0.9)
    flat.zero_grad()
    loss_fn(model(x), y).backward()     # gradients land in flat.grad
    optimizer.step()                    # one vector update of the whole model
    flat.vector                         # [d] the model, ready to mix or serialize

:class:`ParameterLayout` is the name/shape/offset table on its own; its
:meth:`~ParameterLayout.unflatten` turns a batch of flat vectors ``[*, d]`` into a dict of
``[*, ...]`` views that ``torch.func.functional_call`` accepts, which is how the simulator
evaluates n models stacked as ``[n, d]`` with ``torch.func.vmap``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["FlatParameters", "LayoutEntry", "ParameterLayout", "averageable"]


def averageable(tensor: Tensor) -> bool:
    """Whether ``tensor`` may be averaged across peers: floating point, every value finite.

    The rule for a module's buffers (and for the model file's average): running statistics
    pass; integer counters and masks holding ``-inf`` (or NaN) do not, and stay local.
    """
    return tensor.is_floating_point() and bool(torch.isfinite(tensor).all())


@dataclass(frozen=True)
class LayoutEntry:
    """One tensor of a module inside the flat vector: ``vector[offset : offset + numel]``."""

    name: str
    shape: tuple[int, ...]
    offset: int
    kind: Literal["parameter", "frozen", "buffer"]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ParameterLayout:
    """Where each named tensor of a module lives in the flat vector.

    Order: trainable parameters (kind ``"parameter"``), then frozen parameters
    (``requires_grad=False``, kind ``"frozen"``), then the buffers that may be averaged
    (:func:`averageable`: floating point and finite; kind ``"buffer"``), each group in the
    module's own order.
    """

    entries: tuple[LayoutEntry, ...]

    @classmethod
    def from_module(cls, module: nn.Module, *, buffers: bool = False) -> ParameterLayout:
        """Layout of ``module``'s trainable, then frozen parameters, then (if ``buffers``) its
        :func:`averageable` buffers."""
        entries: list[LayoutEntry] = []
        offset = 0
        for name, tensor in _named_tensors(module, buffers=buffers):
            entries.append(LayoutEntry(name, tuple(tensor.shape), offset, _kind(tensor)))
            offset += tensor.numel()
        return cls(tuple(entries))

    @property
    def numel(self) -> int:
        """Length d of the flat vector."""
        return self.entries[-1].offset + self.entries[-1].numel if self.entries else 0

    @property
    def num_parameter_elements(self) -> int:
        """Length of the leading trainable-parameter part (the part an optimizer steps)."""
        return sum(e.numel for e in self.entries if e.kind == "parameter")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def locate(self, coordinate: int) -> str:
        """Which tensor coordinate ``coordinate`` of the flat vector belongs to, in words:
        ``"tensor 'mask' (a buffer), element 5"``; past the last tensor (push-sum's weight
        at ``d``) ``"coordinate d, past the model's tensors"``."""
        offsets = [e.offset for e in self.entries]
        at = bisect.bisect_right(offsets, coordinate) - 1
        if coordinate < 0 or at < 0 or coordinate >= self.numel:
            return f"coordinate {coordinate}, past the model's tensors"
        entry = self.entries[at]
        return f"tensor {entry.name!r} (a {entry.kind}), element {coordinate - entry.offset}"

    def unflatten(self, vector: Tensor) -> dict[str, Tensor]:
        """``[*, d] -> {name: [*, *shape]}``, every value a view into ``vector`` (no copy)."""
        if vector.dim() < 1 or vector.shape[-1] != self.numel:
            raise ValueError(
                f"vector must have last dimension d={self.numel}, got shape {tuple(vector.shape)}"
            )
        return {
            e.name: vector[..., e.offset : e.offset + e.numel].unflatten(-1, e.shape or (1,))
            if e.shape
            else vector[..., e.offset]
            for e in self.entries
        }

    def flatten(self, tensors: Mapping[str, Tensor]) -> Tensor:
        """``{name: [*, *shape]} -> [*, d]`` (a new tensor); the inverse of :meth:`unflatten`."""
        missing = [e.name for e in self.entries if e.name not in tensors]
        if missing:
            raise ValueError(f"tensors is missing entries {missing}; expected {list(self.names)}")
        parts = []
        batch: tuple[int, ...] | None = None
        for e in self.entries:
            t = tensors[e.name]
            rank = len(e.shape)
            if tuple(t.shape[t.dim() - rank :]) != e.shape:
                raise ValueError(
                    f"tensors[{e.name!r}] must end in shape {e.shape}, got {tuple(t.shape)}"
                )
            lead = tuple(t.shape[: t.dim() - rank])
            if batch is None:
                batch = lead
            elif lead != batch:
                raise ValueError(f"tensors[{e.name!r}] has batch shape {lead}, others have {batch}")
            parts.append(t.reshape(*lead, e.numel))
        return torch.cat(parts, dim=-1)


def _kind(tensor: Tensor) -> Literal["parameter", "frozen", "buffer"]:
    if not isinstance(tensor, nn.Parameter):
        return "buffer"
    return "parameter" if tensor.requires_grad else "frozen"


def _named_tensors(module: nn.Module, *, buffers: bool) -> Iterator[tuple[str, Tensor]]:
    """Trainable parameters, frozen parameters, then (if ``buffers``) the
    :func:`averageable` buffers (integer counters and non-finite masks stay local)."""
    parameters = list(module.named_parameters())
    yield from ((name, p) for name, p in parameters if p.requires_grad)
    yield from ((name, p) for name, p in parameters if not p.requires_grad)
    if buffers:
        for name, buffer in module.named_buffers():
            if averageable(buffer):
                yield name, buffer


class FlatParameters:
    """One contiguous buffer holding a module's parameters, the module's tensors viewing into it.

    Args:
        module: the model; its parameters (and with ``buffers=True`` its floating-point
            buffers) are copied once into :attr:`vector` and re-pointed at slices of it.
            Which parameters are trainable is read now: wrap again after changing
            ``requires_grad``.
        buffers: also carry the :func:`averageable` buffers (BatchNorm running statistics),
            after the parameters, so they are mixed and shipped with the model. Integer
            buffers such as ``num_batches_tracked`` and non-finite ones (a ``-inf`` causal
            mask) stay where they are: each peer's own.

    Attributes:
        layout: the :class:`ParameterLayout` (names, shapes, offsets).
        vector: ``[d]`` the whole flat model (trainable parameters, frozen parameters, buffers).
        parameter: ``nn.Parameter`` viewing ``vector[:p]``, the trainable parameters only;
            give it to an optimizer (frozen parameters and buffers lie outside it, so weight
            decay or momentum never move them). Its ``.grad`` is :attr:`grad`.
        grad: ``[p]`` flat gradient buffer; every trainable parameter's ``.grad`` views into
            it (frozen ones keep ``.grad`` None).

    The module keeps its own ``Parameter`` (and buffer) objects: only their storage moves
    into :attr:`vector` (``tensor.data = view``). So an optimizer built on
    ``module.parameters()`` before wrapping still steps the same objects, in place, which
    now write into :attr:`vector`; its state (momentum, Adam's moments) and any
    learning-rate scheduler keep working, and such an optimizer never touches the buffers.

    Keep the views: clear gradients with :meth:`zero_grad` (``module.zero_grad()`` sets them
    to None; :meth:`zero_grad` re-attaches them; an optimizer over the module's own
    parameters works with either), and do not move or cast the module after wrapping it
    (:meth:`views_intact` says whether the module still aliases the buffer).
    """

    def __init__(self, module: nn.Module, *, buffers: bool = False) -> None:
        named = list(_named_tensors(module, buffers=buffers))
        if not any(isinstance(t, nn.Parameter) for _, t in named):
            raise ValueError("module has no parameters to flatten")
        first_name, first = named[0]
        for name, tensor in named:
            if tensor.dtype != first.dtype or tensor.device != first.device:
                raise ValueError(
                    f"all flattened tensors must share one dtype and device; {name!r} is "
                    f"{tensor.dtype} on {tensor.device}, {first_name!r} is {first.dtype} "
                    f"on {first.device}"
                )
        self.module = module
        self.layout = ParameterLayout.from_module(module, buffers=buffers)
        num_parameters = self.layout.num_parameter_elements
        with torch.no_grad():
            self.vector = torch.cat([t.detach().reshape(-1) for _, t in named])
        self.parameter = nn.Parameter(self.vector[:num_parameters])
        self.grad = torch.zeros_like(self.parameter)
        self.parameter.grad = self.grad
        self._tensors = [t for _, t in named]
        views = self.layout.unflatten(self.vector)
        for name, tensor in named:
            tensor.data = views[name]
        self._attach_grads()

    def _attach_grads(self) -> None:
        # Trainable parameters come first in the layout, so their offsets index into grad.
        for entry, tensor in zip(self.layout.entries, self._tensors):
            if entry.kind == "parameter":
                tensor.grad = self.grad[entry.offset : entry.offset + entry.numel].view(entry.shape)
        self.parameter.grad = self.grad

    @property
    def numel(self) -> int:
        """d, the length of :attr:`vector`."""
        return self.layout.numel

    def zero_grad(self) -> None:
        """Zero the flat gradient, re-attaching any parameter ``.grad`` that was set to None."""
        self.grad.zero_()
        if not self._grads_attached():
            self._attach_grads()

    def _grads_attached(self) -> bool:
        base = self.grad.data_ptr()
        size = self.grad.element_size()
        for entry, tensor in zip(self.layout.entries, self._tensors):
            if entry.kind != "parameter":
                continue
            if tensor.grad is None or tensor.grad.data_ptr() != base + entry.offset * size:
                return False
        return self.parameter.grad is self.grad

    def views_intact(self) -> bool:
        """True while every module tensor still aliases its slice of :attr:`vector`."""
        base = self.vector.data_ptr()
        size = self.vector.element_size()
        return all(
            tensor.data_ptr() == base + entry.offset * size
            for entry, tensor in zip(self.layout.entries, self._tensors)
        )

    def unflatten(self, vector: Tensor) -> dict[str, Tensor]:
        """``[*, d] -> {name: [*, *shape]}`` views, ready for ``torch.func.functional_call``."""
        return self.layout.unflatten(vector)

    def load_(self, vector: Tensor) -> None:
        """Overwrite the model with ``vector [d]`` in place (the module sees it at once)."""
        if vector.shape != self.vector.shape:
            raise ValueError(f"vector must have shape ({self.numel},), got {tuple(vector.shape)}")
        with torch.no_grad():
            self.vector.copy_(vector)
