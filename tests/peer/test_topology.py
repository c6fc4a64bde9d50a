"""Neighbours and mixing weights from topologies over a known peer list (real servers)."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

import topologies
from peer.app.swarm import free_ports
from peer.node.topology import TopologyNeighbours, read_peer_list, topology_names

from .conftest import started_peer


def test_topology_names_are_the_shared_specs() -> None:
    assert topology_names() == topologies.topology_names()
    assert {"ring", "exponential", "one-peer-exponential", "random-k-out"} <= set(topology_names())


def test_neighbours_use_the_shared_spec_builder() -> None:
    addresses = [f"127.0.0.1:{7000 + i}" for i in range(8)]
    for spec in ("random-k-out:k=2", "random-regular:degree=3,seed=1", "random-matching"):
        neighbours = TopologyNeighbours(spec, addresses, 3, seed=5)
        expected = topologies.build_schedule(spec, 8, seed=5).neighbour_table(2)
        row = {addresses[int(j)] for j in expected.index[3][expected.mask[3]]}
        assert set(neighbours.weights(2)) == row
    k_out = TopologyNeighbours("random-k-out:seed=3", addresses, 0, seed=9)
    assert isinstance(k_out.schedule, topologies.RandomKOut)
    assert (k_out.schedule.k, k_out.schedule.seed) == (1, 3)
    assert k_out.name == "random-k-out"
    with pytest.raises(ValueError, match=r"unknown topology 'moebius'.*ring"):
        TopologyNeighbours("moebius", addresses, 0)
    with pytest.raises(ValueError, match=r"parameter '3' is not KEY=VALUE"):
        TopologyNeighbours("ring:3", addresses, 0)
    with pytest.raises(ValueError, match=r"weights='metropolis' applies only to static graphs"):
        TopologyNeighbours("random-matching", addresses, 0, weights="metropolis")


def test_rows_partners_and_schedules() -> None:
    addresses = [f"127.0.0.1:{7000 + i}" for i in range(8)]
    star = TopologyNeighbours("star", addresses, 1)
    assert star.weights(0) == {addresses[0]: pytest.approx(0.125)}  # MH: 1/(1+max(1, 7))
    assert star.partners(0) == {addresses[0]}
    directed = TopologyNeighbours("exponential", addresses, 0)
    w = 1 / (1 + 3)
    # node 0 receives from 0 - 1, 0 - 2, 0 - 4 (mod 8) and sends to 1, 2, 4
    assert set(directed.weights(0)) | set(directed.partners(0)) == {
        addresses[j] for j in (1, 2, 4, 6, 7)
    }
    assert all(v == pytest.approx(w) for v in directed.weights(0).values())
    one_peer = TopologyNeighbours("one-peer-exponential", addresses, 0)
    rounds = [set(one_peer.partners(t)) for t in range(3)]
    assert rounds[0] != rounds[1] != rounds[2]
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 8\)"):
        TopologyNeighbours("ring", addresses, 8)
    with pytest.raises(ValueError, match="takes no parameter 'degree'"):
        TopologyNeighbours("one-peer-exponential:degree=2", addresses, 0)


def test_read_peer_list_skips_comments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "peers.txt"
    path.write_text("# rank 0 first\n127.0.0.1:7000\n\n10.0.0.2:7000  # rank 1\n")
    assert read_peer_list(path) == ("127.0.0.1:7000", "10.0.0.2:7000")


async def _one_sync_round(spec: str, n: int, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Start n sync peers on a topology, run ``rounds`` gossip phases; models before and after."""
    addresses = tuple(f"127.0.0.1:{port}" for port in free_ports(n))
    async with contextlib.AsyncExitStack() as stack:
        peers = []
        for rank, address in enumerate(addresses):
            peers.append(
                await stack.enter_async_context(
                    started_peer(
                        f"p{rank}", seed=rank, mode="sync", topology=spec, peer_list=addresses,
                        rank=rank, port=int(address.rsplit(":", 1)[1]), advertise=address,
                        join=tuple(a for a in addresses if a != address), fetch_state=False,
                        round_deadline_s=10.0,
                    )
                )
            )  # fmt: skip
        for peer in peers:
            await peer.wait_for_members(n - 1, timeout_s=10)
        before = np.stack([p.flat.vector.detach().double().numpy().copy() for p in peers])
        for _ in range(rounds):
            taken = await asyncio.gather(*(p.gossip() for p in peers))
            assert all(count >= 1 for count in taken)
        after = np.stack([p.flat.vector.detach().double().numpy().copy() for p in peers])
    return before, after


@pytest.mark.parametrize(("spec", "n"), [("star", 4), ("exponential", 4)])
async def test_sync_round_mixes_with_the_topology_weights(spec: str, n: int) -> None:
    before, after = await _one_sync_round(spec, n, rounds=1)
    matrix = topologies.mixing_matrix(topologies.build(spec, n)).toarray()
    np.testing.assert_allclose(after, matrix @ before, rtol=1e-5, atol=1e-6)
    uniform = np.full((n, n), 1.0 / n)
    assert not np.allclose(after, uniform @ before, atol=1e-4)  # not plain 1/(k+1)


async def test_time_varying_schedule_one_peer_exponential() -> None:
    before, after = await _one_sync_round("one-peer-exponential", 4, rounds=2)
    schedule = topologies.OnePeerExponential(4)
    expected = schedule.mixing(1).toarray() @ schedule.mixing(0).toarray() @ before
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, np.broadcast_to(before.mean(0), after.shape), atol=1e-5)
