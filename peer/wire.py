"""The gossipnet wire format: a versioned msgpack envelope carrying raw tensor bytes.

Every body a peer sends is one msgpack map (protocol version 1)::

    {"v": 1, "sender": "peer-a", "round": 12, "step": 480, "codec": "none",
     "payload": {"tensor": {"dtype": "float32", "shape": [d], "data": <d*4 raw bytes>}}}

Tensors travel as their raw little-endian bytes plus dtype and shape; nothing is
ever pickled. On receipt, :func:`unpack_envelope` checks the structure, the
protocol version, the codec name, the sender id and the round number, and
:func:`decode_tensor` views the received bytes with :func:`torch.frombuffer`
(no copy beyond the one msgpack makes when it hands back ``bytes``), then checks
dtype, shape and finiteness against the local model *before* anything touches it.
Each violation raises a typed :class:`~peer.errors.ProtocolError` that the server
answers with a 4xx and a JSON body.

Example::

    >>> import torch
    >>> spec = ModelSpec(numel=3, dtype=torch.float32)
    >>> body = pack_envelope(Envelope(sender="a", round=0, codec="none",
    ...                               payload={"tensor": encode_tensor(torch.ones(3))}))
    >>> env = unpack_envelope(body, max_bytes=max_body_bytes(spec.num_bytes), codecs={"none"})
    >>> decode_tensor(env.payload["tensor"], field="payload.tensor", shape=(3,), dtype=spec.dtype)
    tensor([1., 1., 1.])
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from peer.errors import (
    BodyTooLarge,
    DTypeMismatch,
    InvalidRound,
    InvalidSender,
    MalformedBody,
    NonFiniteValues,
    ShapeMismatch,
    UnknownCodec,
    UnsupportedVersion,
)

PROTOCOL_VERSION = 1
"""The envelope version this peer writes; :data:`SUPPORTED_VERSIONS` lists what it reads."""
SUPPORTED_VERSIONS = frozenset({PROTOCOL_VERSION})

MAX_ROUND = 2**53
"""Rounds are integers in [0, 2**53): exact in every JSON/msgpack implementation."""

SENDER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
"""A peer id: 1 to 64 characters of [A-Za-z0-9._:-], starting with a letter or digit."""

HEADER_ROOM = 64 * 1024
"""Bytes allowed on top of the tensor bytes for the envelope, metadata and views."""

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
"""Wire dtype names (always little-endian) and the torch dtype each decodes to."""
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

_MAX_DIMS = 8


@dataclass(frozen=True)
class ModelSpec:
    """What a peer's flat parameter buffer looks like: element count and dtype.

    The receiving side validates every tensor against it, and the body-size caps
    are derived from :attr:`num_bytes`.
    """

    numel: int
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if isinstance(self.numel, bool) or not isinstance(self.numel, int) or self.numel < 1:
            raise ValueError(f"ModelSpec.numel must be a positive int, got {self.numel!r}")
        if self.dtype not in DTYPE_NAMES or not self.dtype.is_floating_point:
            allowed = [k for k, v in DTYPES.items() if v.is_floating_point]
            raise ValueError(f"ModelSpec.dtype must be one of {allowed}, got {self.dtype}")

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def num_bytes(self) -> int:
        return self.numel * self.element_size

    @classmethod
    def of(cls, flat: torch.Tensor) -> ModelSpec:
        """The spec of a flat parameter buffer."""
        return cls(numel=flat.numel(), dtype=flat.dtype)


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

    ``payload`` is a msgpack-ready map whose layout the codec defines; for the
    dense codec it is ``{"tensor": encode_tensor(flat)}``.
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


def check_sender(sender: object) -> str:
    """Return ``sender`` if it is a valid peer id, else raise :class:`InvalidSender`."""
    if not isinstance(sender, str) or SENDER_ID_PATTERN.fullmatch(sender) is None:
        raise InvalidSender(
            f"sender must match {SENDER_ID_PATTERN.pattern} (1-64 chars), got {sender!r:.80}"
        )
    return sender


def check_round(value: object, *, field_name: str = "round") -> int:
    """Return ``value`` if it is an int in [0, 2**53), else raise :class:`InvalidRound`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_ROUND:
        raise InvalidRound(f"{field_name} must be an integer in [0, 2**53), got {value!r:.40}")
    return value


