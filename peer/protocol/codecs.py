"""Codecs: how a flat vector becomes an envelope's payload and back, over gossip's one table.

A peer implements no codec itself. Every codec of :mod:`gossip.compression` (``none``,
``fp16``, ``bf16``, ``qsgd``, ``topk``, ``randk``, with their parameters and ``feedback``)
is sent and received as exactly the compressor's msgpack-ready payload, which carries its
own ``codec`` field (it must equal the envelope's). ``none`` is gossip's
:class:`~gossip.compression.NoCompression`: the vector's raw little-endian bytes in its own
dtype, sent without a copy and decoded as a read-only view of the received bytes.

Which codec an algorithm may send is the configuration's to decide
(``gossip.GossipConfig``: sparsifiers only with CHOCO, whose messages are deltas); here
every codec can be built and every one is accepted.

Every ``decode`` validates against a :class:`~peer.protocol.wire.ModelSpec` (its ``numel`` is the
message's length: the model's, or push-sum's ``d + 1``): for ``none`` the dtype must be the
model's, and gossip checks the rest (field set, lengths, indices, levels, finiteness) and
reports a hostile payload as a :class:`gossip.PayloadError` whose ``kind``
:data:`PAYLOAD_ERRORS` maps to one typed protocol error (no message matching), so the
server answers 4xx before anything touches the model. The result is a ``[numel]`` tensor
in the spec's dtype; never write into it (it may share memory with the received bytes).

Error feedback is sender state: a codec built with ``feedback=true`` keeps one residual for
everything it encodes (:func:`build_codec`), right for a message broadcast to every neighbour.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from gossip import compression, secure_sum
from gossip.configuration import DENSE_COMPRESSORS
from peer.protocol.errors import (
    DTypeMismatch,
    MalformedBody,
    NonFiniteValues,
    ProtocolError,
    ShapeMismatch,
    UnknownCodec,
)
from peer.protocol.wire import ModelSpec

__all__ = [
    "DENSE_CODECS",
    "PAYLOAD_ERRORS",
    "Codec",
    "CompressorCodec",
    "DenseCodec",
    "MaskedCodec",
    "build_codec",
    "receiving_codecs",
]

DENSE_CODECS = DENSE_COMPRESSORS
"""Codecs that send every coordinate (``none``, ``fp16``, ``bf16``, ``qsgd``): the ones
that suit a message that is a model rather than a delta (``gossip.DENSE_COMPRESSORS``)."""


class Codec(Protocol):
    """Encodes a flat ``[d]`` vector into a msgpack-ready payload and decodes it, validated."""

    name: str

    def encode(self, vector: torch.Tensor) -> dict[str, Any]: ...

    def decode(self, payload: Mapping[str, Any], spec: ModelSpec) -> torch.Tensor: ...


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


def _typed(error: compression.PayloadError, spec: ModelSpec) -> ProtocolError:
    """gossip's :class:`~gossip.PayloadError` on a hostile payload, as a typed protocol error;
    where the error knows its coordinate, the message names the tensor it came from
    (:meth:`ModelSpec.locate`)."""
    where = "" if error.coordinate is None else f" at {spec.locate(error.coordinate)}"
    return PAYLOAD_ERRORS[error.kind](f"payload: {error}{where}")


def _build(spec: str) -> compression.Compressor:
    try:
        return compression.build_compressor(spec)
    except ValueError as error:
        raise ValueError(f"codec: {error}") from None


class CompressorCodec:
    """A gossip compressor as an envelope codec: any spec ``gossip.build_compressor`` takes.

    ``encode`` sends the compressor's payload, randomized codecs (qsgd, randk) drawing from a
    generator seeded with ``seed``. ``decode`` dispatches on the payload (qsgd's bits and
    block and the sparsifiers' k travel in it), so a receiver accepts any parameters of the
    codec the envelope names.

    >>> codec = CompressorCodec("qsgd:bits=4", seed=1)
    >>> payload = codec.encode(torch.ones(8))
    >>> codec.decode(payload, ModelSpec(numel=8))
    tensor([1., 1., 1., 1., 1., 1., 1., 1.])
    """

    def __init__(self, spec: str = "none", *, seed: int = 0) -> None:
        self.compressor = _build(spec)
        self.name = self.compressor.codec
        self.generator = torch.Generator().manual_seed(seed)

    def encode(self, vector: torch.Tensor) -> dict[str, Any]:
        """The compressor's payload for ``vector [d]`` (a ``none`` payload views its memory:
        pack it before writing into ``vector``)."""
        return dict(self.compressor.encode(vector, self.generator))

    def decode(self, payload: Mapping[str, Any], spec: ModelSpec) -> torch.Tensor:
        """The validated ``[spec.numel]`` vector in ``spec.dtype``; a typed
        :class:`~peer.protocol.errors.ProtocolError` for anything wrong."""
        if not isinstance(payload, Mapping):
            raise MalformedBody(f"payload must be a map, got {type(payload).__name__}")
        if "codec" not in payload:
            raise MalformedBody("payload: payload field 'codec' is missing")
        if payload["codec"] != self.name:
            raise UnknownCodec(f"payload.codec must equal the envelope's codec {self.name!r}")
        if self.compressor.lossless:
            _require_model_dtype(payload, spec)
        try:
            decoded = compression.decode(payload, spec.numel)
        except compression.PayloadError as error:
            raise _typed(error, spec) from None
        return decoded.to(spec.dtype)


def _require_model_dtype(payload: Mapping[str, Any], spec: ModelSpec) -> None:
    """A lossless payload must carry the local model's dtype (checked before its bytes)."""
    wire = payload.get("dtype")
    if isinstance(wire, str) and compression.WIRE_DTYPES.get(wire, spec.dtype) != spec.dtype:
        expected = compression.WIRE_DTYPE_NAMES[spec.dtype]
        raise DTypeMismatch(
            f"payload: payload field 'dtype' must be {expected!r} (the local model's), got {wire!r}"
        )


