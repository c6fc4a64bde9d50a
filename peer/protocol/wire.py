"""The gossipnet wire format: a versioned msgpack envelope around one codec payload.

Every body a peer sends is one msgpack map (protocol version 2)::

    {"v": 2, "sender": "peer-a", "round": 12, "step": 480, "codec": "none",
     "payload": {"codec": "none", "dtype": "<f4", "data": <d*4 raw bytes>}}

The payload is exactly a ``gossip.compression`` codec's map, for every codec (``none``
included): one payload format per codec and one dtype vocabulary
(:data:`gossip.compression.WIRE_DTYPES`), shared with the simulator, which charges a message
:func:`gossip.compression.envelope_bytes`, the ``len`` of what :func:`pack_envelope` builds.
Nothing is ever pickled.

Envelopes are decoded strictly in both directions (a request a server reads, an answer a
client reads): :func:`check_envelope` checks the structure (exactly the six keys, all
strings), the protocol version (``v`` must be the int :data:`PROTOCOL_VERSION`: not ``2.0``,
not ``True``, not a list or a map), the codec name, the sender id (a bounded string) and
the round and step (ints in ``[0, 2**53)``, never a bool). Every violation raises a typed
:class:`~peer.protocol.errors.ProtocolError` and nothing else, whatever the decoded object holds: the
server answers it with a 4xx and a JSON body, the client counts the neighbour as failed. The
codec (:mod:`peer.protocol.codecs`) then validates the payload against the local model *before*
anything touches it.

Example::

    >>> import torch
    >>> from peer.protocol.codecs import DenseCodec
    >>> spec = ModelSpec(numel=3, dtype=torch.float32)
    >>> body = pack_envelope(Envelope(sender="a", round=0, codec="none",
    ...                               payload=DenseCodec().encode(torch.ones(3))))
    >>> env = unpack_envelope(body, max_bytes=max_body_bytes(spec.num_bytes), codecs={"none"})
    >>> DenseCodec().decode(env.payload, spec)
    tensor([1., 1., 1.])
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from gossip.compression import (
    ENVELOPE_KEYS,
    PROTOCOL_VERSION,
    WIRE_DTYPE_NAMES,
    envelope_fields,
)
from gossip.flat import ParameterLayout
from peer.protocol.errors import (
    BodyTooLarge,
    InvalidRound,
    InvalidSender,
    MalformedBody,
    UnknownCodec,
    UnsupportedVersion,
)
from peer.protocol.growing import GrowingBuffer
from peer.protocol.msgpack_stream import SPLICE_BYTES as SPLICE_BYTES
from peer.protocol.msgpack_stream import segments

# PROTOCOL_VERSION (imported above, gossip.compression's) is the version this peer writes in
# envelopes, JSON views and signatures; SUPPORTED_VERSIONS lists what it reads (version 1's
# signatures do not name the receiver, so a version-2 peer refuses version 1).
SUPPORTED_VERSIONS = frozenset({PROTOCOL_VERSION})

MAX_ROUND = 2**53
"""Rounds are integers in [0, 2**53): exact in every JSON/msgpack implementation."""

SENDER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
"""A peer id: 1 to 64 characters of [A-Za-z0-9._:-], starting with a letter or digit."""

HEADER_ROOM = 64 * 1024
"""Bytes allowed on top of the tensor bytes for the envelope, metadata and views."""


MAX_VIEW_ENTRIES = 4096
"""Most entries a received membership view may hold (a bigger swarm shares partial views)."""


@dataclass(frozen=True)
class ModelSpec:
    """What a peer's flat parameter buffer looks like: element count and dtype.

    The receiving side validates every payload against it (a message of another length,
    push-sum's ``d + 1`` say, is decoded against a spec of that length), and the body-size
    caps are derived from :attr:`num_bytes`. The dtype is one the wire carries
    (:data:`gossip.compression.WIRE_DTYPES`: float64, float32, float16, bfloat16).
    """

    numel: int
    dtype: torch.dtype = torch.float32
    layout: ParameterLayout | None = field(default=None, compare=False, repr=False)
    """Which tensor of the model each coordinate belongs to (``gossip.flat``), when the
    receiver knows its model: a refused payload then names the tensor at fault."""

    def __post_init__(self) -> None:
        if isinstance(self.numel, bool) or not isinstance(self.numel, int) or self.numel < 1:
            raise ValueError(f"ModelSpec.numel must be a positive int, got {self.numel!r}")
        if self.dtype not in WIRE_DTYPE_NAMES:
            allowed = [str(dtype).removeprefix("torch.") for dtype in WIRE_DTYPE_NAMES]
            raise ValueError(f"ModelSpec.dtype must be one of {allowed}, got {self.dtype}")

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def num_bytes(self) -> int:
        return self.numel * self.element_size

    @classmethod
    def of(cls, flat: torch.Tensor, layout: ParameterLayout | None = None) -> ModelSpec:
        """The spec of a flat parameter buffer (and its layout, to name tensors)."""
        return cls(numel=flat.numel(), dtype=flat.dtype, layout=layout)

    def locate(self, coordinate: int) -> str:
        """Coordinate ``coordinate`` in words: the tensor it belongs to when the spec has a
        :attr:`layout` (``"tensor 'mask' (a buffer), element 5"``), else the coordinate."""
        if self.layout is None:
            return f"coordinate {coordinate}"
        return self.layout.locate(coordinate)


def max_body_bytes(model_bytes: int, *, factor: float = 2.0) -> int:
    """Largest body a peer accepts: ``factor * model_bytes + HEADER_ROOM``.

    A dense exchange carries at most the model's bytes (``factor=1`` would do);
    the factor 2 leaves room for sparse codecs that send an index per value. The
    cap replaces aiohttp's 1 MiB default ``client_max_size``, which is too small
    for any real model, and keeps a hostile sender from making a peer buffer
    gigabytes.
    """
    if model_bytes < 0:
        raise ValueError(f"model_bytes must be >= 0, got {model_bytes}")
    if factor < 1.0:
        raise ValueError(f"factor must be >= 1.0, got {factor}")
    return math.ceil(factor * model_bytes) + HEADER_ROOM


@dataclass(frozen=True)
class Envelope:
    """One protocol message: who sends, at which round and step, in which codec, what.

    ``payload`` is a msgpack-ready map whose layout the codec defines: a
    ``gossip.compression`` payload, ``{"codec": "none", "dtype": "<f4", "data": ...}`` for
    the lossless codec.
    """

    sender: str
    round: int
    codec: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    step: int = 0
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        check_sender(self.sender)
        check_round(self.round, field_name="round")
        check_round(self.step, field_name="step")


def describe(value: object) -> str:
    """A short, bounded description of an untrusted value for an error message: a string's
    first 40 characters, a small int itself, otherwise the type (never the whole of a huge
    list, map or int)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 64 else f"an int of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def check_version(value: object, *, field_name: str = "v") -> int:
    """Return ``value`` if it is the int :data:`PROTOCOL_VERSION` (a version this peer
    reads), else raise :class:`UnsupportedVersion`: ``2.0``, ``True``, ``"2"``, a list or a
    map are not a version."""
    if type(value) is not int or value not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(
            f"{field_name} must be the int {' or '.join(map(str, sorted(SUPPORTED_VERSIONS)))} "
            f"(the protocol version this peer speaks), got {describe(value)}"
        )
    return value


def check_sender(sender: object, *, field_name: str = "sender") -> str:
    """Return ``sender`` if it is a valid peer id, else raise :class:`InvalidSender`."""
    if not isinstance(sender, str) or SENDER_ID_PATTERN.fullmatch(sender) is None:
        raise InvalidSender(
            f"{field_name} must match {SENDER_ID_PATTERN.pattern} (1-64 chars), "
            f"got {describe(sender)}"
        )
    return sender


def check_round(value: object, *, field_name: str = "round") -> int:
    """Return ``value`` if it is an int in [0, 2**53), else raise :class:`InvalidRound`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_ROUND:
        raise InvalidRound(f"{field_name} must be an integer in [0, 2**53), got {describe(value)}")
    return value


def _refuse_ext(code: int, data: bytes) -> object:
    raise MalformedBody(f"msgpack extension types are not part of the protocol (got ext {code})")


def unpack(body: bytes, *, max_bytes: int) -> Any:
    """Decode one msgpack object from ``body`` (at most ``max_bytes``), refusing extension types."""
    if len(body) > max_bytes:
        raise BodyTooLarge(f"body has {len(body)} bytes, the cap is {max_bytes}")
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            max_bin_len=max_bytes,
            max_str_len=1 << 20,
            max_array_len=1 << 20,
            max_map_len=1 << 16,
        )
    except MalformedBody:
        raise
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as error:
        raise MalformedBody(f"body is not a single msgpack object: {error}") from None


def envelope_object(envelope: Envelope) -> dict[str, Any]:
    """The msgpack map of an envelope, keys in ``gossip.compression.ENVELOPE_KEYS`` order
    (its tensor bytes stay views of the sender's memory)."""
    return envelope_fields(
        version=envelope.version,
        sender=envelope.sender,
        round=envelope.round,
        step=envelope.step,
        codec=envelope.codec,
        payload=dict(envelope.payload),
    )


def pack_envelope(envelope: Envelope) -> bytes:
    """The msgpack body of an envelope, joined (``msgpack.packb`` of :func:`envelope_object`,
    byte for byte, so ``len`` of it is :func:`gossip.compression.envelope_bytes`). The wire
    path does not join: :class:`peer.transport.body.EnvelopeBody` streams the same bytes. A payload
    still being written (:class:`peer.protocol.growing.GrowingBuffer`) cannot be packed here."""
    pieces = segments(envelope_object(envelope))
    if any(isinstance(piece, GrowingBuffer) for piece in pieces):
        raise ValueError("envelope: a payload still being written is streamed, not packed")
    return b"".join(piece for piece in pieces if not isinstance(piece, GrowingBuffer))


_ENVELOPE_KEYS = frozenset(ENVELOPE_KEYS)


def unpack_envelope(body: bytes, *, max_bytes: int, codecs: Collection[str]) -> Envelope:
    """Decode and validate an envelope's frame (not yet its tensors).

    Raises :class:`BodyTooLarge`, :class:`MalformedBody`, :class:`UnsupportedVersion`,
    :class:`UnknownCodec`, :class:`InvalidSender` or :class:`InvalidRound`.
    """
    return check_envelope(unpack(body, max_bytes=max_bytes), codecs=codecs)


def check_envelope(obj: object, *, codecs: Collection[str]) -> Envelope:
    """Validate a decoded msgpack object as an envelope frame (not yet its tensors).

    Raises only typed protocol errors, in this order: :class:`MalformedBody` (not a map, or
    not exactly the six string keys), :class:`UnsupportedVersion` (``v`` not the int
    :data:`PROTOCOL_VERSION`), :class:`UnknownCodec`, :class:`MalformedBody` (payload not a
    map), :class:`InvalidSender`, :class:`InvalidRound` (round, then step).
    """
    if not isinstance(obj, dict):
        raise MalformedBody(f"body must be a msgpack map, got {describe(obj)}")
    wrong = [key for key in obj if type(key) is not str or key not in _ENVELOPE_KEYS]
    if wrong or len(obj) != len(_ENVELOPE_KEYS):
        missing = [key for key in ENVELOPE_KEYS if key not in obj]
        raise MalformedBody(
            f"envelope keys must be {list(ENVELOPE_KEYS)}; missing {missing}, unexpected "
            f"{[describe(key) for key in wrong[:8]]}"
        )
    version = check_version(obj["v"])
    codec = obj["codec"]
    if type(codec) is not str or codec not in codecs:
        raise UnknownCodec(f"codec must be one of {sorted(codecs)}, got {describe(codec)}")
    payload = obj["payload"]
    if not isinstance(payload, dict):
        raise MalformedBody(f"payload must be a map, got {describe(payload)}")
    return Envelope(
        sender=check_sender(obj["sender"]),
        round=check_round(obj["round"], field_name="round"),
        step=check_round(obj["step"], field_name="step"),
        codec=codec,
        payload=payload,
        version=version,
    )
