"""The one codec table: spec strings -> compressors, and payloads -> their decoder.

Both runners build codecs here (the simulator through ``gossip.build_algorithm``, a peer
through ``peer.protocol.codecs``), and a receiver decodes whatever arrives with :func:`decode`,
which reads the codec and its parameters from the payload itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from gossip.compression.base import Compressor
from gossip.compression.chunked import MAX_CHUNK, ChunkedTopK
from gossip.compression.dense import BFloat16, Float16, NoCompression
from gossip.compression.errors import PayloadError
from gossip.compression.feedback import ErrorFeedback
from gossip.compression.quantization import StochasticQuantization
from gossip.compression.sparse import RandomK, TopK
from gossip.compression.wire_dtypes import read_field
from topologies.spec_grammar import parse_spec, typed_value

__all__ = ["COMPRESSORS", "CompressorInfo", "build_compressor", "decode"]


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
        CompressorInfo(
            "chunked-topk",
            ChunkedTopK,
            {
                "chunk": (int, 4096, "coordinates per chunk, in [1, 2^30]"),
                "k": (int, 64, "coordinates kept per chunk, in [1, chunk]"),
                "bits": (int, 2, "bits per kept value: 2, 4 or 8"),
                "sigmas": (float, 6.0, "width of the bins, in standard deviations (> 0)"),
                "group": (int, 1, "consecutive chunks sharing one centroid table, in [1, 2^30]"),
                "feedback": _FEEDBACK,
            },
            "SparseLoCo: k largest magnitudes per chunk, b-bit values read through per-bin "
            "centroids (Sarfi et al. 2025; biased)",
        ),
    ]
}
"""Every codec, by its name on the wire (the envelope's and the payload's ``codec``)."""


def _convert(name: str, key: str, kind: type, text: str) -> Any:
    try:
        return typed_value(text, kind)
    except ValueError:
        raise ValueError(
            f"compressor {name!r} parameter {key!r} must be {kind.__name__}, got {text!r}"
        ) from None


def build_compressor(spec: str) -> Compressor:
    """Build a compressor from ``name[:key=value,...]``, e.g. ``"topk:ratio=0.01,feedback=true"``.

    The grammar is :func:`topologies.spec_grammar.parse_spec`'s (a malformed spec raises its
    ``SpecError``); unknown names or parameters raise ``ValueError`` listing the choices.
    """
    name, texts = parse_spec(spec, "compressor")
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; choose one of {sorted(COMPRESSORS)}")
    info = COMPRESSORS[name]
    kwargs: dict[str, Any] = {}
    for key, text in texts.items():
        if key not in info.parameters:
            raise ValueError(
                f"compressor {name!r} has no parameter {key!r}; "
                f"choose from {sorted(info.parameters) or 'none'}"
            )
        kwargs[key] = _convert(name, key, info.parameters[key][0], text)
    feedback = kwargs.pop("feedback", False)
    compressor = info.factory(**kwargs)
    return ErrorFeedback(compressor) if feedback else compressor


def _decoder(payload: Mapping[str, Any]) -> Compressor:
    """The compressor that decodes ``payload``: its codec, with the parameters it carries."""
    codec = payload.get("codec")
    if not isinstance(codec, str) or codec not in COMPRESSORS:
        raise PayloadError(
            "codec",
            f"payload field 'codec' {codec!r:.40} is unknown; expected one of {sorted(COMPRESSORS)}",
            field="codec",
        )
    if codec == "chunked-topk":
        return _chunked_decoder(payload)
    if codec != "qsgd":  # the sparsifiers' k travels in the payload; none/fp16/bf16 have none
        return COMPRESSORS[codec].factory()
    bits = read_field(payload, "bits", int)
    block = read_field(payload, "block", int)
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
    return StochasticQuantization(bits, block)


def _chunked_decoder(payload: Mapping[str, Any]) -> ChunkedTopK:
    """chunked-topk's decoder, with the chunk, k and bits the payload carries (checked)."""
    chunk = read_field(payload, "chunk", int)
    k = read_field(payload, "k", int)
    bits = read_field(payload, "bits", int)
    group = read_field(payload, "group", int)
    if not 1 <= chunk <= MAX_CHUNK:
        raise PayloadError(
            "parameter",
            f"payload field 'chunk' must be in [1, {MAX_CHUNK}], got {chunk}",
            field="chunk",
        )
    if not 1 <= k <= chunk:
        raise PayloadError(
            "parameter", f"payload field 'k' must be in [1, chunk={chunk}], got {k}", field="k"
        )
    if bits not in ChunkedTopK.BITS:
        raise PayloadError(
            "parameter",
            f"payload field 'bits' must be one of {ChunkedTopK.BITS}, got {bits}",
            field="bits",
        )
    if not 1 <= group <= MAX_CHUNK:
        raise PayloadError(
            "parameter",
            f"payload field 'group' must be in [1, {MAX_CHUNK}], got {group}",
            field="group",
        )
    return ChunkedTopK(chunk, k, bits, group=group)


def decode(payload: Mapping[str, Any], d: int) -> Tensor:
    """Decode any payload by its ``codec`` field (parameters travel in the payload).

    Raises :class:`PayloadError` on a hostile payload, see :meth:`Compressor.decode`.
    """
    if not isinstance(payload, Mapping):
        raise PayloadError("field", f"payload must be a map, got {type(payload).__name__}")
    return _decoder(payload).decode(payload, d)
