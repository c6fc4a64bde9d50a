"""Codecs: how a flat model vector becomes an envelope's payload and back.

``none`` is the wire format's own lossless dense encoding: the vector's raw
bytes in the model's dtype (:func:`peer.wire.encode_tensor`), decoded as a view
of the received bytes without a copy. The lossy dense codecs ``fp16``, ``bf16``
and ``qsgd`` are gossip's compressors (:mod:`gossip.compression`), wrapped by
:class:`CompressorCodec`; the peer never implements one itself. Their payload
is exactly the compressor's msgpack-ready map (it carries its own ``codec``
field, which must equal the envelope's).

A peer sends its *parameters* (not a delta), so only dense codecs are offered:
a sparsifier (``topk``, ``randk``) applied to parameters would zero most of the
model; it needs CHOCO-style per-neighbour estimates (a later protocol version).

Every ``decode`` validates against the local :class:`~peer.wire.ModelSpec`
(dtype, element count, finiteness) and returns a ``[d]`` tensor in the model's
dtype; never write into it (it may share memory with the received bytes).
gossip reports what is wrong with a compressor payload as a
:class:`gossip.PayloadError` whose ``kind`` :data:`PAYLOAD_ERRORS` maps to one
typed protocol error (no message matching).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from gossip import compression
from peer.errors import (
    DTypeMismatch,
    MalformedBody,
    NonFiniteValues,
    ProtocolError,
    ShapeMismatch,
    UnknownCodec,
)
from peer.wire import ModelSpec, decode_tensor, encode_tensor

DENSE_CODECS = ("none", "fp16", "bf16", "qsgd")
"""Codec names a peer sends and accepts (dense: parameters, not deltas)."""


class Codec(Protocol):
    """Encodes a flat ``[d]`` vector into a msgpack-ready payload and decodes it, validated."""

    name: str

    def encode(self, vector: torch.Tensor) -> dict[str, Any]: ...

    def decode(self, payload: Mapping[str, Any], spec: ModelSpec) -> torch.Tensor: ...


class DenseCodec:
    """``none``: the vector's raw little-endian bytes in the model's dtype, lossless.

    Wire size: ``d * itemsize`` bytes plus about 100 bytes of envelope. Decoding
    views the received bytes (``torch.frombuffer``), no copy.
    """

    name = "none"

    def encode(self, vector: torch.Tensor) -> dict[str, Any]:
        return {"tensor": encode_tensor(vector)}

    def decode(self, payload: Mapping[str, Any], spec: ModelSpec) -> torch.Tensor:
        if set(payload) != {"tensor"}:
            raise MalformedBody("payload of codec 'none' must be a map with the one key 'tensor'")
        return decode_tensor(
            payload["tensor"], field="payload.tensor", shape=(spec.numel,), dtype=spec.dtype
        )


PAYLOAD_ERRORS: dict[compression.PayloadErrorKind, type[ProtocolError]] = {
    "codec": UnknownCodec,
    "field": MalformedBody,
    "parameter": MalformedBody,
    "dtype": DTypeMismatch,
    "length": ShapeMismatch,
    "index": MalformedBody,
    "value": MalformedBody,
    "non_finite": NonFiniteValues,
}
"""The typed protocol error (and so the HTTP status) for each :data:`gossip.PAYLOAD_ERROR_KINDS`."""


def _typed(error: compression.PayloadError) -> ProtocolError:
    """gossip's :class:`~gossip.PayloadError` on a hostile payload, as a typed protocol error."""
    return PAYLOAD_ERRORS[error.kind](f"payload: {error}")


class CompressorCodec:
    """A gossip compressor (``fp16``, ``bf16``, ``qsgd:bits=8``) as an envelope codec.

    Decoding dispatches on the payload (qsgd's bits and block travel in it), so a
    receiver accepts any parameters of the codec the envelope names.
    """

    def __init__(self, spec: str, *, seed: int = 0) -> None:
        self.compressor = compression.build_compressor(spec)
        self.name = self.compressor.codec
        self.generator = torch.Generator().manual_seed(seed)

    def encode(self, vector: torch.Tensor) -> dict[str, Any]:
        """The compressor's payload; randomized codecs (qsgd) draw from the seeded generator."""
        return dict(self.compressor.encode(vector, self.generator))

    def decode(self, payload: Mapping[str, Any], spec: ModelSpec) -> torch.Tensor:
        if payload.get("codec") != self.name:
            raise UnknownCodec(f"payload.codec must equal the envelope's codec {self.name!r}")
        try:
            decoded = compression.decode(payload, spec.numel)
        except compression.PayloadError as error:
            raise _typed(error) from None
        return decoded.to(spec.dtype)


def build_codec(spec: str, *, seed: int = 0) -> Codec:
    """The codec for a spec string: ``none``, ``fp16``, ``bf16`` or ``qsgd[:bits=B,block=K]``.

    ``seed`` seeds the randomness of stochastic codecs (qsgd's rounding). Raises
    ``ValueError`` naming the allowed codecs for anything else.
    """
    name = spec.partition(":")[0].strip() if isinstance(spec, str) else spec
    if name not in DENSE_CODECS:
        raise ValueError(f"codec must be one of {list(DENSE_CODECS)}, got {spec!r}")
    return DenseCodec() if name == "none" else CompressorCodec(spec, seed=seed)


def receiving_codecs() -> dict[str, Codec]:
    """A decoder for every codec a peer accepts, keyed by the envelope's codec name."""
    return {name: build_codec(name) for name in DENSE_CODECS}
