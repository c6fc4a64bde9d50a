"""Gossip algorithms from gossip/ driven over all peers: exactness, Byzantine peers, time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import consensus
import topologies
from gossip.algorithms import Choco, DecentralizedSGD
from gossip.compression import build_compressor, envelope_bytes
from sim.algorithms import RingAllReduce
from sim.gossip_runner import AsynchronousGossip, SynchronousGossip
from sim.network import ComputeModel, Crash, Failures
from sim.runner import run

from .helpers import make_context


def static(name: str, n: int, **params) -> topologies.Static:
    return topologies.Static(topologies.mixing_matrix(topologies.build(name, n, **params)))


def test_adapt_then_combine_on_the_complete_graph_is_allreduce() -> None:
    # x_i <- (1/n) Σ_j (x_j − η g_j(x_j)) keeps every peer at the average: exact all-reduce
    n = 4
    gossip = SynchronousGossip(DecentralizedSGD(order="adapt-then-combine"), static("complete", n))
    ctx, evaluation = make_context(n)
    records = run(gossip, ctx, evaluation, rounds=6, eval_every=6)
    ctx_ref, _ = make_context(n)
    allreduce = RingAllReduce()
    run(allreduce, ctx_ref, evaluation, rounds=6, eval_every=6)
    models = gossip.models(ctx)
    torch.testing.assert_close(models, allreduce.model.expand(n, -1), atol=1e-5, rtol=1e-5)
    assert records[-1].consensus_distance < 1e-9


def test_ring_gossip_learns_with_positive_consensus_distance_and_exact_bytes() -> None:
    n = 8
    gossip = SynchronousGossip(DecentralizedSGD(), static("ring", n))
    ctx, evaluation = make_context(n, batch_size=16)
    records = run(gossip, ctx, evaluation, rounds=40, eval_every=20)
    assert records[-1].test_accuracy > 0.75
    assert records[-1].consensus_distance > 0
    payload = gossip.algorithm.compressor.wire_bytes(ctx.peers.dim)
    assert payload >= ctx.model_bytes
    # the envelope a peer sends around it; rounds and steps < 128 and ids peer-0..peer-7 keep
    # its header the same size all run
    wire = envelope_bytes(payload, sender="peer-0", round=0, step=0, codec="none")
    assert records[-1].bytes_busiest == 40 * 2 * wire
    assert records[-1].bytes_total == 40 * n * 2 * wire


def test_compressed_choco_sends_fewer_bytes_and_still_learns() -> None:
    n = 8
    compressor = build_compressor("topk:ratio=0.1")
    choco = SynchronousGossip(Choco(compressor, consensus_step=0.5), static("ring", n))
    plain = SynchronousGossip(DecentralizedSGD(order="adapt-then-combine"), static("ring", n))
    ctx, evaluation = make_context(n, batch_size=16)
    compressed = run(choco, ctx, evaluation, rounds=40, eval_every=40)
    ctx, evaluation = make_context(n, batch_size=16)
    full = run(plain, ctx, evaluation, rounds=40, eval_every=40)
    assert compressed[-1].bytes_total < full[-1].bytes_total / 4
    assert compressed[-1].time < full[-1].time
    assert compressed[-1].test_accuracy > 0.6


def test_sign_flip_byzantine_peers_break_averaging_but_not_trimmed_mean() -> None:
    n, f = 16, 3

    def accuracy(rule: str) -> float:
        gossip = SynchronousGossip(
            DecentralizedSGD(aggregator=consensus.build(rule)),
            static("complete", n),
            attack=consensus.build_attack("sign-flip"),
        )
        ctx, evaluation = make_context(n, byzantine=f)
        return run(gossip, ctx, evaluation, rounds=40, eval_every=40)[-1].test_accuracy

    assert accuracy("mean") < 0.2
    assert accuracy("trimmed-mean:b=3") > 0.65


def test_crashed_peer_keeps_its_model_while_down_and_others_skip_it() -> None:
    n = 6
    failures = Failures(n, crashes=(Crash(peer=2, at=0.0),))
    gossip = SynchronousGossip(DecentralizedSGD(), static("ring", n))
    ctx, evaluation = make_context(n, failures=failures)
    initial = ctx.peers.params.clone()
    run(gossip, ctx, evaluation, rounds=5, eval_every=5)
    torch.testing.assert_close(gossip.parameters[2], initial[2])
    assert (gossip.parameters[0] - initial[0]).abs().max() > 1e-3
    assert ctx.step_count[2] == 0 and ctx.step_count[0] == 5
    assert bool(torch.isfinite(gossip.parameters).all())


def test_message_loss_slows_consensus_but_keeps_models_finite() -> None:
    n = 8
    ctx, evaluation = make_context(n, failures=Failures(n, message_loss=0.5, seed=1))
    lossy = run(
        SynchronousGossip(DecentralizedSGD(), static("ring", n)), ctx, evaluation, rounds=20
    )
    assert np.isfinite(lossy[-1].test_loss)
    assert lossy[-1].bytes_total > 0


def test_one_straggler_ten_times_slower_hurts_sync_gossip_far_more_than_async() -> None:
    n = 8
    compute = ComputeModel(n, step_time=0.01, stragglers={3: 10.0})
    ctx, evaluation = make_context(n, compute=compute)
    sync = run(SynchronousGossip(DecentralizedSGD(), static("ring", n)), ctx, evaluation, rounds=20)
    ctx_async, _ = make_context(n, compute=compute)
    asynchronous = run(AsynchronousGossip(static("ring", n)), ctx_async, evaluation, rounds=20)
    # same number of peer-steps (8 per round) in both
    assert sync[-1].steps == asynchronous[-1].steps == 160
    assert sync[-1].time > 5 * asynchronous[-1].time
    assert ctx_async.step_count[3] < ctx_async.step_count[0]
    assert asynchronous[-1].test_accuracy > 0.5


def test_schedule_size_must_match() -> None:
    ctx, evaluation = make_context(4)
    with pytest.raises(ValueError, match="schedule: has 6 nodes"):
        run(SynchronousGossip(DecentralizedSGD(), static("ring", 6)), ctx, evaluation, rounds=1)


def test_a_robust_rule_on_a_too_sparse_topology_is_refused_up_front() -> None:
    ctx, evaluation = make_context(6)
    gossip = SynchronousGossip(
        DecentralizedSGD(aggregator=consensus.build("trimmed-mean:b=2")), static("ring", 6)
    )
    with pytest.raises(ValueError, match=r"aggregator: .*smallest neighbourhood has n = 3"):
        run(gossip, ctx, evaluation, rounds=1)


def test_peers_that_hear_too_few_neighbours_for_the_rule_keep_their_model() -> None:
    n = 8
    failures = Failures(n, message_loss=0.7, seed=2)
    ctx, evaluation = make_context(n, failures=failures)
    gossip = SynchronousGossip(
        DecentralizedSGD(
            order="adapt-then-combine", aggregator=consensus.build("trimmed-mean:b=1")
        ),
        static("random-regular", n, degree=4, seed=0),
    )
    records = run(gossip, ctx, evaluation, rounds=10, eval_every=10)
    assert np.isfinite(records[-1].test_loss)
    assert records[-1].test_accuracy > 0.3


def test_push_sum_on_the_one_peer_exponential_schedule_learns_and_agrees() -> None:
    from gossip.algorithms import PushSum

    n = 8
    gossip = SynchronousGossip(PushSum(), topologies.OnePeerExponential(n))
    ctx, evaluation = make_context(n, batch_size=16)
    records = run(gossip, ctx, evaluation, rounds=40, eval_every=40)
    assert records[-1].test_accuracy > 0.75
    # one peer per round: each peer sends one message per round
    payload = gossip.algorithm.compressor.wire_bytes(ctx.peers.dim + 1)
    wire = envelope_bytes(payload, sender="peer-0", round=0, step=0, codec="none")
    assert records[-1].bytes_busiest == 40 * wire
    assert records[-1].consensus_distance < 0.1


@pytest.mark.parametrize("codec", ["none", "topk:ratio=0.2"])
def test_choco_under_message_loss_keeps_the_average_once_late_increments_arrive(
    codec: str,
) -> None:
    """Lost CHOCO increments arrive one exchange late (the rule's ``late``), so CHOCO-Gossip
    runs under message loss and keeps the network average exactly."""
    n = 8
    ctx, evaluation = make_context(n, failures=Failures(n, message_loss=0.3, seed=4))
    ctx.peers.params.data = torch.randn(
        n, ctx.peers.dim, generator=torch.Generator().manual_seed(1)
    )
    start = ctx.peers.params.detach().mean(0).clone()
    spread_before = float((ctx.peers.params.detach() - start).norm())
    gossip = SynchronousGossip(
        Choco(build_compressor(codec), consensus_step=0.3, local_steps=0),
        static("ring", n),
    )
    run(gossip, ctx, evaluation, rounds=30, eval_every=30)
    if gossip._late is not None:  # the last exchange's lost increments, still in transit
        gossip.algorithm.late(gossip.state, gossip._late, gossip._late)
    torch.testing.assert_close(gossip.parameters.detach().mean(0), start, rtol=0, atol=1e-5)
    spread = float((gossip.parameters.detach() - start).norm())
    assert spread < 0.5 * spread_before  # and the peers still move toward consensus


@pytest.mark.parametrize(
    "rule, compressor",
    [("mean", "none"), ("trimmed-mean:b=1", "none"), ("mean", "fp16"), ("median", "none")],
)
def test_chunked_exchange_equals_the_algorithms_own_combine(
    rule: str, compressor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain D-PSGD with a stateless rule mixes chunk by chunk (``gather_mix``); forcing the
    generic ``algorithm.combine`` path on the same run gives the same models, with a crashed
    peer, message loss and a rule that freezes peers hearing too few neighbours."""
    n = 12

    def trained(streams: bool) -> tuple[torch.Tensor, list[float]]:
        failures = Failures(n, message_loss=0.3, seed=3, crashes=(Crash(peer=5, at=0.02),))
        ctx, evaluation = make_context(n, failures=failures)
        algorithm = DecentralizedSGD(
            aggregator=consensus.build(rule), compressor=build_compressor(compressor)
        )
        gossip = SynchronousGossip(algorithm, static("random-regular", n, degree=4, seed=1))
        calls = []
        original = SynchronousGossip._streams

        def spy(self, ctx, sent):  # type: ignore[no-untyped-def]
            calls.append(original(self, ctx, sent))
            return calls[-1] and streams

        monkeypatch.setattr(SynchronousGossip, "_streams", spy)
        records = run(gossip, ctx, evaluation, rounds=6, eval_every=6)
        assert len(calls) == 6
        assert all(calls)  # decoded messages (fp16 too) have the model's dtype
        return gossip.parameters.clone(), [r.bytes_total for r in records]

    fast, fast_bytes = trained(True)
    generic, generic_bytes = trained(False)
    torch.testing.assert_close(fast, generic, rtol=0, atol=1e-6)
    assert fast_bytes == generic_bytes
