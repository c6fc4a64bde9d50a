"""Batch sampling: the counter-based draw, simulator rows == peer iterators, uniformity, seeding."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from workloads import (
    PeerBatchSampler,
    StackedBatchSampler,
    feistel_permutation,
    load_dataset,
    partition,
    peer_batches,
    splitmix64,
)

MASK = (1 << 64) - 1


def splitmix64_reference(value: int) -> int:
    """SplitMix64 in Python's unbounded ints, reduced mod 2^64 at each step."""
    z = (value + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def as_unsigned(tensor: torch.Tensor) -> list[int]:
    return [v & MASK for v in tensor.tolist()]


@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50))
def test_splitmix64_matches_the_reference_bit_for_bit(values: list[int]) -> None:
    result = splitmix64(torch.tensor(values, dtype=torch.int64))
    assert as_unsigned(result) == [splitmix64_reference(v & MASK) for v in values]


def test_splitmix64_known_value() -> None:
    # First output of the SplitMix64 generator seeded with 0 (Vigna's reference code).
    assert as_unsigned(splitmix64(torch.tensor([0])))[0] == 0xE220A8397B1DCDAF


def sizes_strategy() -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, 30), min_size=1, max_size=12)


@given(
    sizes=sizes_strategy(),
    batch_size=st.integers(1, 40),
    seed=st.integers(-(2**40), 2**40),
    step=st.integers(0, 10**9),
    replacement=st.booleans(),
)
def test_stacked_rows_equal_each_peers_own_sampler(
    sizes: list[int], batch_size: int, seed: int, step: int, replacement: bool
) -> None:
    offsets = list(itertools.accumulate([0, *sizes]))
    parts = [torch.arange(offsets[i], offsets[i + 1]) for i in range(len(sizes))]
    stacked = StackedBatchSampler(parts, batch_size, seed=seed, replacement=replacement)
    drawn = stacked.indices(step)
    assert drawn.shape == (len(sizes), batch_size)
    for peer, part in enumerate(parts):
        own = PeerBatchSampler(
            part, batch_size, seed=seed, peer=peer, replacement=replacement
        ).indices(step)
        assert torch.equal(drawn[peer], own)
        assert bool(torch.isin(own, part).all())  # a peer only sees its own samples


def test_sample_gathers_batches_for_all_peers_and_matches_peer_batches() -> None:
    data = load_dataset("synthetic:num_samples=300,num_features=7,seed=0")
    parts = partition("dirichlet:alpha=0.5", data.y_train, 6, seed=0)
    sampler = StackedBatchSampler(parts, batch_size=9, seed=11)
    stream = [peer_batches(data, parts[i], 9, seed=11, peer=i) for i in range(6)]
    for step in range(4):
        x, y = sampler.sample(data, step)
        assert x.shape == (6, 9, 7) and y.shape == (6, 9)
        index = sampler.indices(step)
        assert torch.equal(x, data.x_train[index]) and torch.equal(y, data.y_train[index])
        for peer in range(6):
            x_peer, y_peer = next(stream[peer])
            assert torch.equal(x_peer, x[peer]) and torch.equal(y_peer, y[peer])


def test_restart_at_a_step_continues_the_same_stream() -> None:
    part = torch.arange(100, 150)
    from_zero = list(itertools.islice(PeerBatchSampler(part, 4, seed=3, peer=2), 10))
    resumed = list(itertools.islice(PeerBatchSampler(part, 4, seed=3, peer=2, start_step=6), 4))
    assert all(torch.equal(a, b) for a, b in zip(from_zero[6:], resumed))
    assert not torch.equal(from_zero[0], from_zero[1])  # steps differ


def test_seed_peer_and_step_all_change_the_draw() -> None:
    part = torch.arange(1000)
    base = PeerBatchSampler(part, 16, seed=0, peer=0).indices(0)
    assert not torch.equal(base, PeerBatchSampler(part, 16, seed=1, peer=0).indices(0))
    assert not torch.equal(base, PeerBatchSampler(part, 16, seed=0, peer=1).indices(0))
    assert not torch.equal(base, PeerBatchSampler(part, 16, seed=0, peer=0).indices(1))
    assert torch.equal(base, PeerBatchSampler(part, 16, seed=0, peer=0).indices(0))


def test_draws_are_uniform_over_each_peers_shard() -> None:
    # Deterministic (counter-based), so this is an exact check of one fixed stream:
    # 5 peers x 2000 steps x 10 slots over shards of 7, 10, 13, 20, 3 samples.
    sizes = [7, 10, 13, 20, 3]
    offsets = list(itertools.accumulate([0, *sizes]))
    parts = [torch.arange(offsets[i], offsets[i + 1]) for i in range(len(sizes))]
    sampler = StackedBatchSampler(parts, batch_size=10, seed=5)
    draws = torch.cat([sampler.indices(t) for t in range(2000)], dim=1)
    for peer, size in enumerate(sizes):
        counts = torch.bincount(draws[peer] - offsets[peer], minlength=size).double()
        expected = draws.shape[1] / size
        chi_square = float(((counts - expected) ** 2 / expected).sum())
        # 99.9th percentile of chi-square with <= 19 degrees of freedom is 43.8.
        assert chi_square < 43.8, (peer, chi_square)
    # Slots within one batch are not correlated copies of each other.
    assert float((draws[3, :-1] == draws[3, 1:]).double().mean()) < 0.1


