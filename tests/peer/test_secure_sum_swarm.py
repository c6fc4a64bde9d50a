"""Secure neighbour sums in a real swarm: peers on 127.0.0.1 with real aiohttp servers.

A swarm with ``secure_sum`` ends with the simulator's model (with or without secure sums)
within float32 rounding, and every round mixed a secure sum; a peer serves its public key but
never its model in the clear, refuses a plain message, and a round that misses a neighbour's
masked message keeps the receiver's own model, says so and counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gossip.algorithms import DecentralizedSGD, local_sgd
from gossip.compression import launch_peer_id
from gossip.secure_sum import SeededKeys
from peer.app.cli import parse_peer_args
from peer.app.swarm import free_ports
from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import MalformedBody, UnknownPeer
from peer.protocol.wire import Envelope
from peer.transport.answers import check_key
from peer.transport.client import PeerClient, RemoteRefused
from sim.gossip_runner import SynchronousGossip
from tests.parity.harness import SECRET, Batch, Problem, max_abs_difference, simulator_context

ROUNDS = 3


def _simulate(
    problem: Problem, secure: bool, local_steps: int = 1
) -> tuple[torch.Tensor, list[list[Batch]]]:
    ctx = simulator_context(problem)
    rule = DecentralizedSGD() if local_steps == 1 else local_sgd(local_steps)
    runner = SynchronousGossip(
        rule, problem.schedule(), secure=SeededKeys(0, problem.n) if secure else None
    )
    runner.setup(ctx)
    for _ in range(ROUNDS):
        runner.round(ctx)
        ctx.round += 1
    return ctx.peers.params.detach().clone(), [ctx.peer_batches(i) for i in range(problem.n)]


@contextlib.asynccontextmanager
async def _swarm(
    problem: Problem, batches: Sequence[list[Batch]], *, up: int | None = None, **config: Any
) -> AsyncIterator[list[Peer]]:
    """The problem's peers with secure sums, started (only the first ``up`` of them)."""
    addresses = tuple(f"127.0.0.1:{port}" for port in free_ports(problem.n))
    peers = [
        Peer(
            problem.build_model(),
            problem.optimizer,
            nn.functional.cross_entropy,
            list(batches[rank]),
            PeerConfig(
                peer_id=launch_peer_id(rank),
                port=int(address.rsplit(":", 1)[1]),
                mode="sync",
                topology=problem.topology,
                peer_list=addresses,
                rank=rank,
                join=addresses[:1] if rank else (),
                secret=SECRET,
                seed=problem.seed,
                secure_sum=True,
                **config,
            ),
        )
        for rank, address in enumerate(addresses)
    ][:up]
    async with contextlib.AsyncExitStack() as stack:
        for peer in peers:
            await peer.start()
            stack.push_async_callback(peer.stop)
        for peer in peers:
            assert await peer.wait_for_members(len(peers) - 1, timeout_s=10)
        yield peers


@pytest.mark.parametrize(
    ("algorithm", "local_steps"), [("dpsgd", 1), ("local-sgd", 2)], ids=["dpsgd", "local-sgd"]
)
async def test_a_secure_swarm_ends_with_the_simulators_model_and_mixed_every_round(
    algorithm: str, local_steps: int
) -> None:
    problem = Problem(n=4, topology="ring")
    plain, batches = _simulate(problem, secure=False, local_steps=local_steps)
    secure, _ = _simulate(problem, secure=True, local_steps=local_steps)
    async with _swarm(
        problem,
        batches,
        algorithm=algorithm,
        local_steps=local_steps,
        round_deadline_s=10.0,
        request_timeout_s=10.0,
    ) as peers:
        await asyncio.gather(*(peer.run(ROUNDS * local_steps) for peer in peers))
        final = torch.stack([p.flat.vector.detach().clone() for p in peers])
        statuses = [peer.status() for peer in peers]
        d = peers[0].spec.numel
    assert max_abs_difference(final, secure) < 1e-5
    assert max_abs_difference(final, plain) < 1e-5
    assert all(s["secure_sum"] == {"mixed": ROUNDS, "skipped": 0} for s in statuses)
    # each message is 8 bytes a coordinate (twice the float32 model), to 2 neighbours a round
    assert all(s["bytes_out"] >= ROUNDS * 2 * 8 * d for s in statuses)


