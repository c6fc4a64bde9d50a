"""Real peers on loopback: joining, converging to the average, failures, resume, training."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import torch

from peer.node.peer import Peer
from peer.transport.client import PeerClient, PeerUnavailable, RemoteRefused

from .conftest import SECRET, started_peer


async def swarm(stack: AsyncExitStack, n: int, **config: object) -> list[Peer]:
    first = await stack.enter_async_context(started_peer("p0", seed=0, **config))
    peers = [first]
    for i in range(1, n):
        peers.append(
            await stack.enter_async_context(
                started_peer(f"p{i}", seed=i, join=(first.address,), fetch_state=False, **config)
            )
        )
    return peers


def spread(peers: list[Peer]) -> float:
    stacked = torch.stack([p.flat.vector for p in peers])
    return float((stacked - stacked.mean(0)).abs().max())


async def test_join_spreads_the_view_to_everyone() -> None:
    async with AsyncExitStack() as stack:
        peers = await swarm(stack, 3)
        for p in peers:
            others = {m.id for m in p.membership.neighbours()}
            assert others == {q.peer_id for q in peers} - {p.peer_id}


async def test_async_pairwise_gossip_converges_to_the_initial_average() -> None:
    async with AsyncExitStack() as stack:
        peers = await swarm(stack, 3)
        average = torch.stack([p.flat.vector for p in peers]).mean(0)
        start = spread(peers)
        exchanges = 0
        for _ in range(20):
            done = await asyncio.gather(*(p.gossip() for p in peers))  # concurrent, interleaved
            exchanges += sum(done)
        assert exchanges >= 20  # at most one side of a pair that called at once declines
        assert spread(peers) < 1e-3 * start
        for p in peers:  # the pair updates keep the sum: the consensus value is the average
            torch.testing.assert_close(p.flat.vector, average, atol=1e-4, rtol=0)


async def test_two_peers_calling_each_other_at_once_average_instead_of_swapping() -> None:
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        total = a.flat.vector + b.flat.vector
        distance = float((a.flat.vector - b.flat.vector).norm())
        done = await asyncio.gather(a.gossip(), b.gossip())
        assert 1 in done  # if the calls overlapped, p0 (smaller id) declined p1's call
        # Two timings are correct. Overlapping calls: one side declines and the pair averages
        # exactly once (distance 0). Back-to-back calls: the second callee averages with the
        # caller's now-stale snapshot and the caller adds (answer - sent), which keeps the sum
        # and halves the distance. A swap (the bug this guards) keeps the distance unchanged.
        torch.testing.assert_close(a.flat.vector + b.flat.vector, total)
        assert float((a.flat.vector - b.flat.vector).norm()) <= 0.5 * distance + 1e-5


async def test_sync_round_on_a_complete_graph_reaches_the_average_in_one_round() -> None:
    async with AsyncExitStack() as stack:
        peers = await swarm(stack, 3, mode="sync", round_deadline_s=5.0)
        average = torch.stack([p.flat.vector for p in peers]).mean(0)
        done = await asyncio.gather(*(p.gossip() for p in peers))
        assert done == [2, 2, 2]
        for p in peers:  # W = J/3: one D-PSGD round is the exact average
            torch.testing.assert_close(p.flat.vector, average, atol=1e-6, rtol=0)
            assert p.round == 1


async def test_sync_rounds_take_one_round_trip_per_pair() -> None:
    async with AsyncExitStack() as stack:
        peers = await swarm(stack, 3, mode="sync", round_deadline_s=8.0)
        for _ in range(3):
            assert await asyncio.gather(*(p.gossip() for p in peers)) == [2, 2, 2]
        calls = [
            p.metrics.registry.get_sample_value(
                "gossipnet_exchanges_total", {"role": "caller", "outcome": "ok"}
            )
            or 0
            for p in peers
        ]
        assert calls == [6, 3, 0]  # p0 calls p1 and p2, p1 calls p2: 3 pairs, 3 calls a round


@pytest.mark.parametrize("dead_index", [0, 2])  # the lowest id (called late) or the highest
async def test_sync_round_masks_a_dead_neighbour_and_suspects_it(dead_index: int) -> None:
    async with AsyncExitStack() as stack:
        peers = await swarm(stack, 3, mode="sync", round_deadline_s=1.0, request_timeout_s=1.0)
        dead = peers.pop(dead_index)
        await dead.stop(goodbye=False)  # dies without a word: a clean stop says goodbye
        before = [p.flat.vector.clone() for p in peers]
        done = await asyncio.gather(*(p.gossip() for p in peers))
        assert done == [1, 1]
        # Weights 1/3 each; the dead one's 1/3 folds into the self weight: 2/3 own + 1/3 other.
        torch.testing.assert_close(peers[0].flat.vector, (2 * before[0] + before[1]) / 3)
        torch.testing.assert_close(peers[1].flat.vector, (2 * before[1] + before[0]) / 3)
        assert peers[0].membership.get(dead.peer_id).status == "suspected"


async def test_failing_neighbour_is_suspected_evicted_then_readmitted() -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(started_peer("a", request_timeout_s=1.0, evict_after=2))
        async with started_peer("b", seed=1, join=(a.address,)) as b:
            b_address = b.address
            assert a.membership.get("b").status == "alive"
            await b.stop(goodbye=False)  # b dies without a word (a clean stop says goodbye)
        assert await a.gossip() == 0
        assert a.membership.get("b").status == "suspected"
        assert await a.gossip() == 0
        assert a.membership.get("b").status == "evicted"
        assert a.membership.neighbours() == []
        _host, port = b_address.split(":")
        async with started_peer("b", seed=1, port=int(port), join=(a.address,)) as b2:
            assert a.membership.get("b").status == "alive"
            assert await b2.gossip() == 1
            assert await a.gossip() == 1


async def test_newcomer_fetches_the_model_state() -> None:
    async with started_peer("a", seed=0) as a, started_peer("b", seed=5, join=(a.address,)) as b:
        assert torch.equal(a.flat.vector, b.flat.vector)


async def test_client_only_peer_takes_part_through_its_own_calls() -> None:
    async with (
        started_peer("server", seed=0) as server,
        started_peer(
            "edge", seed=1, client_only=True, join=(server.address,), fetch_state=False
        ) as edge,
    ):
        assert edge.address is None and edge.listening is None
        average = (server.flat.vector + edge.flat.vector) / 2
        assert await edge.gossip() == 1
        torch.testing.assert_close(server.flat.vector, average)
        torch.testing.assert_close(edge.flat.vector, average)
        assert server.membership.get("edge").address is None
        assert server.membership.neighbours() == []  # never called back


async def test_a_client_only_peer_averages_with_two_neighbours_a_round() -> None:
    """Nobody calls it, so by default it calls two neighbours a round, one after the other:
    it ends at the three models' pairwise averages, the mass of the three conserved."""
    async with (
        started_peer("a", seed=0) as a,
        started_peer("b", seed=1, join=(a.address,), fetch_state=False) as b,
        started_peer(
            "edge", seed=2, client_only=True, join=(a.address, b.address), fetch_state=False
        ) as edge,
    ):
        assert edge.config.fanout == 2 and a.config.fanout == 1
        x = {p.peer_id: p.flat.vector.clone() for p in (a, b, edge)}
        assert await edge.gossip() == 2
        assert a.membership.get("edge") is not None and b.membership.get("edge") is not None
        # one after the other: the first partner holds (edge + first) / 2, the edge and the
        # second partner the average of that and the second
        first, second = (a, b) if not torch.equal(a.flat.vector, edge.flat.vector) else (b, a)
        once = (x["edge"] + x[first.peer_id]) / 2
        torch.testing.assert_close(first.flat.vector, once)
        torch.testing.assert_close(edge.flat.vector, (once + x[second.peer_id]) / 2)
        assert torch.equal(second.flat.vector, edge.flat.vector)