class DenseCodec(CompressorCodec):
    """``none``: the vector's raw little-endian bytes in the model's dtype, lossless.

    gossip's :class:`~gossip.compression.NoCompression` payload
    ``{"codec": "none", "dtype": "<f4", "data": <d * itemsize bytes>}``; about 20 bytes of
    payload and 50 of envelope on top of the tensor bytes. Sending views the vector's memory
    and decoding views the received bytes: no copy either way.
    """

    def __init__(self) -> None:
        super().__init__("none")


class MaskedCodec:
    """``masked``: a secure sum's masked message (``gossip.secure_sum``), ``spec.numel`` uint64
    in Z_{2^64}, decoded as an int64 tensor of their bits (a copy). The only codec a peer
    running secure sums accepts, and no other peer accepts it."""

    name = secure_sum.PAYLOAD_CODEC

    def encode(self, vector: torch.Tensor) -> dict[str, Any]:
        """The payload of a masked message given as int64 bits."""
        return secure_sum.masked_payload(vector.numpy())

    def decode(self, payload: Mapping[str, Any], spec: ModelSpec) -> torch.Tensor:
        """The validated ``[spec.numel]`` int64 tensor; a typed protocol error otherwise."""
        if not isinstance(payload, Mapping):
            raise MalformedBody(f"payload must be a map, got {type(payload).__name__}")
        if payload.get("codec") != self.name:
            raise UnknownCodec(f"payload.codec must equal the envelope's codec {self.name!r}")
        try:
            values = secure_sum.read_masked_payload(payload, spec.numel)
        except compression.PayloadError as error:
            raise _typed(error, spec) from None
        return torch.from_numpy(values.view("<i8"))


def build_codec(spec: str, *, seed: int = 0) -> Codec:
    """The codec for a spec string, e.g. ``none``, ``fp16``, ``qsgd:bits=4``, ``topk:ratio=0.1``.

    ``seed`` seeds the randomness of stochastic codecs (qsgd's rounding, randk's choice).
    Raises ``ValueError`` naming the allowed codecs and parameters for anything else. With
    ``feedback=true`` the codec keeps one residual for everything it sends: right for a
    message broadcast to every neighbour.
    """
    return CompressorCodec(spec, seed=seed)


def receiving_codecs() -> dict[str, Codec]:
    """A decoder for every codec a peer accepts, keyed by the envelope's codec name."""
    return {name: CompressorCodec(name) for name in compression.COMPRESSORS}
