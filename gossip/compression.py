"""Compressors for model deltas: one codec, two paths (batched for the simulator, wire for peers).

Every compressor ``C`` maps a flat float vector ``x [d]`` to a payload and back to a decoded
vector ``C(x) [d]``. It offers

* a **batched path** for the simulator: :meth:`Compressor.compress` ``x [*, d] -> Compressed``
  with ``values [*, d]`` (what every receiver decodes) and ``wire_bytes`` (the exact byte count
  of each row's payload), randomness drawn from an explicit ``torch.Generator``;
* a **wire path** for the peer: :meth:`Compressor.encode` ``x [d] -> payload`` (a dict of
  ``str -> str | int | bytes``, ready for ``msgpack.packb``; tensors travel as raw
  little-endian bytes with explicit dtypes) and :meth:`Compressor.decode`
  ``(payload, d) -> Tensor [d]``, which validates everything (known codec, exact field set,
  types, lengths, index ranges, levels, finite values) and raises :class:`PayloadError` (a
  ``ValueError`` whose ``kind`` says which check failed, see :data:`PAYLOAD_ERROR_KINDS`)
  naming the field on hostile input. :func:`decode` dispatches on the payload's ``codec``
  field. Dense fields are viewed in place where the wire dtype is the host's (no copy of the
  received bytes: the ``none`` codec's result shares memory with the payload, treat it as
  read-only).

Both paths run the same two halves (``_encode_fields`` to integer/float field tensors,
``_decode_fields`` back to values), so for the same generator state row ``i`` of the batched
path decodes to exactly what the wire path decodes for ``x[i]``, on any machine.

**Bytes on the wire** means ``len(msgpack.packb(payload))``: the msgpack encoding of the
payload map, field names and codec name included, and nothing else (no HTTP headers,
signature or the envelope the peer wraps around it). For a given codec and parameters it
depends only on d, so :meth:`Compressor.wire_bytes` returns one integer per row.

Codecs (spec strings for :func:`build_compressor`; ``COMPRESSORS`` lists them):

==========  ===========================================================  =========
spec        decoded value                                                 bias
==========  ===========================================================  =========
none        x (dtype preserved)                                           lossless
fp16        round-to-nearest float16                                      biased
bf16        round-to-nearest bfloat16                                     biased
qsgd        s * q / L, q = floor(L x / s + u), u ~ U[0,1) (Alistarh 2017)  unbiased
topk        the k = ceil(ratio d) largest-magnitude coordinates           biased
randk       k coordinates chosen uniformly at random (unscaled)           biased
==========  ===========================================================  =========

Any lossy codec takes ``feedback=true`` to add error feedback (Seide et al. 2014; Stich et
al. 2018, "Sparsified SGD with memory"): ``C(x + e)`` is sent and ``e <- x + e - C(x + e)``
is kept by the sender, see :class:`ErrorFeedback`.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import msgpack
import numpy as np
import torch
from torch import Tensor

from consensus import all_finite

__all__ = [
    "COMPRESSORS",
    "PAYLOAD_ERROR_KINDS",
    "BFloat16",
    "Compressed",
    "Compressor",
    "CompressorInfo",
    "ErrorFeedback",
    "Float16",
    "NoCompression",
    "Payload",
    "PayloadError",
    "PayloadErrorKind",
    "RandomK",
    "StochasticQuantization",
    "TopK",
    "build_compressor",
    "decode",
    "describe_compressors",
]

Payload = dict[str, str | int | bytes]

# Explicit little-endian wire dtypes: name on the wire -> (numpy dtype, torch dtype).
_WIRE_DTYPES: dict[str, tuple[np.dtype[Any], torch.dtype]] = {
    "<f8": (np.dtype("<f8"), torch.float64),
    "<f4": (np.dtype("<f4"), torch.float32),
    "<f2": (np.dtype("<f2"), torch.float16),
    "bf16": (np.dtype("<i2"), torch.bfloat16),  # raw bfloat16 bits as little-endian int16
}
_TORCH_TO_WIRE = {torch_dtype: name for name, (_, torch_dtype) in _WIRE_DTYPES.items()}


PayloadErrorKind = Literal[
    "codec", "field", "parameter", "dtype", "length", "index", "value", "non_finite"
]
PAYLOAD_ERROR_KINDS: tuple[PayloadErrorKind, ...] = get_args(PayloadErrorKind)
"""Every :attr:`PayloadError.kind`, in the order decode checks them:

``codec``: unknown codec, or not this decoder's; ``field``: not a map, a field missing or
extra, or of the wrong msgpack type; ``parameter``: a codec parameter carried in the payload
(qsgd ``bits``/``block``, sparse ``k``) out of range or not this decoder's; ``dtype``: the
``dtype`` field is not the one the codec sends; ``length``: a byte field's length does not
match d and the parameters; ``index``: sparse indices outside [0, d) or not strictly
increasing; ``value``: values outside their range (a negative qsgd scale, a level past 2L);
``non_finite``: NaN or infinity in a float field."""


class PayloadError(ValueError):
    """A payload refused by :meth:`Compressor.decode`: ``kind`` says which check failed.

    ``kind`` is one of :data:`PAYLOAD_ERROR_KINDS` and ``field`` the payload field at fault
    (``None`` when the payload as a whole is). A ``ValueError``, so callers that only need
    "bad input" catch that; a receiver maps ``kind`` to its own typed errors (the peer to
    HTTP statuses) without parsing messages::

        >>> try:
        ...     decode({"codec": "fp16", "dtype": "<f2", "data": b"\\x00"}, 4)
        ... except PayloadError as error:
        ...     print(error.kind, error.field)
        length data
    """

    def __init__(self, kind: PayloadErrorKind, message: str, *, field: str | None = None) -> None:
        if kind not in PAYLOAD_ERROR_KINDS:
            raise ValueError(f"kind must be one of {PAYLOAD_ERROR_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind: PayloadErrorKind = kind
        self.field = field


@dataclass(frozen=True)
class Compressed:
    """Result of the batched path: decoded ``values [*, d]`` and bytes per row on the wire."""

    values: Tensor
    wire_bytes: int


# ----------------------------------------------------------------------------- helpers


def _uniform(like: Tensor, generator: torch.Generator | None) -> Tensor:
    """U[0, 1) float32 noise shaped like ``like``, on its device, drawn from ``generator``
    where that generator lives (a seeded CPU generator gives the same draws for a CUDA
    tensor as for a CPU one)."""
    source = like.device if generator is None else generator.device
    noise = torch.rand(like.shape, generator=generator, dtype=torch.float32, device=source)
    return noise.to(like.device)


def _to_bytes(t: Tensor, wire_dtype: str) -> bytes:
    np_dtype, torch_dtype = _WIRE_DTYPES[wire_dtype]
    t = t.detach().to("cpu", torch_dtype).contiguous()
    if torch_dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().astype(np_dtype, copy=False).tobytes()


def _view_bytes(data: bytes, dtype: np.dtype[Any]) -> Tensor:
    """``data`` as a 1-D tensor of ``dtype`` values, sharing its memory when ``dtype`` is native.

    ``dtype`` carries an explicit byte order (the wire's little-endian): on a little-endian
    host it is native and the tensor views the bytes (read-only, never write into it); on a
    big-endian host the values are byte-swapped once into a new native array.
    """
    array = np.frombuffer(data, dtype=dtype)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    with warnings.catch_warnings():
        # received bytes are immutable; decoded views are read-only by contract
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _from_bytes(data: bytes, wire_dtype: str, count: int, field: str) -> Tensor:
    np_dtype, torch_dtype = _WIRE_DTYPES[wire_dtype]
    expected = count * np_dtype.itemsize
    if len(data) != expected:
        raise PayloadError(
            "length",
            f"payload field {field!r} must hold {count} values of {wire_dtype} = {expected} "
            f"bytes, got {len(data)} bytes",
            field=field,
        )
    t = _view_bytes(data, np_dtype)
    return t.view(torch.bfloat16) if torch_dtype == torch.bfloat16 else t


def _field(payload: Mapping[str, Any], name: str, kind: type) -> Any:
    if name not in payload:
        raise PayloadError("field", f"payload field {name!r} is missing", field=name)
    value = payload[name]
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PayloadError(
                "field",
                f"payload field {name!r} must be an int, got {type(value).__name__}",
                field=name,
            )
    elif not isinstance(value, kind):
        raise PayloadError(
            "field",
            f"payload field {name!r} must be {kind.__name__}, got {type(value).__name__}",
            field=name,
        )
    return value


def _require_finite(t: Tensor, field: str) -> None:
    """One sum over ``t`` (exact elementwise check only if that sum is not finite)."""
    if not all_finite(t):
        raise PayloadError(
            "non_finite", f"payload field {field!r} contains NaN or infinite values", field=field
        )


def _check_input(x: Tensor, *, batched: bool) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point tensor")
    if batched and x.dim() < 1:
        raise ValueError(f"x must have shape [*, d], got {tuple(x.shape)}")
    if not batched and x.dim() != 1:
        raise ValueError(f"x must have shape [d] on the wire path, got {tuple(x.shape)}")


# ----------------------------------------------------------------------------- base


class Compressor(ABC):
    """A codec for flat vectors; see the module docstring for the two paths and the byte count.

    Subclasses define ``codec`` (the name on the wire), the payload's fields
    (``_encode_fields`` / ``_decode_fields`` over batched tensors) and their wire form
    (``_serialize`` / ``_parse``).
    """

    codec: ClassVar[str]
    lossless: ClassVar[bool] = False

    def __init__(self) -> None:
        self._wire_bytes: dict[int, int] = {}

    @property
    @abstractmethod
    def spec(self) -> str:
        """The spec string that :func:`build_compressor` turns back into this compressor."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    # -- the two halves shared by both paths --------------------------------------------
    @abstractmethod
    def _encode_fields(self, x: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        """``x [*, d]`` -> field tensors with the same leading batch."""

    @abstractmethod
    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        """Field tensors ``[*, ...]`` -> decoded values ``[*, d]``."""

    @abstractmethod
    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        """Unbatched field tensors -> msgpack-ready payload (without the codec field)."""

    @abstractmethod
    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        """Validated payload -> unbatched field tensors; raises ValueError on bad input."""

    _fields: ClassVar[frozenset[str]]

    # -- batched path ----------------------------------------------------------------
    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Compressed:
        """Batched path: ``x [*, d] -> Compressed(values [*, d] in x.dtype, wire_bytes per row)``."""
        _check_input(x, batched=True)
        d = x.shape[-1]
        values = self._decode_fields(self._encode_fields(x, generator), d)
        return Compressed(values.to(x.dtype), self.wire_bytes(d))

    # -- wire path -------------------------------------------------------------------
    def encode(self, x: Tensor, generator: torch.Generator | None = None) -> Payload:
        """Wire path: ``x [d] -> payload`` (``str -> str | int | bytes``, raw little-endian)."""
        return self.encode_and_decode(x, generator)[0]

    def encode_and_decode(
        self, x: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Payload, Tensor]:
        """Wire path for a sender that also needs what receivers will decode (CHOCO's x̂)."""
        _check_input(x, batched=False)
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

    def wire_bytes(self, d: int) -> int:
        """Exact ``len(msgpack.packb(self.encode(x)))`` for any ``x`` of length ``d``."""
        if d not in self._wire_bytes:
            probe = torch.zeros(d, device="cpu")  # a size probe, once per d, on the CPU
            fields = self._encode_fields(probe, torch.Generator().manual_seed(0))
            payload: Payload = {"codec": self.codec}
            payload.update(self._serialize(fields, d))
            self._wire_bytes[d] = len(msgpack.packb(payload))
        return self._wire_bytes[d]

    def reset(self) -> None:  # noqa: B027 - stateless codecs have nothing to forget
        """Forget per-node state (only :class:`ErrorFeedback` has any)."""


# ----------------------------------------------------------------------------- codecs


class NoCompression(Compressor):
    """Send x as is, in its own dtype (float64/32/16 or bfloat16): ``C(x) = x``."""

    codec = "none"
    lossless = True
    _fields = frozenset({"dtype", "data"})

    @property
    def spec(self) -> str:
        return "none"

    def _encode_fields(self, x: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        if x.dtype not in _TORCH_TO_WIRE:
            raise ValueError(f"x dtype {x.dtype} is not one of {list(_TORCH_TO_WIRE)}")
        return {"data": x}

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return fields["data"]

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        wire = _TORCH_TO_WIRE[fields["data"].dtype]
        return {"dtype": wire, "data": _to_bytes(fields["data"], wire)}

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        wire = _field(payload, "dtype", str)
        if wire not in _WIRE_DTYPES:
            raise PayloadError(
                "dtype",
                f"payload field 'dtype' must be one of {list(_WIRE_DTYPES)}, got {wire!r:.40}",
                field="dtype",
            )
        data = _from_bytes(_field(payload, "data", bytes), wire, d, "data")
        _require_finite(data, "data")
        return {"data": data}


class _Cast(Compressor):
    """Round to a 16-bit float format: ``C(x) = float32(round(x))``."""

    wire_dtype: ClassVar[str]
    dtype: ClassVar[torch.dtype]
    _fields = frozenset({"dtype", "data"})

    @property
    def spec(self) -> str:
        return self.codec

    def _encode_fields(self, x: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        return {"data": x.to(self.dtype)}

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return fields["data"].to(torch.float32)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {"dtype": self.wire_dtype, "data": _to_bytes(fields["data"], self.wire_dtype)}

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        wire = _field(payload, "dtype", str)
        if wire != self.wire_dtype:
            raise PayloadError(
                "dtype",
                f"payload field 'dtype' must be {self.wire_dtype!r} for codec {self.codec!r}, "
                f"got {wire!r:.40}",
                field="dtype",
            )
        data = _from_bytes(_field(payload, "data", bytes), wire, d, "data")
        _require_finite(data, "data")
        return {"data": data}


class Float16(_Cast):
    """IEEE half precision, round to nearest (values beyond ±65504 become inf and are refused)."""

    codec = "fp16"
    wire_dtype = "<f2"
    dtype = torch.float16


class BFloat16(_Cast):
    """bfloat16 (8-bit exponent, 7-bit mantissa), round to nearest even."""

    codec = "bf16"
    wire_dtype = "bf16"
    dtype = torch.bfloat16


class StochasticQuantization(Compressor):
    """QSGD-style stochastic quantization with one float32 scale per block (Alistarh et al. 2017).

    ``C(x)_i = s_b q_i / L`` with ``s_b = max_{i in block b} |x_i|``, ``L = 2^(bits-1) - 1``
    and ``q_i = floor(L x_i / s_b + u_i)``, ``u_i ~ U[0, 1)``: unbiased, ``E[C(x)] = x``.

    Args:
        bits: 2, 4 or 8; each coordinate travels as ``bits`` bits (levels ``q + L`` packed
            little-end first into bytes).
        block: coordinates per scale (the last block may be shorter).

    Wire fields: ``bits``, ``block`` (ints), ``scale`` (``ceil(d/block)`` ``<f4``),
    ``level`` (``ceil(d*bits/8)`` bytes).
    """

    codec = "qsgd"
    _fields = frozenset({"bits", "block", "scale", "level"})
    BITS = (2, 4, 8)

    def __init__(self, bits: int = 8, block: int = 256) -> None:
        super().__init__()
        if isinstance(bits, bool) or bits not in self.BITS:
            raise ValueError(f"qsgd parameter bits must be one of {self.BITS}, got {bits!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"qsgd parameter block must be an int >= 1, got {block!r}")
        self.bits = bits
        self.block = block
        self.levels = 2 ** (bits - 1) - 1

    @property
    def spec(self) -> str:
        return f"qsgd:bits={self.bits},block={self.block}"

    def _blocks(self, x: Tensor) -> Tensor:
        """``[*, d] -> [*, ceil(d / block), width]``, zero padded; a block wider than d is one
        block of width d (never allocate more than 2d, whatever ``block`` a payload claims)."""
        d = x.shape[-1]
        width = min(self.block, d)
        padded = math.ceil(d / width) * width
        x = torch.nn.functional.pad(x, (0, padded - d))
        return x.unflatten(-1, (padded // width, width))

    def _encode_fields(self, x: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        d = x.shape[-1]
        x = x.to(torch.float32)
        blocks = self._blocks(x)  # [*, nblocks, block], zero padded
        scale = blocks.abs().amax(dim=-1)  # [*, nblocks]
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        level = (blocks / safe.unsqueeze(-1)).flatten(-2)[..., :d] * self.levels
        noise = _uniform(x, generator)
        q = torch.floor(level + noise).clamp_(-self.levels, self.levels)
        return {"scale": scale, "level": self._pack(q.to(torch.int16) + self.levels)}

    def _pack(self, unsigned: Tensor) -> Tensor:
        per_byte = 8 // self.bits
        d = unsigned.shape[-1]
        padded = math.ceil(d / per_byte) * per_byte
        u = torch.nn.functional.pad(unsigned, (0, padded - d), value=self.levels)
        u = u.to(torch.uint8).unflatten(-1, (padded // per_byte, per_byte))
        packed = u[..., 0].clone()
        for position in range(1, per_byte):  # at most 4 bit positions, each one vector op
            packed |= u[..., position] << (position * self.bits)
        return packed

    def _unpack(self, packed: Tensor, d: int) -> Tensor:
        per_byte = 8 // self.bits
        shifts = torch.arange(per_byte, device=packed.device, dtype=torch.int16) * self.bits
        u = (packed.to(torch.int16).unsqueeze(-1) >> shifts) & (2**self.bits - 1)
        return u.flatten(-2)[..., :d]

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        q = (self._unpack(fields["level"], d) - self.levels).to(torch.float32)
        step = fields["scale"] / self.levels
        return (self._blocks(q) * step.unsqueeze(-1)).flatten(-2)[..., :d]

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {
            "bits": self.bits,
            "block": self.block,
            "scale": _to_bytes(fields["scale"], "<f4"),
            "level": fields["level"].cpu().numpy().tobytes(),
        }

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        bits = _field(payload, "bits", int)
        block = _field(payload, "block", int)
        if bits != self.bits or block != self.block:
            raise PayloadError(
                "parameter",
                f"payload fields bits={bits}, block={block} do not match this codec's "
                f"bits={self.bits}, block={self.block}",
                field="bits" if bits != self.bits else "block",
            )
        scale = _from_bytes(_field(payload, "scale", bytes), "<f4", math.ceil(d / block), "scale")
        _require_finite(scale, "scale")
        if bool((scale < 0).any()):
            raise PayloadError("value", "payload field 'scale' must be >= 0", field="scale")
        level_bytes = _field(payload, "level", bytes)
        count = math.ceil(d / (8 // bits))
        if len(level_bytes) != count:
            raise PayloadError(
                "length",
                f"payload field 'level' must hold {count} bytes for d={d}, bits={bits}, "
                f"got {len(level_bytes)}",
                field="level",
            )
        level = _view_bytes(level_bytes, np.dtype(np.uint8))
        if bool((self._unpack(level, d) > 2 * self.levels).any()):
            raise PayloadError(
                "value",
                f"payload field 'level' holds a level outside [0, {2 * self.levels}]",
                field="level",
            )
        return {"scale": scale, "level": level}


class _Sparse(Compressor):
    """Send k = ceil(ratio d) coordinates as (sorted ``<i4`` index, ``<f4`` value) pairs."""

    _fields = frozenset({"k", "index", "dtype", "value"})

    def __init__(self, ratio: float = 0.01) -> None:
        super().__init__()
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise ValueError(f"{self.codec} parameter ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)

    @property
    def spec(self) -> str:
        return f"{self.codec}:ratio={self.ratio:g}"

    def k(self, d: int) -> int:
        """Coordinates kept out of d: ``ceil(ratio * d)`` (at least 1)."""
        return max(1, min(d, math.ceil(self.ratio * d - 1e-9)))

    @abstractmethod
    def _select(self, x: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
        """Indices ``[*, k]`` of the coordinates to keep."""

    def _encode_fields(self, x: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        index = self._select(x, self.k(x.shape[-1]), generator).sort(dim=-1).values
        return {"index": index, "value": x.gather(-1, index).to(torch.float32)}

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        value = fields["value"]
        out = value.new_zeros((*value.shape[:-1], d))
        return out.scatter_(-1, fields["index"].to(torch.int64), value)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {
            "k": int(fields["index"].shape[-1]),
            "index": fields["index"].to("cpu", torch.int32).numpy().astype("<i4").tobytes(),
            "dtype": "<f4",
            "value": _to_bytes(fields["value"], "<f4"),
        }

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        k = _field(payload, "k", int)
        if not 0 <= k <= d:
            raise PayloadError(
                "parameter", f"payload field 'k' must be in [0, d={d}], got {k}", field="k"
            )
        wire = _field(payload, "dtype", str)
        if wire != "<f4":
            raise PayloadError(
                "dtype",
                f"payload field 'dtype' must be '<f4' for codec {self.codec!r}, got {wire!r:.40}",
                field="dtype",
            )
        raw_index = _field(payload, "index", bytes)
        if len(raw_index) != 4 * k:
            raise PayloadError(
                "length",
                f"payload field 'index' must hold k={k} values of <i4 = {4 * k} bytes, "
                f"got {len(raw_index)} bytes",
                field="index",
            )
        # int32 -> int64 for scatter (a conversion, so a copy in any case; it swaps bytes too)
        index = torch.from_numpy(np.frombuffer(raw_index, dtype="<i4").astype(np.int64))
        if k and (int(index.min()) < 0 or int(index.max()) >= d):
            raise PayloadError(
                "index", f"payload field 'index' holds indices outside [0, {d})", field="index"
            )
        if k > 1 and not bool((index[1:] > index[:-1]).all()):
            raise PayloadError(
                "index",
                "payload field 'index' must be strictly increasing (no duplicates)",
                field="index",
            )
        value = _from_bytes(_field(payload, "value", bytes), "<f4", k, "value")
        _require_finite(value, "value")
        return {"index": index, "value": value}


class TopK(_Sparse):
    """Top-k sparsification: keep the k largest-magnitude coordinates (biased; Stich 2018)."""

    codec = "topk"

    def _select(self, x: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
        return x.abs().topk(k, dim=-1, sorted=False).indices


class RandomK(_Sparse):
    """Random-k sparsification: k coordinates uniformly at random, unscaled (biased, δ = k/d)."""

    codec = "randk"

    def _select(self, x: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
        keys = _uniform(x, generator)
        return keys.topk(k, dim=-1, sorted=False).indices


class ErrorFeedback(Compressor):
    """Error feedback around a lossy codec: send ``C(x + e)``, keep ``e <- x + e - C(x + e)``.

    Seide et al. 2014 (1-bit SGD); Stich, Cordonnier & Jaggi 2018 (Sparsified SGD with
    memory). The residual ``e`` is sender-side state with the same leading batch as ``x``
    (``[n, d]`` in the simulator, ``[d]`` on a peer); the payload is the inner codec's, so
    receivers need not know. :meth:`reset` forgets the residual.
    """

    def __init__(self, inner: Compressor) -> None:
        super().__init__()
        if isinstance(inner, ErrorFeedback) or inner.lossless:
            raise ValueError(f"error feedback needs a lossy codec, got {inner.spec!r}")
        self.inner = inner
        self.codec = inner.codec  # type: ignore[misc]
        self._fields = inner._fields  # type: ignore[misc]
        self.residual: Tensor | None = None

    @property
    def spec(self) -> str:
        sep = "," if ":" in self.inner.spec else ":"
        return f"{self.inner.spec}{sep}feedback=true"

    def _corrected(self, x: Tensor) -> Tensor:
        if self.residual is None or self.residual.shape != x.shape:
            if self.residual is not None:
                raise ValueError(
                    f"error feedback residual has shape {tuple(self.residual.shape)} but x has "
                    f"{tuple(x.shape)}; call reset() before changing the batch"
                )
            return x
        return x + self.residual

    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Compressed:
        _check_input(x, batched=True)
        corrected = self._corrected(x)
        out = self.inner.compress(corrected, generator)
        self.residual = corrected - out.values
        return out

    def encode_and_decode(
        self, x: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Payload, Tensor]:
        _check_input(x, batched=False)
        corrected = self._corrected(x)
        payload, values = self.inner.encode_and_decode(corrected, generator)
        self.residual = corrected - values.to(x.dtype)
        return payload, values

    def decode(self, payload: Mapping[str, Any], d: int) -> Tensor:
        return self.inner.decode(payload, d)

    def wire_bytes(self, d: int) -> int:
        return self.inner.wire_bytes(d)

    def reset(self) -> None:
        self.residual = None

    def _encode_fields(self, x: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        return self.inner._encode_fields(x, generator)

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return self.inner._decode_fields(fields, d)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return self.inner._serialize(fields, d)

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        return self.inner._parse(payload, d)


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class CompressorInfo:
    """A registry entry: how to build one codec from a spec string."""

    name: str
    factory: Callable[..., Compressor]
    parameters: dict[str, tuple[type, Any, str]]  # name -> (type, default, doc)
    doc: str


_FEEDBACK = (bool, False, "wrap in error feedback (sender keeps what was not sent)")

COMPRESSORS: dict[str, CompressorInfo] = {
    info.name: info
    for info in [
        CompressorInfo("none", NoCompression, {}, "lossless, dtype preserved"),
        CompressorInfo("fp16", Float16, {"feedback": _FEEDBACK}, "float16, 2 bytes/coordinate"),
        CompressorInfo("bf16", BFloat16, {"feedback": _FEEDBACK}, "bfloat16, 2 bytes/coordinate"),
        CompressorInfo(
            "qsgd",
            StochasticQuantization,
            {
                "bits": (int, 8, "bits per coordinate: 2, 4 or 8"),
                "block": (int, 256, "coordinates per float32 scale"),
                "feedback": _FEEDBACK,
            },
            "unbiased stochastic quantization with per-block scale (Alistarh et al. 2017)",
        ),
        CompressorInfo(
            "topk",
            TopK,
            {
                "ratio": (float, 0.01, "fraction of coordinates kept, in (0, 1]"),
                "feedback": _FEEDBACK,
            },
            "k largest-magnitude coordinates (biased)",
        ),
        CompressorInfo(
            "randk",
            RandomK,
            {
                "ratio": (float, 0.01, "fraction of coordinates kept, in (0, 1]"),
                "feedback": _FEEDBACK,
            },
            "k uniformly random coordinates, unscaled (biased)",
        ),
    ]
}

_CODECS: dict[str, type[Compressor]] = {
    "none": NoCompression,
    "fp16": Float16,
    "bf16": BFloat16,
    "qsgd": StochasticQuantization,
    "topk": TopK,
    "randk": RandomK,
}


def _convert(name: str, key: str, kind: type, text: str) -> Any:
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError
            return lowered in {"true", "1", "yes"}
        return kind(text)
    except ValueError:
        raise ValueError(
            f"compressor {name!r} parameter {key!r} must be {kind.__name__}, got {text!r}"
        ) from None


def build_compressor(spec: str) -> Compressor:
    """Build a compressor from ``name[:key=value,...]``, e.g. ``"topk:ratio=0.01,feedback=true"``.

    Unknown names or parameters raise ``ValueError`` listing the choices.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"compressor spec must be a non-empty string, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; choose one of {sorted(COMPRESSORS)}")
    info = COMPRESSORS[name]
    kwargs: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"compressor parameter {item!r} must look like key=value")
        if key not in info.parameters:
            raise ValueError(
                f"compressor {name!r} has no parameter {key!r}; "
                f"choose from {sorted(info.parameters) or 'none'}"
            )
        kwargs[key] = _convert(name, key, info.parameters[key][0], text.strip())
    feedback = kwargs.pop("feedback", False)
    compressor = info.factory(**kwargs)
    return ErrorFeedback(compressor) if feedback else compressor


def describe_compressors() -> str:
    """One line per codec with its parameters and defaults, for ``--compress`` help texts."""
    lines = []
    for info in COMPRESSORS.values():
        params = ",".join(
            f"{key}={str(default).lower() if isinstance(default, bool) else default}"
            for key, (_, default, _) in info.parameters.items()
        )
        spec = f"{info.name}:{params}" if params else info.name
        lines.append(f"{spec:<38} {info.doc}")
    return "\n".join(lines)


def decode(payload: Mapping[str, Any], d: int) -> Tensor:
    """Decode any payload by its ``codec`` field (parameters travel in the payload).

    Raises :class:`PayloadError` on a hostile payload, see :meth:`Compressor.decode`.
    """
    if not isinstance(payload, Mapping):
        raise PayloadError("field", f"payload must be a map, got {type(payload).__name__}")
    codec = payload.get("codec")
    if not isinstance(codec, str) or codec not in _CODECS:
        raise PayloadError(
            "codec",
            f"payload field 'codec' {codec!r:.40} is unknown; expected one of {sorted(_CODECS)}",
            field="codec",
        )
    decoder: Compressor
    if codec == "qsgd":
        bits = _field(payload, "bits", int)
        block = _field(payload, "block", int)
        if bits not in StochasticQuantization.BITS:
            raise PayloadError(
                "parameter",
                f"payload field 'bits' must be one of {StochasticQuantization.BITS}, got {bits}",
                field="bits",
            )
        if block < 1:
            raise PayloadError(
                "parameter", f"payload field 'block' must be >= 1, got {block}", field="block"
            )
        decoder = StochasticQuantization(bits, block)
    else:
        decoder = _CODECS[codec]()
    return decoder.decode(payload, d)
