"""Secure neighbour sums: pairwise additive masks that cancel in a receiver's weighted sum.

A receiver r of a synchronous gossip round (D-PSGD, local SGD) needs only
``S_r = sum_{j in N(r)} W_rj x_j``, the weighted sum of its in-neighbours' models, to mix:
``x_r <- W_rr x_r + S_r``. With secure sums it learns ``S_r`` and nothing more about any
single ``x_j`` (Bonawitz et al., CCS 2017, "Practical secure aggregation", the pairwise masks
without the secret-shared recovery; here one aggregate per receiver and round). Written once
here, pure numpy/torch with no network, and driven by both runners: the simulator batched over
receivers (:func:`secure_sums`), a peer for each receiver it sends to (:func:`masked_message`)
and for itself (:func:`unmask`).

The math, for sender j, receiver r, round t:

1. fixed point: ``e_j = round(W_rj x_j 2^F)`` as an int64, ``F =`` :data:`FRACTION_BITS`
   (32), two's complement in Z_{2^64}. Every coordinate must satisfy ``|x_j| <``
   :data:`LIMIT` (2^30); a non-finite or larger value is refused (:class:`SecureSumError`:
   a model that large has diverged, and clamping it would mix a wrong model silently). Since
   ``sum_j W_rj <= 1``, ``|S_r| 2^F < 2^62``: the modular sum decodes without wrapping.
   Resolution 2^-32 (2.3e-10): each term is off by at most 2^-33, below float32's rounding
   of any coordinate of magnitude above 2^-9.
2. masks: ``m_j = e_j + sum_{k in N(r), k != j} s_jk PRG(K_jk, t, r)`` in Z_{2^64}, with
   ``s_jk = +1`` if ``j < k`` else ``-1``: every pair's stream is added once and subtracted
   once, so ``sum_j m_j = sum_j e_j`` exactly (modular arithmetic has no rounding).
3. the receiver adds the k messages mod 2^64 and decodes ``S_r = int64(sum) 2^-F``.

PRG: ChaCha20 (RFC 8439, through the ``cryptography`` package) keyed by the pair's 32-byte key
``K_jk``, its 16-byte nonce the block counter 0, the round (8 bytes) and the receiver (4
bytes), little-endian; the keystream read as little-endian uint64. A cryptographic stream is
needed: numpy's PCG64 or Philox outputs reveal their state, and a receiver that saw one mask
could then regenerate the others. Keys: X25519 between j's private and k's public key, then
HKDF-SHA256 with info :data:`KEY_INFO` (:func:`pair_key`). A peer draws its private key from
the OS; the simulator derives every node's from the run's seed (:class:`SeededKeys`), which
changes nothing in the result: the masks cancel exactly whatever the keys.

What a receiver sees of one neighbour, ``m_j``, is ``e_j`` plus a uniform value of Z_{2^64}
it cannot compute (it holds no ``K_jk``, only ``K_rj`` of its own pairs), so ``m_j`` is
independent of ``x_j``; only the sum is revealed. This needs at least 2 in-neighbours (with
one, ``S_r = W_rj x_j`` is the neighbour's model): :func:`check_neighbourhoods` refuses such a
topology, and a round that has fewer skips mixing. Dropout: a receiver that lacks any expected
message of a round cannot remove the masks of the others (their pair streams with the absent
sender stay in), so it keeps its own model that round (``complete`` False), in both runners.
Colluders: neighbours that pool their keys and models learn the sum of the others'; with all
but one in-neighbour colluding with r, that one's model (docs/privacy.md).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from torch import Tensor

from gossip.compression.base import packed_size
from gossip.compression.errors import PayloadError

__all__ = [
    "FRACTION_BITS",
    "KEY_BYTES",
    "KEY_INFO",
    "LIMIT",
    "PAYLOAD_CODEC",
    "SecureSumError",
    "SeededKeys",
    "check_neighbourhoods",
    "decode",
    "encode",
    "mask",
    "mask_stream",
    "masked_message",
    "masked_payload",
    "mix_sums",
    "pair_key",
    "payload_bytes",
    "public_bytes",
    "read_masked_payload",
    "secure_sums",
    "unmask",
]

FRACTION_BITS = 32
"""Fixed-point fraction bits F: a value v travels as ``round(v 2^F)``."""
SCALE = float(2**FRACTION_BITS)
LIMIT = float(2**30)
"""The largest magnitude a model coordinate may have (exclusive): ``2^30 2^F = 2^62``."""
KEY_BYTES = 32
KEY_INFO = b"gossipnet secure sum v1"
"""HKDF's info string for a pair key (and the domain of the simulator's seeded keys)."""
PAYLOAD_CODEC = "masked"
"""The codec name of a masked message's payload (``{"codec", "dtype": "<u8", "data"}``)."""