@given(
    size=st.integers(1, 600),
    key=st.integers(-(2**63), 2**63 - 1),
)
def test_feistel_permutation_is_a_bijection(size: int, key: int) -> None:
    values = torch.arange(size)
    permuted = feistel_permutation(values, torch.tensor(size), torch.tensor(key))
    assert torch.equal(permuted.sort().values, values)


def test_feistel_permutation_depends_on_the_key_and_broadcasts() -> None:
    values = torch.arange(50)
    a = feistel_permutation(values, torch.tensor(50), torch.tensor(1))
    b = feistel_permutation(values, torch.tensor(50), torch.tensor(2))
    assert not torch.equal(a, b) and not torch.equal(a, values)
    # Rows with different sizes and keys at once equal the rows done one by one.
    sizes = torch.tensor([[50], [17]])
    keys = torch.tensor([[1], [9]])
    both = feistel_permutation(values[None, :17], sizes, keys)
    assert torch.equal(both[0], a[:17])
    assert torch.equal(both[1], feistel_permutation(values[:17], torch.tensor(17), torch.tensor(9)))


def test_feistel_permutation_spreads_every_position_uniformly() -> None:
    # 4,000 keys (as the sampler derives them), size 10: where does position j land?
    keys = splitmix64(torch.arange(4000))[:, None]
    permuted = feistel_permutation(torch.arange(10)[None, :], torch.tensor(10), keys)
    for j in range(10):
        counts = torch.bincount(permuted[:, j], minlength=10).double()
        chi_square = float(((counts - 400) ** 2 / 400).sum())
        assert chi_square < 27.9, (j, chi_square)  # 99.9th percentile, 9 degrees of freedom
    # Neighbouring positions are not tied together: P(pi(1) = pi(0) + 1 mod 10) ~ 1/9.
    follows = (permuted[:, 1] - permuted[:, 0]) % 10 == 1
    assert abs(float(follows.double().mean()) - 1 / 9) < 0.03


@pytest.mark.parametrize("batch_size", [1, 4, 7, 25])
def test_without_replacement_every_sample_once_per_epoch(batch_size: int) -> None:
    sizes = [7, 10, 3, 16]
    offsets = list(itertools.accumulate([0, *sizes]))
    parts = [torch.arange(offsets[i], offsets[i + 1]) for i in range(len(sizes))]
    sampler = StackedBatchSampler(parts, batch_size, seed=2, replacement=False)
    epochs = 4
    steps = -(-max(sizes) * epochs // batch_size)
    stream = torch.cat([sampler.indices(t) for t in range(steps)], dim=1)
    for peer, size in enumerate(sizes):
        orders = [stream[peer, e * size : (e + 1) * size] for e in range(epochs)]
        for order in orders:
            assert torch.equal(order.sort().values, parts[peer])
        if size > 3:
            assert len({tuple(o.tolist()) for o in orders}) > 1  # reshuffled per epoch
    # The same seed with replacement draws differently (duplicates within an epoch).
    with_replacement = StackedBatchSampler(parts, 16, seed=2).indices(0)
    assert len(set(with_replacement[3].tolist())) < 16


def test_batch_larger_than_shard_samples_with_replacement() -> None:
    part = torch.tensor([4, 9])
    batch = PeerBatchSampler(part, 32, seed=0).indices(0)
    assert set(batch.tolist()) == {4, 9}


def test_sampler_errors() -> None:
    part = torch.arange(5)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        StackedBatchSampler([part], 0)
    with pytest.raises(ValueError, match=r"partition\[1\] is empty"):
        StackedBatchSampler([part, torch.empty(0, dtype=torch.int64)], 2)
    with pytest.raises(ValueError, match=r"partition\[0\] must be a 1-D int64 tensor"):
        StackedBatchSampler([part.float()], 2)
    with pytest.raises(ValueError, match="partition must list at least one peer"):
        StackedBatchSampler([], 2)
    with pytest.raises(ValueError, match="step must be an int >= 0, got -1"):
        StackedBatchSampler([part], 2).indices(-1)
    with pytest.raises(ValueError, match="peer must be an int >= 0"):
        PeerBatchSampler(part, 2, peer=-3)
    with pytest.raises(ValueError, match="replacement must be True or False, got 'no'"):
        StackedBatchSampler([part], 2, replacement="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be an int"):
        PeerBatchSampler(part, 2, seed=1.5)  # type: ignore[arg-type]
