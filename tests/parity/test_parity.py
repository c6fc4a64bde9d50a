"""Parity: the simulator and N real peers on loopback end a run with the same parameters.

Same problem (model, seed, data batches, mixing matrix W, plain SGD with a fixed lr) in both
runners; after R rounds each peer's flat vector must equal the simulator's row for it.

Tolerance (float32, ``atol=1e-5, rtol=1e-4``): the math is the same, the kernels are not.
The simulator takes gradients with the hand-derived batched kernels of
``sim.linear_chain`` (or ``vmap(grad)``) and mixes by one sparse product ``X <- W X``
(``sim.engine.sparse_mix``), a peer by autograd on its ``nn.Module`` and
``consensus.weighted_mean`` over the neighbours it stacked. Both sum the same terms in a
different order, so they agree to a few float32 ulps (measured: < 1e-7 after 4 rounds); a
different algorithm, batch, weight or order moves the parameters by ~1e-2 (the local SGD
default-order test shows one such gap).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import consensus
from gossip.algorithms import (
    Choco,
    DecentralizedSGD,
    GossipAlgorithm,
    Order,
    PushSum,
    local_sgd,
)
from gossip.compression import build_compressor
from gossip.pairwise import PairwiseGossip
from peer.node.config import PeerConfig
from peer.node.peer import Peer
from workloads import build_model

from .harness import SECRET, Problem, RunResult, max_abs_difference, run_peers, run_simulator

ROUNDS = 4
LOCAL_STEPS = 3
ATOL, RTOL = 1e-5, 1e-4
"""float32 parity tolerance: different gradient and mixing kernels, same math (module doc)."""


def _assert_same_start(simulated: RunResult) -> Callable[[int, Tensor], None]:
    """A ``check_initial`` callback: peer i's flat vector equals simulator row i bit for bit."""

    def check(rank: int, vector: Tensor) -> None:
        assert vector.dtype == simulated.initial.dtype == torch.float32
        assert torch.equal(vector, simulated.initial[rank]), (
            f"peer {rank}'s initial model differs from the simulator's row {rank}"
        )

    return check


def _assert_parity(simulated: RunResult, networked: RunResult, what: str) -> None:
    assert torch.equal(networked.initial, simulated.initial)
    # not a vacuous comparison: training moved the models, and they have not reached consensus
    assert max_abs_difference(simulated.final, simulated.initial) > 100 * ATOL
    assert max_abs_difference(simulated.final[0], simulated.final[1]) > 100 * ATOL
    difference = max_abs_difference(networked.final, simulated.final)
    torch.testing.assert_close(
        networked.final,
        simulated.final,
        atol=ATOL,
        rtol=RTOL,
        msg=lambda detail: (
            f"{what}: peers differ from the simulator after {ROUNDS} rounds "
            f"(max |diff| = {difference:.3g})\n{detail}"
        ),
    )


async def _both_runners(
    problem: Problem,
    rule: GossipAlgorithm,
    *,
    steps_per_round: int = 1,
    byzantine: Sequence[int] = (),
    attack: str | None = None,
    **config: Any,
) -> tuple[RunResult, RunResult]:
    """ROUNDS rounds of ``rule`` in the simulator, then N real peers (``config``: their
    PeerConfig fields) on the simulator's batches from the simulator's initial models."""
    simulated = run_simulator(problem, rule, ROUNDS, byzantine=byzantine, attack=attack)
    networked = await run_peers(
        problem,
        simulated.batches,
        steps=ROUNDS * steps_per_round,
        check_initial=_assert_same_start(simulated),
        per_rank={rank: {"byzantine": attack} for rank in byzantine},
        **config,
    )
    return simulated, networked


# --------------------------------------------------------------------------- D-PSGD


@pytest.mark.parametrize("topology", ["ring", "exponential"])
@pytest.mark.parametrize("order", ["combine-then-adapt", "adapt-then-combine"])
async def test_dpsgd_peers_match_the_simulator(topology: str, order: Order) -> None:
    """D-PSGD (Lian et al. 2017) in both orders, on the undirected ring (Metropolis-Hastings
    W) and the directed exponential graph (uniform W, Assran et al. 2019)."""
    simulated, networked = await _both_runners(
        Problem(topology=topology), DecentralizedSGD(order=order), algorithm="dpsgd", order=order
    )
    _assert_parity(simulated, networked, f"D-PSGD {order} on {topology}")


@pytest.mark.parametrize("codec", ["fp16", "qsgd:bits=8", "qsgd:bits=4,feedback=true"])
async def test_dpsgd_with_a_codec_matches_the_simulator(codec: str) -> None:
    """Naive compressed D-PSGD: each node mixes its exact model with its neighbours' decoded
    ones; a randomized codec draws, in both runners, from the generator node i's peer seeds
    (``gossip.compression.node_generators``)."""
    simulated, networked = await _both_runners(
        Problem(),
        DecentralizedSGD(compressor=build_compressor(codec)),
        algorithm="dpsgd",
        compressor=codec,
    )
    _assert_parity(simulated, networked, f"D-PSGD with {codec}")