class SecureSumError(ValueError):
    """A value the fixed-point encoding cannot carry (non-finite, or ``|x| >= LIMIT``)."""


# ----------------------------------------------------------------------------- fixed point


def encode(values: Tensor, weight: float | Tensor = 1.0) -> np.ndarray:
    """``round(weight * values * 2^F)`` as uint64 (two's complement), shape of ``values``.

    ``weight`` broadcasts against ``values`` (``[k, 1]`` for k rows). Computed in float64.
    Raises :class:`SecureSumError` naming how many coordinates are non-finite or too large.
    """
    x = values.detach().to("cpu", torch.float64)
    bad = ~(x.abs() < LIMIT)  # NaN compares False
    if bool(bad.any()):
        raise SecureSumError(
            f"secure_sum: {int(bad.sum())} model coordinate(s) are non-finite or >= 2^30 in "
            f"magnitude (largest {float(x.abs().max()):.3g}); the fixed-point encoding "
            "cannot carry them (has training diverged?)"
        )
    scaled = torch.round(x * torch.as_tensor(weight, dtype=torch.float64) * SCALE)
    return scaled.to(torch.int64).numpy().view(np.uint64)


def decode(total: np.ndarray) -> Tensor:
    """A modular sum of encoded values as float64: ``int64(total) 2^-F``."""
    return torch.from_numpy(np.ascontiguousarray(total).view(np.int64).astype(np.float64) / SCALE)


# ----------------------------------------------------------------------------- keys and masks


def public_bytes(private: X25519PrivateKey) -> bytes:
    """The 32 raw bytes of ``private``'s public key (what a peer announces)."""
    return private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def pair_key(private: X25519PrivateKey, public: bytes) -> bytes:
    """``K_jk = HKDF-SHA256(X25519(sk_j, pk_k), info=KEY_INFO)``: both ends derive the same 32
    bytes. Raises ``ValueError`` for a public key that is not 32 bytes (or a low-order point)."""
    if len(public) != KEY_BYTES:
        raise ValueError(f"an X25519 public key has {KEY_BYTES} bytes, got {len(public)}")
    shared = private.exchange(X25519PublicKey.from_public_bytes(public))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=KEY_INFO).derive(
        shared
    )


def mask_stream(key: bytes, round_: int, receiver: int, d: int) -> np.ndarray:
    """``PRG(K, t, r)``: d uint64 of ChaCha20's keystream under ``key`` with nonce
    (counter 0, round t, receiver r)."""
    nonce = (
        (0).to_bytes(4, "little")
        + int(round_).to_bytes(8, "little")
        + receiver.to_bytes(4, "little")
    )
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * d)), dtype="<u8").astype(np.uint64, copy=False)


def mask(
    sender: int,
    receiver: int,
    senders: Sequence[int],
    round_: int,
    key_of: Callable[[int], bytes],
    d: int,
) -> np.ndarray:
    """Sender j's mask for receiver r: ``sum_{k in senders, k != j} s_jk PRG(K_jk, t, r)``
    (``s_jk = +1`` if ``j < k`` else ``-1``), uint64 [d]. ``key_of(k)`` is ``K_jk``."""
    total = np.zeros(d, dtype=np.uint64)
    for other in senders:  # one keystream per pair (each vectorized over d)
        if other == sender:
            continue
        stream = mask_stream(key_of(other), round_, receiver, d)
        if sender < other:
            total += stream
        else:
            total -= stream
    return total


