"""The protocol message around a payload: its fields, and its exact size in bytes.

What a peer sends is one msgpack map, the *envelope* (``peer.protocol.wire`` packs and validates it;
``docs/protocol.md`` is its description)::

    {"v": 2, "sender": "peer-3", "round": 12, "step": 480, "codec": "qsgd",
     "payload": <the codec's payload map>}

Its byte count is a pure function of the payload's byte count
(:meth:`Compressor.wire_bytes <gossip.compression.Compressor.wire_bytes>`) and of four
header values, because msgpack encodes each of them in a width that depends on the value
alone: a map of six entries has a one-byte header; a string of n bytes takes 1 + n bytes
(n < 32), 2 + n (n < 2^8), 3 + n (n < 2^16) or 5 + n; a non-negative int takes 1 byte
(< 2^7), 2 (< 2^8), 3 (< 2^16), 5 (< 2^32) or 9. :func:`envelope_bytes` adds these up, so
the simulator charges a message exactly the ``len`` of the body a peer sends for the same
codec, message length, sender id, round and step (``tests/gossip/test_wire_bytes.py``
checks it against ``peer.protocol.wire.pack_envelope`` for every codec). The peer builds its map
with :func:`envelope_fields`, so both sides share one field order.

The simulator's peers carry the ids ``gossipnet launch`` gives its processes,
``peer-0`` ... ``peer-{n-1}`` (:func:`launch_peer_id`); an id's length changes the header
by its length, so a swarm named otherwise differs from the simulator by that many bytes
per message.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "ENVELOPE_KEYS",
    "PROTOCOL_VERSION",
    "envelope_bytes",
    "envelope_fields",
    "launch_envelope_bytes",
    "launch_peer_id",
]

PROTOCOL_VERSION = 2
"""The protocol version peers speak: the ``v`` of every envelope and JSON view, and a line of
every request signature's signed text (``peer.protocol.auth``). Version 2 (issue 17) changed only the
signed text (it names the version and the receiving peer), so an envelope's size is the same
as version 1's (both fit msgpack's one-byte int)."""

ENVELOPE_KEYS = ("v", "sender", "round", "step", "codec", "payload")
"""The envelope's keys, in the order they are packed (the payload, whose last field holds
the big tensor bytes, last)."""

_INT_LIMITS = np.array([2**7, 2**8, 2**16, 2**32], dtype=np.int64)
_INT_WIDTHS = np.array([1, 2, 3, 5, 9], dtype=np.int64)
_STR_LIMITS = np.array([32, 2**8, 2**16, 2**32], dtype=np.int64)
_STR_HEADERS = np.array([1, 2, 3, 5], dtype=np.int64)


def _int_bytes(values: np.ndarray) -> np.ndarray:
    """msgpack's encoded size of each int in ``values`` (int64, non-negative)."""
    if values.size and int(values.min()) < 0:
        raise ValueError(f"envelope ints (v, round, step) must be >= 0, got {int(values.min())}")
    return _INT_WIDTHS[np.searchsorted(_INT_LIMITS, values, side="right")]


def _ints(name: str, values: ArrayLike) -> np.ndarray:
    """``values`` as a 1-D int64 array; a ValueError naming ``name`` for anything else."""
    array = np.asarray(values)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be ints, got {array.dtype} values")
    if array.size and (int(array.min()) < 0 or int(array.max()) >= 2**63):
        raise ValueError(
            f"{name} must be in [0, 2**63), got {int(array.min())}..{int(array.max())}"
        )
    return array.astype(np.int64).reshape(-1)


def _str_bytes(lengths: np.ndarray) -> np.ndarray:
    """msgpack's encoded size of strings of ``lengths`` UTF-8 bytes each."""
    return lengths + _STR_HEADERS[np.searchsorted(_STR_LIMITS, lengths, side="right")]


_KEY_BYTES = int(_str_bytes(np.array([len(key) for key in ENVELOPE_KEYS])).sum())
_MAP_HEADER = 1  # a fixmap: up to 15 entries


def envelope_fields(
    *,
    sender: str,
    round: int,
    step: int,
    codec: str,
    payload: Mapping[str, Any],
    version: int = PROTOCOL_VERSION,
) -> dict[str, Any]:
    """The envelope as the map a peer packs, keys in :data:`ENVELOPE_KEYS` order."""
    return {
        "v": version,
        "sender": sender,
        "round": round,
        "step": step,
        "codec": codec,
        "payload": payload,
    }


def _envelope_bytes(
    payload_bytes: int,
    sender_bytes: np.ndarray,
    round: ArrayLike,
    steps: ArrayLike,
    codec: str,
    version: int,
) -> np.ndarray:
    if isinstance(payload_bytes, bool) or not isinstance(payload_bytes, int | np.integer):
        raise ValueError(f"payload_bytes must be an int, got {payload_bytes!r}")
    if payload_bytes < 1:
        raise ValueError(f"payload_bytes must be >= 1 (a msgpack map), got {payload_bytes}")
    fixed = (
        _MAP_HEADER
        + _KEY_BYTES
        + int(_int_bytes(_ints("version", version)).sum())
        + int(_str_bytes(np.array([len(codec.encode())]))[0])
        + int(payload_bytes)
    )
    rounds = _int_bytes(_ints("round", round))  # one round for all, or one per sender
    return fixed + rounds + _str_bytes(sender_bytes) + _int_bytes(_ints("steps", steps))


def envelope_bytes(
    payload_bytes: int,
    *,
    sender: str,
    round: int,
    step: int,
    codec: str,
    version: int = PROTOCOL_VERSION,
) -> int:
    """``len`` of the packed envelope carrying a payload of ``payload_bytes`` bytes.

    ``payload_bytes`` is ``len(msgpack.packb(payload))``, for a codec's payload
    ``compressor.wire_bytes(m)``; the other arguments are the envelope's header values.
    """
    sizes = _envelope_bytes(
        payload_bytes,
        np.array([len(sender.encode())]),
        round,
        step,
        codec,
        version,
    )
    return int(sizes[0])


def launch_peer_id(index: int) -> str:
    """The id ``gossipnet launch`` gives its peer of index ``index``: ``peer-{index}``."""
    if isinstance(index, bool) or not isinstance(index, int | np.integer) or index < 0:
        raise ValueError(f"index must be an int >= 0, got {index!r}")
    return f"peer-{index}"


@functools.lru_cache(maxsize=8)
def _launch_id_bytes(n: int) -> np.ndarray:
    lengths = np.array([len(launch_peer_id(i)) for i in range(n)], dtype=np.int64)
    lengths.setflags(write=False)
    return lengths


def launch_envelope_bytes(
    payload_bytes: int,
    *,
    round: ArrayLike,
    steps: ArrayLike,
    codec: str,
    version: int = PROTOCOL_VERSION,
) -> np.ndarray:
    """``[n]`` int64: the envelope size each peer ``peer-{i}`` of a launched swarm sends.

    ``steps [n]`` are the senders' step counters, ``round`` one round for all (synchronous
    rounds) or one per sender ``[n]`` (AD-PSGD peers count their own); ``codec`` and the
    payload's size are the same for every sender. Element i equals :func:`envelope_bytes` with
    ``sender=launch_peer_id(i)`` and ``step=steps[i]``.
    """
    counters = _ints("steps", steps)
    return _envelope_bytes(
        payload_bytes, _launch_id_bytes(len(counters)), round, counters, codec, version
    )