async def test_wrong_secret_cannot_join() -> None:
    async with started_peer("a") as a:
        with pytest.raises(ConnectionError, match="unauthorized"):
            async with started_peer("b", secret=b"some-other-secret-xyz", join=(a.address,)):
                pass
        assert "b" not in a.membership


async def test_client_reports_unreachable_and_refusals() -> None:
    client = PeerClient(secret=SECRET, timeout_s=1.0, max_body_bytes=1 << 20)
    async with client, started_peer("a") as a:
        with pytest.raises(PeerUnavailable):
            await client.peers("127.0.0.1:1")
        with pytest.raises(RemoteRefused) as info:
            await client.request("POST", a.address, "/v1/exchange", b"\xc1")
        assert info.value.status == 400 and info.value.code == "malformed_body"
        small = PeerClient(secret=SECRET, timeout_s=1.0, max_body_bytes=10)
        async with small:
            from peer.protocol.errors import BodyTooLarge

            with pytest.raises(BodyTooLarge):
                await small.request("GET", a.address, "/v1/state")


async def test_training_runs_in_a_worker_thread_and_gossips() -> None:
    async with AsyncExitStack() as stack:
        peers = await swarm(stack, 2)
        await asyncio.gather(*(p.run(steps=6) for p in peers))
        for p in peers:
            assert p.step == 6 and p.round == 6 and p.loss == p.loss
            status = p.status()
            assert status["bytes_in"] > 0 and status["bytes_out"] > 0