def masked_message(
    values: Tensor,
    weight: float,
    sender: int,
    receiver: int,
    senders: Sequence[int],
    round_: int,
    key_of: Callable[[int], bytes],
) -> np.ndarray:
    """What sender j sends receiver r in round t: ``encode(W_rj x_j) + mask`` in Z_{2^64}
    (``senders``: r's in-neighbours that round, j among them)."""
    if sender not in senders:
        raise ValueError(f"sender {sender} is not among receiver {receiver}'s senders {senders}")
    if len(set(senders)) < 2:
        raise ValueError(
            f"receiver {receiver} has the one sender {sender}: a masked message would be its "
            "model in the clear (secure sums need at least 2 in-neighbours)"
        )
    encoded = encode(values, weight)
    return encoded + mask(sender, receiver, senders, round_, key_of, encoded.shape[-1])


def unmask(messages: Sequence[np.ndarray] | np.ndarray) -> Tensor:
    """``S_r``: the modular sum of all of r's masked messages of a round, decoded (float64).

    An honest sum has ``|S_r| < LIMIT`` in every coordinate (``sum_j W_rj <= 1``); masks that
    did not cancel (a co-sender masked with a stale key, or a message was altered) leave a
    uniform residue, which lands in that range with probability 1/2 a coordinate. Such a sum
    raises :class:`SecureSumError` rather than being mixed (certain detection needs more than
    a few dozen coordinates).
    """
    stacked = np.stack(list(messages)) if not isinstance(messages, np.ndarray) else messages
    total = decode(stacked.sum(axis=-2, dtype=np.uint64))
    out = int((total.abs() >= LIMIT + 1).sum())
    if out:
        raise SecureSumError(
            f"secure_sum: the masks did not cancel ({out} of {total.numel()} coordinates "
            "decode outside the range of any honest sum): a co-sender used a stale key (a "
            "restarted peer) or a message was altered"
        )
    return total


def check_neighbourhoods(fewest: int, *, where: str = "the topology") -> None:
    """Refuse a topology where some receiver has ``fewest < 2`` in-neighbours: its sum would
    be one neighbour's model. ``ValueError``, one line."""
    if fewest < 2:
        raise ValueError(
            f"needs at least 2 in-neighbours per receiver, and {where} gives a node "
            f"{fewest}: that node's sum would be one neighbour's model; use a denser topology "
            "(ring, complete, exponential, random-regular:degree>=2)"
        )


# ----------------------------------------------------------------------------- both runners


def mix_sums(
    algorithm: Any,
    state: Any,
    sent: Tensor,
    sums: Tensor,
    total_weight: Tensor,
    complete: Tensor,
) -> Any:
    """The rule's ``combine`` with the secure sums: ``x_r <- (1 - sum_j W_rj) x_r + S_r``.

    ``sums [*, d]`` (``S_r``), ``total_weight [*]`` (``sum_j W_rj``), ``complete [*]`` (False:
    keep the own model). The sum rides as one neighbour ``S_r / sum_j W_rj`` with weight
    ``sum_j W_rj``, so the rule's own weighted mean mixes it (the same call in both runners).
    """
    dtype, device = sent.dtype, sent.device
    total = total_weight.to(device, torch.float64)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    received = (sums.to(device, torch.float64) / safe.unsqueeze(-1)).to(dtype).unsqueeze(-2)
    weights = total.to(dtype).unsqueeze(-1)
    present = (complete.to(device) & (total > 0)).unsqueeze(-1)
    return algorithm.combine(state, sent, received, weights, present)