async def test_a_missing_neighbour_leaves_the_round_unmixed_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three ranks on the complete graph, rank 2 never starts: ranks 0 and 1 each lack a
    message (and rank 2's key), so neither can unmask: each keeps its own model, warns and
    counts the round; their keys are served, their models are not, plain messages are
    refused."""
    problem = Problem(n=3, topology="complete")
    _, batches = _simulate(problem, secure=False)
    caplog.set_level(logging.WARNING, logger="peer.node.secure_round")
    async with _swarm(
        problem, batches, up=2, round_deadline_s=0.5, request_timeout_s=2.0, fetch_state=False
    ) as peers:
        before = [p.flat.vector.detach().clone() for p in peers]
        await asyncio.gather(*(peer.run(1) for peer in peers))
        statuses = [peer.status() for peer in peers]
        metrics = peers[0].render_metrics().decode()
        client = PeerClient(secret=SECRET, timeout_s=2.0, max_body_bytes=peers[1].max_body_bytes)
        address = peers[1].config.peer_list[1]
        try:
            key = await client.public_key(address)
            assert key is not None and len(key) == 32
            with pytest.raises(RemoteRefused) as refused:
                await client.state(address, codecs={"none"})
            assert refused.value.code == "not_found"
            plain = Envelope(
                sender="stranger",
                round=0,
                codec="none",
                payload=DenseCodec().encode(torch.zeros(peers[1].spec.numel)),
            )
            with pytest.raises(RemoteRefused) as refused:
                await client.exchange(address, plain, codecs={"masked"})
            assert refused.value.code == "unknown_codec"
        finally:
            await client.close()
    assert all(s["secure_sum"] == {"mixed": 0, "skipped": 1} for s in statuses)
    assert 'gossipnet_secure_sum_rounds_total{outcome="skipped"} 1.0' in metrics
    assert sum("cannot be unmasked" in r.getMessage() for r in caplog.records) == 2
    for peer, start in zip(peers, before, strict=True):
        # its own model after one local step (CTA: gradient at the start, no mixing)
        assert not torch.equal(peer.flat.vector, start)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--secure-sum", "maybe"], "--secure-sum: must be true or false, got 'maybe'"),
        (["--secure-sum"], "--secure-sum: needs --topology"),
        (
            ["--secure-sum", "--topology", "ring", "--byzantine", "sign-flip"],
            "--secure-sum: cannot run with --byzantine",
        ),
        (
            ["--secure-sum", "--topology", "random-matching"],
            "--secure-sum: needs at least 2 in-neighbours per receiver",
        ),
        (
            ["--secure-sum", "--topology", "ring", "--aggregator", "trimmed-mean:b=1"],
            "--secure-sum: cannot run with --aggregator 'trimmed-mean:b=1'",
        ),
        (["--secure-sum", "--algorithm", "push-sum"], "--secure-sum: is not used by push-sum"),
    ],
)
def test_the_peer_refuses_what_secure_sums_cannot_run_with_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    peers = tmp_path / "peers.txt"
    peers.write_text("127.0.0.1:7001\n127.0.0.1:7002\n127.0.0.1:7003\n127.0.0.1:7004\n")
    listed = ["--peers-file", str(peers), "--rank", "0"] if "--topology" in flags else []
    with pytest.raises(SystemExit) as exit:
        parse_peer_args(["--id", "a", "--algorithm", "dpsgd", *flags, *listed])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ('"' + "ab" * 32 + '"', None),
        ("null", None),
        ('"' + "AB" * 32 + '"', MalformedBody),
        ('"' + "ab" * 31 + '"', MalformedBody),
        ("17", MalformedBody),
    ],
)
def test_a_key_answer_is_checked_before_it_is_used(key: str, error: type | None) -> None:
    body = f'{{"v": 2, "id": "peer-1", "key": {key}}}'.encode()
    if error is None:
        got = check_key(body, what="key", receiver="peer-1")
        assert got == (None if key == "null" else bytes.fromhex("ab" * 32))
        with pytest.raises(UnknownPeer):
            check_key(body, what="key", receiver="peer-2")
    else:
        with pytest.raises(error):
            check_key(body, what="key", receiver="peer-1")