async def test_checkpoints_and_resume(tmp_path: Path) -> None:
    async with started_peer("a", checkpoint_dir=str(tmp_path), checkpoint_every=2) as a:
        await a.run(steps=5)
        saved = a.flat.vector.clone()
        optimizer_state = a.optimizer.state_dict()
    assert a.step == 5
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert names[-1] == "checkpoint-000000000005.safetensors"  # final one written on stop
    async with started_peer("a", seed=9, checkpoint_dir=str(tmp_path), resume=True) as resumed:
        assert resumed.step == 5 and resumed.round == 5
        assert torch.equal(resumed.flat.vector, saved)
        state = resumed.optimizer.state_dict()
        assert state["param_groups"] == optimizer_state["param_groups"]
        momentum = state["state"][0]["momentum_buffer"]
        assert momentum.abs().sum() > 0
        assert torch.equal(momentum, optimizer_state["state"][0]["momentum_buffer"])


def _serving_share_spent(peer: Peer) -> None:
    """``peer`` trains (a step just now) and has served 95 % of its window: it answers
    exchanges ``409 busy`` for the next second."""
    share = peer.serving_share
    assert share is not None
    share.done(share.start() - 1.9)
    peer.record_step()


async def test_a_busy_neighbours_place_goes_to_the_next_one_in_the_round() -> None:
    from peer.node.pairwise import BUSY_RETRIES

    async with AsyncExitStack() as stack:
        good = await stack.enter_async_context(started_peer("good", seed=0))
        full = [
            await stack.enter_async_context(
                started_peer(f"full{i}", seed=i + 1, join=(good.address,), fetch_state=False)
            )
            for i in range(4)
        ]
        edge = await stack.enter_async_context(
            started_peer(
                "edge",
                seed=9,
                client_only=True,
                fanout=1,
                join=tuple(p.address for p in [good, *full]),
                fetch_state=False,
            )
        )
        assert len(edge.membership.neighbours()) == 5

        def calls(outcome: str) -> float:
            value = edge.metrics.registry.get_sample_value(
                "gossipnet_exchanges_total", {"role": "caller", "outcome": outcome}
            )
            return 0.0 if value is None else value

        # with four busy neighbours and one free, a round (fanout 1) passes over at most
        # BUSY_RETRIES busy ones; when the free one comes within that, the round averages
        rounds = []
        for _ in range(8):
            for peer in full:
                _serving_share_spent(peer)
            before = calls("busy")
            done = await edge.gossip()
            rounds.append((done, calls("busy") - before))
        assert all(refused <= BUSY_RETRIES + 1 for _, refused in rounds), rounds
        assert all(done == (refused <= BUSY_RETRIES) for done, refused in rounds), rounds
        assert any(done and refused for done, refused in rounds), rounds  # a retry averaged
        assert any(refused == BUSY_RETRIES + 1 for _, refused in rounds), rounds  # the bound
        assert sum(p.serving_share.refused for p in full) == calls("busy")  # type: ignore[union-attr]
        assert calls("failed") == 0


async def test_max_serving_share_is_the_bound_the_server_keeps() -> None:
    """A neighbour that has served 95 % of its window answers busy under the default share
    (0.5) and still serves under ``max_serving_share=1`` (no bound)."""
    async with AsyncExitStack() as stack:
        done = {}
        for name, share in (("bounded", None), ("unbounded", 1.0)):
            options = {} if share is None else {"max_serving_share": share}
            server = await stack.enter_async_context(started_peer(name, seed=0, **options))
            edge = await stack.enter_async_context(
                started_peer(
                    f"edge-{name}",
                    seed=9,
                    client_only=True,
                    join=(server.address,),
                    fetch_state=False,
                )
            )
            assert server.serving_share is not None
            assert server.serving_share.max_share == (0.5 if share is None else share)
            _serving_share_spent(server)
            done[name] = (await edge.gossip(), server.serving_share.refused)
        assert done == {"bounded": (0, 1), "unbounded": (1, 0)}, done
