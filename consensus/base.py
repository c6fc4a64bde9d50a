"""The ``Aggregator`` protocol and the base class every rule in this package derives from."""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from consensus._inputs import Neighbourhood, prepare


@runtime_checkable
class Aggregator(Protocol):
    """A gossip aggregation rule over the vector convention.

    ``own [*, d]``, ``neighbours [*, k, d]``, ``weights [*, k]`` (off-diagonal
    mixing weights W_ij; the self weight is 1 - sum), ``mask [*, k]`` (True =
    present) -> ``[*, d]``. Stateful rules keep batched state and forget it in
    ``reset()``.
    """

    def __call__(
        self, own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None = None
    ) -> Tensor: ...

    def reset(self) -> None: ...


def bound_error(rule: str, bound: str, **values: int) -> ValueError:
    """``krum needs n > 2f+2, got n=6, f=2`` -- the one message format for bounds."""
    got = ", ".join(f"{key}={value}" for key, value in values.items())
    return ValueError(f"{rule} needs {bound}, got {got}")


def check_int(rule: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{rule}: parameter {name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_float(
    rule: str, name: str, value: object, minimum: float, *, strict: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{rule}: parameter {name} must be a number, got {value!r}")
    value = float(value)
    if value != value or value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise ValueError(f"{rule}: parameter {name} must be {op} {minimum:g}, got {value!r}")
    return value


class Rule:
    """Base class: validates inputs once, masks non-finite neighbours, checks the bound.

    Subclasses implement ``_aggregate(hood) -> [B, d]`` on a cleaned
    :class:`~consensus._inputs.Neighbourhood` and, when they have a bound on
    the number of Byzantine inputs, ``check_size(n)``.

    A node with no neighbour declared present (``k = 0``, or every slot
    masked) gets its own vector back unchanged, in the per-node and the
    batched call alike, and its bound is not checked: there is nothing to
    aggregate. Stateful rules record that in their state (``_kept_own``).
    """

    name: ClassVar[str] = ""

    @property
    def stateful(self) -> bool:
        """Whether a call depends on earlier calls (then call it once on all nodes, not in chunks)."""
        return False

    def __init__(self, n: int | None = None) -> None:
        if n is not None:
            self.check_size(check_int(self.name, "n", n, 1))

    def __call__(
        self, own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        hood = prepare(own, neighbours, weights, mask)
        if hood.batch == 0:
            return own.clone()
        if bool(hood.alone.all()):
            self._kept_own(hood)
            return own.clone()
        self.check_size(hood.declared)
        out = self._aggregate(hood)
        if bool(hood.alone.any()):
            out = torch.where(hood.alone[:, None], hood.own, out)
            self._kept_own(hood)
        return out.reshape(own.shape)

    def check_size(self, n: int) -> None:
        """Raise ``ValueError`` if a neighbourhood of n vectors (own included) is too small."""

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        raise NotImplementedError

    def _kept_own(self, hood: Neighbourhood) -> None:
        """Record that the nodes ``hood.alone`` kept their own vector (stateless rules: nothing).

        Called after ``_aggregate`` when some nodes are alone, and instead of
        it when all are.
        """

    def reset(self) -> None:
        """Forget state kept between calls (stateless rules have none)."""

    def __repr__(self) -> str:
        params = ", ".join(
            f"{k}={v!r}"
            for k, v in vars(self).items()
            if not k.startswith("_") and not isinstance(v, Tensor | type(None))
        )
        return f"{type(self).__name__}({params})"