class SeededKeys:
    """The simulator's keys: node i's X25519 private key from ``SHA-256(KEY_INFO, seed, i)``
    (a simulation's, never a peer's), and the pair keys of :func:`pair_key`, cached."""

    def __init__(self, seed: int, n: int) -> None:
        self.private = [
            X25519PrivateKey.from_private_bytes(
                hashlib.sha256(KEY_INFO + f":seed={seed}:node={i}".encode()).digest()
            )
            for i in range(n)
        ]
        self.public = [public_bytes(key) for key in self.private]
        self._pairs: dict[tuple[int, int], bytes] = {}

    def key(self, j: int, k: int) -> bytes:
        """``K_jk`` (= ``K_kj``)."""
        pair = (min(j, k), max(j, k))
        if pair not in self._pairs:
            self._pairs[pair] = pair_key(self.private[pair[0]], self.public[pair[1]])
        return self._pairs[pair]


def secure_sums(
    x: Tensor,
    index: np.ndarray,
    weight: np.ndarray,
    listening: np.ndarray,
    delivered: np.ndarray,
    round_: int,
    keys: SeededKeys,
) -> tuple[Tensor, Tensor, Tensor]:
    """Every receiver's secure sum at once (the simulator): ``(sums [n, d] float64,
    total_weight [n], complete [n] bool)``.

    ``index, weight, listening [n, k]`` are the round's neighbour table, ``delivered [n, k]``
    whether each message arrived (sender alive, not lost). Each sender's masked message for
    each receiver is made as a peer makes it (:func:`masked_message`), and each receiver
    unmasks the sum of what arrived; a receiver missing any message, or with fewer than 2
    senders, is not ``complete``.
    """
    n, d = x.shape
    sums = torch.zeros((n, d), dtype=torch.float64)
    totals = torch.zeros(n, dtype=torch.float64)
    complete = torch.zeros(n, dtype=torch.bool)
    for r in range(n):  # one receiver's messages at a time, each vectorized over d
        slots = np.flatnonzero(listening[r])
        senders = [int(j) for j in index[r, slots]]
        totals[r] = float(np.sum(weight[r, slots], dtype=np.float64))
        if len(senders) < 2 or not bool(np.all(delivered[r, slots])):
            continue
        messages = encode(x[senders], torch.as_tensor(weight[r, slots]).reshape(-1, 1))
        for row, j in enumerate(senders):
            messages[row] += mask(j, r, senders, round_, functools.partial(keys.key, j), d)
        sums[r] = unmask(messages)
        complete[r] = True
    return sums, totals, complete


# ----------------------------------------------------------------------------- payload


def payload_bytes(d: int) -> int:
    """The encoded size of a masked payload of d values (8 d and the map's few bytes)."""
    return packed_size(masked_payload(np.zeros(d, dtype=np.uint64)))


def masked_payload(message: np.ndarray) -> dict[str, Any]:
    """A masked message as an envelope payload: ``{"codec": "masked", "dtype": "<u8",
    "data": 8d little-endian bytes}``."""
    data = np.ascontiguousarray(message, dtype="<u8")
    return {"codec": PAYLOAD_CODEC, "dtype": "<u8", "data": data.tobytes()}


def read_masked_payload(payload: Mapping[str, Any], d: int) -> np.ndarray:
    """A received masked payload as uint64 [d] (a copy); :class:`PayloadError` naming the
    field for anything else."""
    if set(payload) != {"codec", "dtype", "data"}:
        raise PayloadError(
            "field", "a masked payload has exactly the fields codec, dtype, data", field="codec"
        )
    if payload["dtype"] != "<u8":
        raise PayloadError("dtype", "a masked payload's dtype must be '<u8'", field="dtype")
    data = payload["data"]
    if not isinstance(data, bytes | bytearray | memoryview):
        raise PayloadError("field", "a masked payload's data must be bytes", field="data")
    if len(data) != 8 * d:
        raise PayloadError(
            "length",
            f"a masked payload's data must hold {8 * d} bytes, got {len(data)}",
            field="data",
        )
    return np.frombuffer(bytes(data), dtype="<u8").astype(np.uint64)