def _swap_byte_order(t: torch.Tensor) -> torch.Tensor:
    """Reverse the bytes of every element (little <-> big endian), vectorized."""
    size = t.element_size()
    if size == 1:
        return t
    raw = t.contiguous().reshape(-1).view(torch.uint8).reshape(-1, size).flip(1)
    return raw.contiguous().view(t.dtype).reshape(t.shape)


def encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    """A tensor as ``{"dtype", "shape", "data"}`` with ``data`` its raw little-endian bytes.

    On a little-endian host ``data`` is a memoryview of the (contiguous, CPU)
    tensor's own storage, so msgpack copies the bytes exactly once, into the body.
    """
    if t.dtype not in DTYPE_NAMES:
        raise DTypeMismatch(f"cannot encode dtype {t.dtype}; wire dtypes are {sorted(DTYPES)}")
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if sys.byteorder != "little":
        flat = _swap_byte_order(flat)
    data: memoryview | bytes = flat.view(torch.uint8).numpy().data if flat.numel() else b""
    return {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data": data}


def decode_tensor(
    obj: object,
    *,
    field: str,
    shape: tuple[int, ...] | None = None,
    dtype: torch.dtype | Collection[torch.dtype] | None = None,
    finite: bool = True,
) -> torch.Tensor:
    """View an encoded tensor's bytes as a read-only tensor, after checking everything.

    Checks, in order: the map's keys, ``dtype`` is a wire dtype (and the expected
    one, if given), ``shape`` is a list of at most 8 non-negative ints (and the
    expected one, if given), the byte count is ``prod(shape) * itemsize``, and,
    with ``finite``, that no float value is NaN or infinite. ``field`` names the
    tensor in error messages. The result shares memory with the received bytes:
    never write into it.
    """
    if not isinstance(obj, dict) or set(obj) != {"dtype", "shape", "data"}:
        raise MalformedBody(f"{field} must be a map with keys dtype, shape, data")
    name, got_shape, data = obj["dtype"], obj["shape"], obj["data"]
    if not isinstance(name, str) or name not in DTYPES:
        raise DTypeMismatch(f"{field}.dtype must be one of {sorted(DTYPES)}, got {name!r:.40}")
    got_dtype = DTYPES[name]
    if dtype is not None:
        allowed = {dtype} if isinstance(dtype, torch.dtype) else set(dtype)
        if got_dtype not in allowed:
            names = sorted(DTYPE_NAMES[d] for d in allowed)
            raise DTypeMismatch(f"{field}.dtype must be {' or '.join(names)}, got {name}")
    if (
        not isinstance(got_shape, list)
        or len(got_shape) > _MAX_DIMS
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in got_shape)
    ):
        raise ShapeMismatch(f"{field}.shape must be a list of at most 8 non-negative ints")
    if shape is not None and tuple(got_shape) != tuple(shape):
        raise ShapeMismatch(f"{field}.shape must be {list(shape)}, got {got_shape}")
    if not isinstance(data, bytes):
        raise MalformedBody(f"{field}.data must be msgpack bin (raw bytes)")
    numel = math.prod(got_shape)
    itemsize = torch.empty((), dtype=got_dtype).element_size()
    if len(data) != numel * itemsize:
        raise ShapeMismatch(
            f"{field}.data has {len(data)} bytes, shape {got_shape} of {name} needs {numel * itemsize}"
        )
    if numel == 0:
        return torch.empty(got_shape, dtype=got_dtype)
    with warnings.catch_warnings():
        # The bytes are immutable; the tensor is read-only by contract (never written).
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.frombuffer(data, dtype=got_dtype).reshape(got_shape)
    if sys.byteorder != "little":
        tensor = _swap_byte_order(tensor)
    if finite and got_dtype.is_floating_point and not all_finite(tensor):
        raise NonFiniteValues(f"{field} carries NaN or infinite values")
    return tensor


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN and no infinity, in one reduction pass without a [d] bool temporary.

    NaN propagates through min/max, and an infinity is the min or the max.
    """
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor.reshape(-1))
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _refuse_ext(code: int, data: bytes) -> object:
    raise MalformedBody(f"msgpack extension types are not part of the protocol (got ext {code})")


def pack(obj: object) -> bytes:
    """msgpack-encode a protocol map (bin for bytes, str for text, no extension types)."""
    return msgpack.packb(obj, use_bin_type=True)


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


SPLICE_BYTES = 1 << 16
"""A trailing buffer at least this large is spliced into the body instead of packed."""


def _bin_header(length: int) -> bytes:
    if length < 1 << 8:
        return b"\xc4" + length.to_bytes(1, "big")
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def _detach_tail(obj: dict[str, Any]) -> tuple[dict[str, Any], memoryview | bytes | None]:
    """Copy the chain of last map values down to a trailing large buffer, replacing it by b""."""
    if not obj:
        return obj, None
    key = next(reversed(obj))
    value = obj[key]
    if isinstance(value, dict):
        inner, tail = _detach_tail(value)
        return ({**obj, key: inner}, tail) if tail is not None else (obj, None)
    if isinstance(value, memoryview | bytes | bytearray) and len(value) >= SPLICE_BYTES:
        return {**obj, key: b""}, value if isinstance(value, memoryview | bytes) else bytes(value)
    return obj, None


def pack_envelope(envelope: Envelope) -> bytes:
    """The msgpack body of an envelope.

    The big tensor bytes are the body's last item (``data`` is the last key of the
    last map), so they are spliced in with one ``bytes.join`` copy rather than
    grown into msgpack's buffer: the same bytes as ``msgpack.packb`` up to the
    width of that one bin header.
    """
    obj, tail = _detach_tail(
        {
            "v": envelope.version,
            "sender": envelope.sender,
            "round": envelope.round,
            "step": envelope.step,
            "codec": envelope.codec,
            "payload": dict(envelope.payload),
        }
    )
    head = pack(obj)
    if tail is None:
        return head
    if not head.endswith(b"\xc4\x00"):  # the empty bin standing in for the tail
        raise RuntimeError("envelope tail splice: packed head does not end in an empty bin")
    tail_bytes = tail.nbytes if isinstance(tail, memoryview) else len(tail)
    return b"".join((head[:-2], _bin_header(tail_bytes), tail))


_ENVELOPE_KEYS = frozenset({"v", "sender", "round", "step", "codec", "payload"})


def unpack_envelope(body: bytes, *, max_bytes: int, codecs: Collection[str]) -> Envelope:
    """Decode and validate an envelope's frame (not yet its tensors).

    Raises :class:`BodyTooLarge`, :class:`MalformedBody`, :class:`UnsupportedVersion`,
    :class:`UnknownCodec`, :class:`InvalidSender` or :class:`InvalidRound`.
    """
    obj = unpack(body, max_bytes=max_bytes)
    if not isinstance(obj, dict):
        raise MalformedBody(f"body must be a msgpack map, got {type(obj).__name__}")
    missing = sorted(_ENVELOPE_KEYS - set(obj))
    extra = sorted(set(obj) - _ENVELOPE_KEYS)
    if missing or extra:
        raise MalformedBody(
            f"envelope keys must be {sorted(_ENVELOPE_KEYS)}; missing {missing}, unexpected {extra}"
        )
    version = obj["v"]
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise UnsupportedVersion(
            f"v must be one of {sorted(SUPPORTED_VERSIONS)}, got {version!r:.40}"
        )
    codec = obj["codec"]
    if not isinstance(codec, str) or codec not in codecs:
        raise UnknownCodec(f"codec must be one of {sorted(codecs)}, got {codec!r:.40}")
    if not isinstance(obj["payload"], dict):
        raise MalformedBody("payload must be a map")
    return Envelope(
        sender=check_sender(obj["sender"]),
        round=check_round(obj["round"], field_name="round"),
        step=check_round(obj["step"], field_name="step"),
        codec=codec,
        payload=obj["payload"],
        version=version,
    )
