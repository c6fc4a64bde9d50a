"""Gossip algorithms from gossip/ driven over all peers: exactness, Byzantine peers, time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import consensus
import topologies
from gossip.algorithms import Choco, DecentralizedSGD
from gossip.compression import build_compressor
from sim.algorithms import RingAllReduce
from sim.gossip_runner import AsynchronousGossip, SynchronousGossip, byzantine_messages
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
    wire = gossip.algorithm.compressor.wire_bytes(ctx.peers.dim)
    assert wire >= ctx.model_bytes
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


def test_byzantine_messages_replace_only_byzantine_slots_with_the_attack() -> None:
    sent = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    index = torch.tensor([[1, 3], [0, 2], [1, 3], [2, 0]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    weights = torch.full((4, 2), 1 / 3)
    byzantine = torch.tensor([False, False, False, True])
    received = byzantine_messages(
        consensus.build_attack("sign-flip"), sent, sent[index], index, weights, mask, byzantine
    )
    expected = sent[index].clone()
    expected[0, 1] = -sent[3]
    expected[2, 1] = -sent[3]
    torch.testing.assert_close(received, expected)


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
    wire = gossip.algorithm.compressor.wire_bytes(ctx.peers.dim + 1)
    assert records[-1].bytes_busiest == 40 * wire
    assert records[-1].consensus_distance < 0.1


def test_omniscient_attack_sends_one_vector_per_receiver_from_its_honest_view() -> None:
    sent = torch.randn(5, 4)
    index = torch.tensor([[1, 3, 4], [0, 2, 3], [1, 3, 4], [2, 0, 1], [0, 2, 3]])
    mask = torch.ones(5, 3, dtype=torch.bool)
    weights = torch.full((5, 3), 0.25)
    byzantine = torch.tensor([False, False, False, True, True])
    attack = consensus.build_attack("alie:z=1.5")
    received = byzantine_messages(attack, sent, sent[index], index, weights, mask, byzantine)
    # receiver 0 hears Byzantine 3 and 4: both slots carry the same vector, computed from
    # what receiver 0 sees honestly (its own message and peer 1's)
    assert torch.equal(received[0, 1], received[0, 2])
    expected = attack(
        sent[3].unsqueeze(0),
        torch.stack([sent[0], sent[1]]).unsqueeze(0),
        target=sent[0].unsqueeze(0),
    )[0]
    torch.testing.assert_close(received[0, 1], expected)
    torch.testing.assert_close(received[0, 0], sent[1])
    torch.testing.assert_close(received[1, 1], sent[2])


def test_alie_z_comes_from_each_receivers_real_neighbourhood_and_byzantine_count() -> None:
    """A complete graph of 9 with Byzantine peers 7, 8 and a ring of receivers that hear one:
    z = Φ⁻¹((n − f − s)/(n − f)) with each receiver's own n and f, not the configured f."""
    n = 12
    generator = torch.Generator().manual_seed(0)
    sent = torch.randn(n, 6, generator=generator)
    graph = topologies.build("complete", 9)
    graph.add_edges_from([(8, 9), (9, 10), (10, 11), (11, 0)])
    table = topologies.neighbour_table(topologies.mixing_matrix(graph))
    index = torch.as_tensor(table.index)
    mask = torch.as_tensor(table.mask)
    weights = torch.as_tensor(table.weight, dtype=torch.float32)
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[[7, 8]] = True
    attack = consensus.build_attack("alie:f=1")  # the configured f is not what peers see
    received = byzantine_messages(attack, sent, sent[index], index, weights, mask, byzantine)
    checked = set()
    for receiver in range(n):
        present = mask[receiver]
        bad = present & byzantine[index[receiver]]
        if not bool(bad.any()) or byzantine[receiver]:
            continue
        size, f = int(present.sum()) + 1, int(bad.sum())
        honest = torch.cat([sent[receiver : receiver + 1], sent[index[receiver][present & ~bad]]])
        mean, std = honest.mean(0), honest.std(0)
        expected = mean - consensus.attacks.alie_z(size, f) * std
        for slot in bad.nonzero().squeeze(1).tolist():
            torch.testing.assert_close(received[receiver, slot], expected)
        checked.add((size, f))
    # peers 1..6 see (n=9, f=2), peer 0 (n=10, f=2), peer 9 (n=3, f=1): three different z
    assert {(9, 2), (10, 2), (3, 1)} <= checked
    assert consensus.attacks.alie_z(9, 2) != consensus.attacks.alie_z(9, 1)


def test_dissensus_gets_the_total_byzantine_weight_so_epsilon_one_freezes_the_target() -> None:
    """He, Karimireddy & Jaggi (2022): with ε = 1 under plain averaging the target's update is
    x_i + Σ_h W_ih (x_h − x_i) + Σ_b W_ib (x_byz − x_i) = x_i exactly when the Byzantine
    neighbours together carry the pull, i.e. byzantine_weight is their total weight."""
    n = 8
    generator = torch.Generator().manual_seed(1)
    sent = torch.randn(n, 5, generator=generator, dtype=torch.float64)
    table = topologies.neighbour_table(
        topologies.mixing_matrix(topologies.build("random-regular", n, degree=4, seed=0))
    )
    index = torch.as_tensor(table.index)
    mask = torch.as_tensor(table.mask)
    weights = torch.as_tensor(table.weight, dtype=torch.float64)
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[[2, 5]] = True
    received = byzantine_messages(
        consensus.build_attack("dissensus:epsilon=1"),
        sent,
        sent[index],
        index,
        weights,
        mask,
        byzantine,
    )
    mixed = consensus.build("mean")(sent, received, weights, mask)
    counts = (mask & byzantine[index]).sum(1)
    assert int(counts[~byzantine].max()) == 2  # someone hears both Byzantine peers
    for receiver in (~byzantine & (counts > 0)).nonzero().squeeze(1).tolist():
        torch.testing.assert_close(mixed[receiver], sent[receiver])
    untouched = ~byzantine & (counts == 0)
    expected = consensus.build("mean")(sent, sent[index], weights, mask)
    torch.testing.assert_close(mixed[untouched], expected[untouched])


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
