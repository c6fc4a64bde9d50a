"""Seeded mini-batch sampling that the simulator and the networked peer share exactly.

Both runners draw batch ``t`` of peer ``i`` from the same counter-based random
function (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"),
so they see the *same* samples. With ``key_i = splitmix64(splitmix64(seed) ^ i)``:

- ``replacement=True`` (default; the i.i.d. sampling of the D-PSGD analysis,
  Lian et al. 2017): slot ``s`` of step ``t`` is
  ``position = splitmix64(splitmix64(key_i ^ t) + s) mod size_i``.
- ``replacement=False`` (shuffled epochs): the peer's samples form an endless
  stream of epochs, epoch ``e`` being a random permutation ``pi_{i,e}`` of its
  shard; step ``t`` takes stream positions ``t*B .. t*B+B-1``, i.e.
  ``position = pi_{i,e}(p mod size_i)`` with ``e = p div size_i``. The
  permutation is evaluated pointwise by a 6-round Feistel network keyed by
  ``(key_i, e)`` on the next power-of-two domain, with cycle walking (Black &
  Rogaway 2002) down to ``0 .. size_i - 1``: every sample once per epoch.

No generator state is kept: step ``t`` of peer ``i`` is reproducible on its
own, the simulator draws all n peers in one vectorized call, and a peer that
restarts at step ``t`` continues the same stream.

- :class:`StackedBatchSampler` (simulator): ``sample(dataset, step)`` ->
  ``x [n, B, *input_shape]``, ``y [n, B]`` in one gather.
- :class:`PeerBatchSampler` / :func:`peer_batches` (one peer): an iterator of
  ``(x [B, ...], y [B])``; row ``i`` of the stacked sampler equals peer ``i``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from workloads.datasets import Dataset

__all__ = [
    "PeerBatchSampler",
    "StackedBatchSampler",
    "feistel_permutation",
    "peer_batches",
    "splitmix64",
]

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 bits."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """Steele, Lea & Flood 2014 SplitMix64 finaliser on int64 tensors (wrapping arithmetic).

    z <- z + 0x9E3779B97F4A7C15; z <- (z ^ z>>30) * 0xBF58476D1CE4E5B9;
    z <- (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31 (all mod 2^64).
    """
    z = z.to(torch.int64) + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


_FEISTEL_ROUNDS = 6


def feistel_permutation(
    values: torch.Tensor, sizes: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """pi_key(v): a keyed pseudo-random permutation of ``0 .. size-1``, evaluated elementwise.

    An alternating Feistel network (Luby & Rackoff 1988) on the ``k`` bits of
    ``size - 1`` splits ``v`` into a high part L (ceil(k/2) bits) and a low
    part R and applies 6 rounds L ^= F(R), R ^= F(L) with
    F = splitmix64(. ^ round key): each round is invertible, so this is a
    bijection of ``0 .. 2^k - 1``. Cycle walking (Black & Rogaway 2002)
    re-applies it until the value falls below ``size``, which restricts it to a
    bijection of ``0 .. size-1``; since ``2^k < 2 size`` that takes fewer than
    two applications on average. All arguments broadcast; ``values`` must lie
    in ``0 .. size-1``.
    """
    values, sizes, keys = torch.broadcast_tensors(
        values.to(torch.int64), sizes.to(torch.int64), keys.to(torch.int64)
    )
    shape = values.shape
    values, sizes, keys = values.flatten(), sizes.flatten(), keys.flatten()
    bits = torch.floor(torch.log2((sizes - 1).clamp(min=1).double())).long() + 1  # >= 1
    low_bits = bits // 2
    high_mask = torch.bitwise_left_shift(torch.ones_like(bits), bits - low_bits) - 1
    low_mask = torch.bitwise_left_shift(torch.ones_like(bits), low_bits) - 1
    round_keys = [splitmix64(keys)]
    for _ in range(_FEISTEL_ROUNDS - 1):
        round_keys.append(splitmix64(round_keys[-1]))

    def encrypt(x: torch.Tensor, which: torch.Tensor | slice) -> torch.Tensor:
        shift, high_m, low_m = low_bits[which], high_mask[which], low_mask[which]
        high, low = torch.bitwise_right_shift(x, shift), x & low_m
        for r, key in enumerate(round_keys):
            if r % 2 == 0:
                high = high ^ (splitmix64(low ^ key[which]) & high_m)
            else:
                low = low ^ (splitmix64(high ^ key[which]) & low_m)
        return torch.bitwise_left_shift(high, shift) | low

    result = encrypt(values, slice(None))
    outside = torch.nonzero(result >= sizes).flatten()
    while outside.numel():  # each pass keeps < 1/2 of the walkers on average
        walked = encrypt(result[outside], outside)
        result[outside] = walked
        outside = outside[walked >= sizes[outside]]
    return result.reshape(shape)


def _positions(
    seed: int,
    peers: torch.Tensor,
    step: int,
    sizes: torch.Tensor,
    batch_size: int,
    replacement: bool,
) -> torch.Tensor:
    """``[len(peers), batch_size]`` positions in ``0 .. sizes-1`` for one step."""
    base = splitmix64(torch.tensor([_signed(seed)], dtype=torch.int64, device=peers.device))
    per_peer = splitmix64(base ^ peers)
    slots = torch.arange(batch_size, dtype=torch.int64, device=peers.device)
    if replacement:
        per_step = splitmix64(per_peer ^ _signed(step))
        bits = _shift_right(splitmix64(per_step[:, None] + slots), 1)  # 63 uniform bits, >= 0
        return torch.remainder(bits, sizes[:, None])
    stream = step * batch_size + slots  # [B] positions in the endless stream of epochs
    epoch = torch.div(stream, sizes[:, None], rounding_mode="floor")  # [n, B]
    offset = stream - epoch * sizes[:, None]
    keys = splitmix64(splitmix64(per_peer[:, None] ^ _signed(0x5EED)) ^ epoch)
    return feistel_permutation(offset, sizes[:, None], keys)


def _check_common(batch_size: int, seed: int, replacement: bool) -> None:
    if not isinstance(replacement, bool):
        raise ValueError(f"replacement must be True or False, got {replacement!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def _check_step(step: int) -> None:
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")


def _check_indices(indices: torch.Tensor, what: str) -> None:
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int64 or indices.ndim != 1:
        raise ValueError(f"{what} must be a 1-D int64 tensor of sample indices")
    if indices.numel() == 0:
        raise ValueError(f"{what} is empty: every peer needs at least one sample")


class StackedBatchSampler:
    """One batch for each of n peers at once, ``[n, B]`` indices from a single gather.

    Args:
        partition: peer ``i``'s training indices (e.g. from :func:`workloads.partition`).
        batch_size: ``B``, equal for every peer (shards smaller than ``B`` are fine
            in both modes; without replacement a batch then spans several epochs).
        seed: the stream's seed; ``(seed, step)`` fixes every peer's batch.
        replacement: ``True`` draws uniformly with replacement; ``False`` walks
            through shuffled epochs (each sample once per epoch).

    Example::

        >>> from workloads import load_dataset, partition, StackedBatchSampler
        >>> data = load_dataset("synthetic:num_samples=200,seed=0")
        >>> sampler = StackedBatchSampler(partition("iid", data.y_train, 4), 8, seed=1)
        >>> x, y = sampler.sample(data, step=0)
        >>> tuple(x.shape), tuple(y.shape)
        ((4, 8, 20), (4, 8))
    """

    def __init__(
        self,
        partition: Sequence[torch.Tensor],
        batch_size: int,
        seed: int = 0,
        replacement: bool = True,
    ) -> None:
        _check_common(batch_size, seed, replacement)
        parts = list(partition)
        if not parts:
            raise ValueError("partition must list at least one peer's indices")
        for i, part in enumerate(parts):
            _check_indices(part, f"partition[{i}]")
        self.num_peers = len(parts)
        self.batch_size = batch_size
        self.seed = seed
        self.replacement = replacement
        self.sizes = torch.tensor([len(p) for p in parts], dtype=torch.int64, device="cpu")
        # Padded table [n, max size]; padding is never addressed (positions < size).
        self.table = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True, padding_value=0)
        self._peers = torch.arange(self.num_peers, dtype=torch.int64, device="cpu")

    def indices(self, step: int) -> torch.Tensor:
        """``[n, B]`` training-set indices of every peer's batch at ``step``."""
        _check_step(step)
        positions = _positions(
            self.seed, self._peers, step, self.sizes, self.batch_size, self.replacement
        )
        return self.table.gather(1, positions)

    def sample(self, dataset: Dataset, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [n, B, *input_shape], y [n, B])`` for ``step``."""
        index = self.indices(step).to(dataset.x_train.device)
        return dataset.x_train[index], dataset.y_train[index]


class PeerBatchSampler:
    """Peer ``peer``'s batches, identical to row ``peer`` of :class:`StackedBatchSampler`.

    Iterating yields ``[B]`` index tensors for steps ``start_step, start_step+1, ...``
    without end; ``indices(step)`` gives any single step.
    """

    def __init__(
        self,
        indices: torch.Tensor,
        batch_size: int,
        seed: int = 0,
        peer: int = 0,
        start_step: int = 0,
        replacement: bool = True,
    ) -> None:
        _check_common(batch_size, seed, replacement)
        _check_indices(indices, "indices")
        if not isinstance(peer, int) or peer < 0:
            raise ValueError(f"peer must be an int >= 0, got {peer!r}")
        _check_step(start_step)
        self.source = indices
        self.batch_size = batch_size
        self.seed = seed
        self.peer = peer
        self.start_step = start_step
        self.replacement = replacement
        self._size = torch.tensor([len(indices)], dtype=torch.int64, device="cpu")
        self._peer = torch.tensor([peer], dtype=torch.int64, device="cpu")

    def indices(self, step: int) -> torch.Tensor:
        """``[B]`` training-set indices of this peer's batch at ``step``."""
        _check_step(step)
        positions = _positions(
            self.seed, self._peer, step, self._size, self.batch_size, self.replacement
        )
        return self.source[positions[0]]

    def __iter__(self) -> Iterator[torch.Tensor]:
        step = self.start_step
        while True:
            yield self.indices(step)
            step += 1


def peer_batches(
    dataset: Dataset,
    indices: torch.Tensor,
    batch_size: int,
    seed: int = 0,
    peer: int = 0,
    start_step: int = 0,
    replacement: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless ``(x [B, ...], y [B])`` batches for one peer (same draws as the simulator's row)."""
    sampler = PeerBatchSampler(
        indices, batch_size, seed=seed, peer=peer, start_step=start_step, replacement=replacement
    )
    for index in sampler:
        index = index.to(dataset.x_train.device)
        yield dataset.x_train[index], dataset.y_train[index]