# --------------------------------------------------------------------------- local SGD


async def test_local_sgd_peers_match_the_simulator_adapt_then_combine() -> None:
    """Decentralized local SGD (Lin et al., ICLR 2020): H local steps, then one gossip
    average. The simulator's ``local_sgd(H)`` is adapt-then-combine; a peer asked for that
    order explicitly runs the same rounds."""
    simulated, networked = await _both_runners(
        Problem(),
        local_sgd(LOCAL_STEPS),
        steps_per_round=LOCAL_STEPS,
        algorithm="local-sgd",
        local_steps=LOCAL_STEPS,
        order="adapt-then-combine",
    )
    _assert_parity(simulated, networked, "local SGD, order='adapt-then-combine'")


async def test_peer_local_sgd_is_the_simulators_local_sgd() -> None:
    """``PeerConfig(algorithm="local-sgd")`` names the simulator's algorithm, so without an
    explicit order it must run the simulator's (and the paper's, Lin et al. 2020) rounds:
    H local steps, then gossip (adapt-then-combine)."""
    plan = PeerConfig(peer_id="probe", algorithm="local-sgd", local_steps=LOCAL_STEPS)
    simulated, networked = await _both_runners(
        Problem(),
        local_sgd(LOCAL_STEPS),
        steps_per_round=LOCAL_STEPS,
        algorithm="local-sgd",
        local_steps=LOCAL_STEPS,
    )
    _assert_parity(
        simulated,
        networked,
        f"PeerConfig(algorithm='local-sgd') runs order={plan.order!r}, the simulator's "
        f"local_sgd runs {local_sgd(LOCAL_STEPS).plan.order!r}",
    )


# --------------------------------------------------------------------------- Byzantine


@pytest.mark.parametrize("rule", ["trimmed-mean:b=1", "median"])
async def test_robust_dpsgd_with_one_byzantine_peer_matches_the_simulator(rule: str) -> None:
    """D-PSGD with a robust rule (Yin et al. 2018) and one Byzantine peer sending the
    sign-flipped model: the simulator's injection (``consensus.byzantine_messages``) and a
    real ``--byzantine sign-flip`` peer (``consensus.byzantine_message``) put the same
    vectors in the honest peers' inboxes, so the honest peers end alike."""
    problem = Problem(topology="ring")
    simulated, networked = await _both_runners(
        problem,
        DecentralizedSGD(aggregator=consensus.build(rule)),
        byzantine=[1],
        attack="sign-flip",
        algorithm="dpsgd",
        aggregator=rule,
    )
    honest = [0, 2, 3]
    _assert_parity(
        RunResult(simulated.initial[honest], simulated.final[honest], []),
        RunResult(networked.initial[honest], networked.final[honest], []),
        f"D-PSGD with {rule} and a sign-flip peer",
    )
    # the attack reached the honest peers: without it they end elsewhere
    clean = run_simulator(problem, DecentralizedSGD(aggregator=consensus.build(rule)), ROUNDS)
    assert max_abs_difference(clean.final[honest], simulated.final[honest]) > 100 * ATOL


# --------------------------------------------------------------------------- push-sum


@pytest.mark.parametrize("topology", ["exponential", "one-peer-exponential", "ring"])
async def test_push_sum_peers_match_the_simulator(topology: str) -> None:
    """Stochastic gradient push (Assran et al. 2019): ``[x, w]`` messages with column-
    stochastic weights, on the directed exponential graph, the time-varying one-peer
    exponential schedule and the ring; the model both runners train is ``z = x / w``."""
    simulated, networked = await _both_runners(
        Problem(topology=topology), PushSum(), algorithm="push-sum"
    )
    _assert_parity(simulated, networked, f"push-sum on {topology}")


# --------------------------------------------------------------------------- CHOCO


@pytest.mark.parametrize(
    "codec",
    [
        "none",
        "fp16",
        "bf16",
        "qsgd:bits=4",
        "topk:ratio=0.3",
        "randk:ratio=0.3",
        "topk:ratio=0.3,feedback=true",
        "chunked-topk:chunk=16,k=5",
        "chunked-topk:chunk=24,k=6,bits=4,feedback=true",
    ],
)
async def test_choco_peers_match_the_simulator(codec: str) -> None:
    """CHOCO-SGD (Koloskova et al. 2019): each node sends ``Q(x - x̂)`` and keeps
    ``sum_j W_ij x̂_j``; the public copies stay in step over a real network."""
    simulated, networked = await _both_runners(
        Problem(),
        Choco(build_compressor(codec), consensus_step=0.5),
        algorithm="choco",
        compressor=codec,
        consensus_step=0.5,
    )
    _assert_parity(simulated, networked, f"CHOCO with {codec}")


# --------------------------------------------------------------------------- AD-PSGD


