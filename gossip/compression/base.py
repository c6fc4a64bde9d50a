"""The codec contract every compressor implements: one batched path, one wire path, one size.

A :class:`Compressor` maps a flat float vector ``x [d]`` to a payload and back to a decoded
vector ``C(x) [d]``. Subclasses define the payload's fields twice over the same tensors
(``_encode_fields`` / ``_decode_fields`` over a leading batch, ``_serialize`` / ``_parse``
between unbatched fields and the msgpack-ready map), and the base class builds both paths
from them, so for the same generator state row ``i`` of :meth:`Compressor.compress`
decodes to exactly what :meth:`Compressor.encode` sends for ``x[i]``, on any machine.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
import torch
from torch import Tensor

from gossip.compression.errors import PayloadError

__all__ = ["Compressed", "Compressor", "Payload"]

Payload = dict[str, str | int | bytes | memoryview]
"""A msgpack-ready payload: its ``codec`` and the codec's fields. Byte fields a sender builds
may be ``memoryview`` s of the encoded tensor (no copy); a receiver always holds ``bytes``."""


@dataclass(frozen=True)
class Compressed:
    """Result of the batched path: decoded ``values [*, d]`` and bytes per row on the wire."""

    values: Tensor
    wire_bytes: int


Randomness = torch.Generator | Sequence[torch.Generator] | None
"""Where a randomized codec draws: one generator for the whole batch, one per row (node i
of a batch draws from ``generators[i]`` exactly what that node, alone, draws from the same
generator), or None (torch's global one)."""


def node_seed(seed: int, node_id: str) -> int:
    """A 63-bit seed from (run seed, node id): the nodes of one run draw differently and
    reproducibly. A peer seeds its codec with ``node_seed(seed, peer_id)``; the simulator
    seeds node i's with ``node_seed(seed, "peer-i")``, so their draws are the same."""
    digest = hashlib.sha256(f"{seed}:{node_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def node_generators(seed: int, node_ids: Sequence[str]) -> list[torch.Generator]:
    """One CPU generator per node, seeded with :func:`node_seed`."""
    return [torch.Generator().manual_seed(node_seed(seed, node)) for node in node_ids]


def uniform(like: Tensor, generator: Randomness) -> Tensor:
    """U[0, 1) float32 noise shaped like ``like``, on its device, drawn from ``generator``
    where that generator lives (a seeded CPU generator gives the same draws for a CUDA
    tensor as for a CPU one); with one generator per row, row i from ``generator[i]``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        generators = list(generator)
        if like.dim() < 1 or len(generators) != like.shape[0]:
            raise ValueError(
                f"generator: one per row needs {like.shape[0] if like.dim() else 0} generators, "
                f"got {len(generators)}"
            )
        noise = torch.empty(like.shape, dtype=torch.float32, device=like.device)
        for row, g in zip(noise, generators):  # each row drawn straight into its place
            if g.device == like.device:
                torch.rand(row.shape, generator=g, out=row, device=row.device)
            else:
                row.copy_(torch.rand(row.shape, generator=g, device=g.device))
        return noise
    source = like.device if generator is None else generator.device
    noise = torch.rand(like.shape, generator=generator, dtype=torch.float32, device=source)
    return noise.to(like.device)


def _bin_header(length: int) -> int:
    """Bytes of msgpack's header for a ``bin`` of ``length`` bytes (bin 8, 16 or 32)."""
    return 2 if length < 1 << 8 else 3 if length < 1 << 16 else 5


def packed_size(payload: Mapping[str, Any]) -> int:
    """``len(msgpack.packb(payload))`` without packing its byte fields: the map packed
    with those fields empty, plus each one's length and the growth of its header."""
    sizes = {
        key: len(value) if isinstance(value, bytes) else value.nbytes
        for key, value in payload.items()
        if isinstance(value, bytes | memoryview)
    }
    skeleton = {key: b"" if key in sizes else value for key, value in payload.items()}
    extra = sum(size + _bin_header(size) - _bin_header(0) for size in sizes.values())
    return len(msgpack.packb(skeleton)) + extra


def check_input(x: Tensor, *, batched: bool) -> None:
    """``x`` must be a floating-point ``[*, d]`` (batched) or ``[d]`` (wire) tensor."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point tensor")
    if batched and x.dim() < 1:
        raise ValueError(f"x must have shape [*, d], got {tuple(x.shape)}")
    if not batched and x.dim() != 1:
        raise ValueError(f"x must have shape [d] on the wire path, got {tuple(x.shape)}")


class Compressor(ABC):
    """A codec for flat vectors (see :mod:`gossip.compression` for the two paths and the size).

    Subclasses define ``codec`` (the name on the wire), the payload's fields
    (``_encode_fields`` / ``_decode_fields`` over batched tensors) and their wire form
    (``_serialize`` / ``_parse``).
    """

    codec: ClassVar[str]
    lossless: ClassVar[bool] = False
    _fields: ClassVar[frozenset[str]]

    def __init__(self) -> None:
        self._wire_bytes: dict[tuple[int, torch.dtype], int] = {}

    @property
    @abstractmethod
    def spec(self) -> str:
        """The spec string that :func:`build_compressor` turns back into this compressor."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    # -- the two halves shared by both paths --------------------------------------------
    @abstractmethod
    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        """``x [*, d]`` -> field tensors with the same leading batch."""

    @abstractmethod
    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        """Field tensors ``[*, ...]`` -> decoded values ``[*, d]``."""

    @abstractmethod
    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        """Unbatched field tensors -> msgpack-ready payload (without the codec field)."""

    @abstractmethod
    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        """Validated payload -> unbatched field tensors; raises PayloadError on bad input."""

    # -- batched path ----------------------------------------------------------------
    def compress(self, x: Tensor, generator: Randomness = None) -> Compressed:
        """Batched path: ``x [*, d] -> Compressed(values [*, d] in x.dtype, wire_bytes per row)``."""
        check_input(x, batched=True)
        d = x.shape[-1]
        values = self._decode_fields(self._encode_fields(x, generator), d)
        return Compressed(values.to(x.dtype), self.wire_bytes(d, x.dtype))

    # -- wire path -------------------------------------------------------------------
    def encode(self, x: Tensor, generator: Randomness = None) -> Payload:
        """Wire path: ``x [d] -> payload`` (``str -> str | int | bytes``, raw little-endian).

        A byte field may view ``x``'s own memory (the ``none`` codec of a contiguous CPU
        tensor) or the codec's fresh output (qsgd's packed levels, a sparsifier's pairs):
        serialize the payload before writing into ``x``. Only the payload is computed, not
        what receivers will decode (:meth:`encode_and_decode` gives both).
        """
        check_input(x, batched=False)
        d = x.shape[0]
        payload: Payload = {"codec": self.codec}
        payload.update(self._serialize(self._encode_fields(x, generator), d))
        return payload

    def encode_and_decode(self, x: Tensor, generator: Randomness = None) -> tuple[Payload, Tensor]:
        """Wire path for a sender that also needs what receivers will decode (CHOCO's x̂)."""
        check_input(x, batched=False)
        d = x.shape[0]
        fields = self._encode_fields(x, generator)
        payload: Payload = {"codec": self.codec}
        payload.update(self._serialize(fields, d))
        return payload, self._decode_fields(fields, d)

    def decode(self, payload: Mapping[str, Any], d: int) -> Tensor:
        """Validate ``payload`` and decode it to ``[d]``.

        Raises :class:`PayloadError` (its ``kind`` says which check failed, its message names
        the field) for anything wrong with the payload, and a plain ``ValueError`` for a bad
        ``d`` (the caller's mistake, not the sender's). The ``none`` codec's result views the
        payload's bytes: read-only, clone it before writing into it.
        """
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError(f"d must be a positive int, got {d!r}")
        if not isinstance(payload, Mapping):
            raise PayloadError("field", f"payload must be a map, got {type(payload).__name__}")
        codec = payload.get("codec")
        if codec != self.codec:
            raise PayloadError(
                "codec",
                f"payload field 'codec' {codec!r:.40} does not match this codec {self.codec!r}",
                field="codec",
            )
        keys = set(payload)
        expected = self._fields | {"codec"}
        if keys != expected:
            raise PayloadError(
                "field",
                f"payload fields for codec {self.codec!r} must be exactly {sorted(expected)}, "
                f"got {sorted(str(key)[:40] for key in keys)[:16]}",
            )
        return self._decode_fields(self._parse(payload, d), d)

    def wire_bytes(self, d: int, dtype: torch.dtype = torch.float32) -> int:
        """Exact ``len(msgpack.packb(self.encode(x)))`` for any ``x`` of length ``d`` and
        ``dtype`` (only the ``none`` codec's size depends on the dtype).

        Computed without encoding: the payload of unfilled fields of the right sizes
        (:meth:`_empty_fields`, never written, so no memory is touched), packed with empty
        byte fields, plus each byte field's length and its msgpack ``bin`` header.
        """
        key = (d, dtype)
        if key not in self._wire_bytes:
            payload: Payload = {"codec": self.codec}
            payload.update(self._serialize(self._empty_fields(d, dtype), d))
            self._wire_bytes[key] = packed_size(payload)
        return self._wire_bytes[key]

    @abstractmethod
    def _empty_fields(self, d: int, dtype: torch.dtype) -> dict[str, Tensor]:
        """Unbatched field tensors of the sizes a length-``d`` ``dtype`` vector encodes to,
        unfilled (``torch.empty``): only their sizes are read."""

    def reset(self) -> None:  # noqa: B027 - stateless codecs have nothing to forget
        """Forget per-node state (only :class:`ErrorFeedback` has any)."""
