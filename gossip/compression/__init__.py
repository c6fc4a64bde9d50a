"""Compressors for gossip messages: the one codec table, shared by the simulator and the wire.

Every compressor ``C`` maps a flat float vector ``x [d]`` to a payload and back to a decoded
vector ``C(x) [d]``. It offers

* a **batched path** for the simulator: :meth:`Compressor.compress` ``x [*, d] -> Compressed``
  with ``values [*, d]`` (what every receiver decodes) and ``wire_bytes`` (the exact byte count
  of each row's payload), randomness drawn from an explicit ``torch.Generator``;
* a **wire path** for the peer: :meth:`Compressor.encode` ``x [d] -> payload`` (a dict of
  ``str -> str | int | bytes``, ready for ``msgpack.packb``; tensors travel as raw
  little-endian bytes with explicit dtypes from the one vocabulary
  :data:`WIRE_DTYPES`) and :meth:`Compressor.decode` ``(payload, d) -> Tensor [d]``, which
  validates everything (known codec, exact field set, types, lengths, index ranges, levels,
  finite values) and raises :class:`PayloadError` (a ``ValueError`` whose ``kind`` says which
  check failed, see :data:`PAYLOAD_ERROR_KINDS`) naming the field on hostile input.
  :func:`decode` dispatches on the payload's ``codec`` field. Dense fields are viewed in
  place where the wire dtype is the host's (no copy of the received bytes: the ``none``
  codec's result shares memory with the payload, treat it as read-only).

Both paths run the same two halves, so for the same generator state row ``i`` of the batched
path decodes to exactly what the wire path decodes for ``x[i]``, on any machine.

**Bytes on the wire.** :meth:`Compressor.wire_bytes` is ``len(msgpack.packb(payload))``: the
payload map, field names and codec name included. A peer wraps it in an envelope (sender,
round, step, codec); :func:`envelope_bytes` is that message's exact size, which is what the
simulator charges per message (:mod:`gossip.compression.envelope`).

Codecs (spec strings for :func:`build_compressor`; :data:`COMPRESSORS` lists them):

============  ===========================================================  =========
spec          decoded value                                                 bias
============  ===========================================================  =========
none          x (dtype preserved)                                           lossless
fp16          round-to-nearest float16                                      biased
bf16          round-to-nearest bfloat16                                     biased
qsgd          s * q / L, q = floor(L x / s + u), u ~ U[0,1) (Alistarh 2017)  unbiased
topk          the k = ceil(ratio d) largest-magnitude coordinates           biased
              (ties to the lower index, NaN counts as the largest)
randk         k coordinates chosen uniformly at random (unscaled):          biased
              the k largest of d U[0,1) keys, ties to the lower index
chunked-topk  per chunk of 4096, its k = 64 largest magnitudes, each        biased
              read as the centroid of its 2-bit bin (SparseLoCo, Sarfi
              et al. 2025), one centroid table per chunk: ~128x fewer
              bytes than float32
============  ===========================================================  =========

Any lossy codec takes ``feedback=true`` to add error feedback (Seide et al. 2014; Stich et
al. 2018, "Sparsified SGD with memory"): ``C(x + e)`` is sent and ``e <- x + e - C(x + e)``
is kept by the sender, see :class:`ErrorFeedback`.

One job per module: :mod:`~gossip.compression.errors` (what a receiver refuses),
:mod:`~gossip.compression.wire_dtypes` (the dtype vocabulary, bytes in and out),
:mod:`~gossip.compression.base` (the contract), :mod:`~gossip.compression.dense`,
:mod:`~gossip.compression.quantization`, :mod:`~gossip.compression.sparse`,
:mod:`~gossip.compression.chunked`, :mod:`~gossip.compression.feedback` (the codecs),
:mod:`~gossip.compression.bitpack` (integers of any width packed end to end),
:mod:`~gossip.compression.slabs` (walking
a large vector in cache-sized slabs, noise drawn in stream order),
:mod:`~gossip.compression.selection` (the sparsifiers' exact k largest, ties to the lower
index), :mod:`~gossip.compression.registry` (the table, specs, dispatch) and
:mod:`~gossip.compression.envelope` (the message around a payload and its size).

**Speed at model sizes.** Every codec is vectorized and allocates nothing of the vector's
size beyond its output: qsgd quantizes and packs a slab at a time in a reused workspace,
top-k and rand-k keep only the candidates above a threshold, chunked top-k selects a
cache-sized slab of chunks at a time, error feedback reuses its
residual's memory, and :meth:`Compressor.wire_bytes` is counted without encoding.
``bench/compressors.py`` prints encode and decode at 10M and 100M parameters beside
``clone()``.
"""

from gossip.compression.base import (
    Compressed,
    Compressor,
    Payload,
    Randomness,
    node_generators,
    node_seed,
)
from gossip.compression.chunked import ChunkedTopK
from gossip.compression.dense import BFloat16, Float16, NoCompression
from gossip.compression.envelope import (
    ENVELOPE_KEYS,
    PROTOCOL_VERSION,
    envelope_bytes,
    envelope_fields,
    launch_envelope_bytes,
    launch_peer_id,
)
from gossip.compression.errors import PAYLOAD_ERROR_KINDS, PayloadError, PayloadErrorKind
from gossip.compression.feedback import ErrorFeedback
from gossip.compression.quantization import StochasticQuantization
from gossip.compression.registry import (
    COMPRESSORS,
    CompressorInfo,
    build_compressor,
    decode,
)
from gossip.compression.sparse import RandomK, TopK
from gossip.compression.wire_dtypes import WIRE_DTYPE_NAMES, WIRE_DTYPES

__all__ = [
    "COMPRESSORS",
    "ENVELOPE_KEYS",
    "PAYLOAD_ERROR_KINDS",
    "PROTOCOL_VERSION",
    "WIRE_DTYPES",
    "WIRE_DTYPE_NAMES",
    "BFloat16",
    "ChunkedTopK",
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
    "Randomness",
    "StochasticQuantization",
    "TopK",
    "build_compressor",
    "decode",
    "envelope_bytes",
    "envelope_fields",
    "launch_envelope_bytes",
    "launch_peer_id",
    "node_generators",
    "node_seed",
]