def test_simulator_pairwise_exchange_keeps_the_sum_over_nodes() -> None:
    """AD-PSGD's exchange (Lian et al., ICML 2018) ``x_a, x_b <- (x_a + x_b)/2`` keeps
    ``sum_i x_i``: several random matchings, some nodes left out, applied in turn; the
    unpaired nodes keep their models exactly and both ends of a pair hold one value."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(9, 40, generator=generator)
    for _ in range(6):
        x += 0.1 * torch.randn(9, 40, generator=generator)  # local progress between exchanges
        nodes = torch.randperm(9, generator=generator)[:8]  # one node sits out each time
        pairs = nodes[: 2 * int(torch.randint(1, 5, (1,), generator=generator))].reshape(-1, 2)
        before = x.clone()
        PairwiseGossip().exchange(x, pairs)
        # a few float32 ulps of a sum of 9 rows (measured: 2 ulps, 9.5e-7)
        torch.testing.assert_close(x.sum(dim=0), before.sum(dim=0), atol=1e-5, rtol=1e-5)
        paired = pairs.reshape(-1)
        untouched = torch.ones(9, dtype=torch.bool)
        untouched[paired] = False
        assert torch.equal(x[untouched], before[untouched])
        torch.testing.assert_close(x[pairs[:, 0]], x[pairs[:, 1]], atol=0, rtol=0)
        assert max_abs_difference(x[paired], before[paired]) > 1e-2  # the pairs did move


def _model(seed: int) -> nn.Module:
    return build_model("mlp:hidden=8,depth=1", (6,), 3, seed=seed)


@contextlib.asynccontextmanager
async def _async_pair() -> AsyncIterator[tuple[Peer, Peer]]:
    """Two started async-mode (AD-PSGD) peers on loopback that know each other."""
    data = [(torch.randn(4, 6), torch.randint(0, 3, (4,)))]

    def sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1)

    def peer(peer_id: str, seed: int, join: tuple[str, ...]) -> Peer:
        config = PeerConfig(peer_id=peer_id, mode="async", join=join, secret=SECRET)
        return Peer(_model(seed), sgd, nn.functional.cross_entropy, data, config)

    async with contextlib.AsyncExitStack() as stack:
        first = peer("a", 0, ())
        await first.start()
        stack.push_async_callback(first.stop)
        assert first.address is not None
        second = peer("b", 1, (first.address,))
        await second.start()
        stack.push_async_callback(second.stop)
        for each in (first, second):
            assert await each.wait_for_members(1, timeout_s=10)
        yield first, second


def _local_step(peer: Peer, generator: torch.Generator) -> None:
    """One SGD step by hand under the peer's lock (the embedding API for custom training)."""
    x = torch.randn(4, 6, generator=generator)
    y = torch.randint(0, 3, (4,), generator=generator)
    with peer.lock:
        peer.flat.zero_grad()
        nn.functional.cross_entropy(peer.model(x), y).backward()
        peer.optimizer.step()


def _pair_sum(a: Peer, b: Peer) -> Tensor:
    return a.flat.vector.detach() + b.flat.vector.detach()


async def test_peer_pairwise_gossip_keeps_the_pair_sum() -> None:
    """Two real AD-PSGD peers: each ``gossip()`` averages the pair over HTTP and keeps
    ``x_a + x_b``; the pair ends equal to the simulator's ``PairwiseGossip().exchange`` of
    the two."""
    generator = torch.Generator().manual_seed(0)
    async with _async_pair() as (a, b):
        for turn in range(6):
            for peer in (a, b):  # local progress between exchanges: the models differ again
                _local_step(peer, generator)
            stacked = torch.stack([a.flat.vector.detach().clone(), b.flat.vector.detach().clone()])
            assert max_abs_difference(stacked[0], stacked[1]) > 1e-3
            caller = (a, b)[turn % 2]
            assert await caller.gossip() == 1
            torch.testing.assert_close(_pair_sum(a, b), stacked.sum(dim=0), atol=1e-6, rtol=1e-5)
            expected = PairwiseGossip().exchange(stacked.clone(), torch.tensor([[0, 1]]))
            after = torch.stack([a.flat.vector.detach(), b.flat.vector.detach()])
            torch.testing.assert_close(after, expected, atol=1e-6, rtol=1e-5)


async def test_peer_pairwise_gossip_keeps_the_pair_sum_when_both_call_at_once() -> None:
    """Both peers gossip concurrently: whichever way the calls interleave (one declines as
    callee while it is the caller, or both average, one after the other), ``x_a + x_b`` is
    kept. The two need not end equal: if b's call is served first, a's call then meets b
    mid-exchange and the pair ends at two different points with the same sum."""
    generator = torch.Generator().manual_seed(1)
    async with _async_pair() as (a, b):
        for _ in range(4):
            for peer in (a, b):
                _local_step(peer, generator)
            before = _pair_sum(a, b).clone()
            done = await asyncio.gather(a.gossip(), b.gossip())
            assert sum(done) >= 1
            torch.testing.assert_close(_pair_sum(a, b), before, atol=1e-6, rtol=1e-5)
