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


def test_choco_with_sparselocos_codec_learns_and_is_charged_its_exact_bodies() -> None:
    """CHOCO sending chunked top-k with 2-bit centroids (Sarfi et al. 2025) learns, and each
    message is charged the envelope a peer sends around the codec's exact payload."""
    n = 8
    compressor = build_compressor("chunked-topk:chunk=128,k=13")
    choco = SynchronousGossip(Choco(compressor, consensus_step=0.5), static("ring", n))
    ctx, evaluation = make_context(n, batch_size=16)
    records = run(choco, ctx, evaluation, rounds=40, eval_every=40)
    payload = compressor.wire_bytes(ctx.peers.dim)
    wire = envelope_bytes(payload, sender="peer-0", round=0, step=0, codec="chunked-topk")
    assert records[-1].bytes_total == 40 * n * 2 * wire
    # 104 of 1002 values at 7 + 2 bits, eight tables of four centroids: 316 bytes in all
    assert payload < ctx.model_bytes / 12
    assert records[-1].test_accuracy > 0.6


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


def _byzantine_run(
    rule: str, attack: str, *, streams: bool, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.Tensor, list[dict]]:
    import sim.gossip_runner as runner

    n = 12
    failures = Failures(n, message_loss=0.2, seed=5, crashes=(Crash(peer=1, at=0.02),))
    ctx, evaluation = make_context(n, failures=failures, byzantine=3)
    gossip = SynchronousGossip(
        DecentralizedSGD(aggregator=consensus.build(rule)),
        static("random-regular", n, degree=6, seed=2),
        attack=consensus.build_attack(attack),
    )
    original = SynchronousGossip._streams
    monkeypatch.setattr(
        SynchronousGossip, "_streams", lambda self, c, s: original(self, c, s) and streams
    )
    monkeypatch.setattr(runner, "rows_for_budget", lambda *args, **kwargs: chunk)
    records = run(gossip, ctx, evaluation, rounds=5, eval_every=5)
    return gossip.parameters.clone(), [r.as_dict() for r in records]


@pytest.mark.parametrize("attack", ["sign-flip", "alie", "dissensus", "mimic", "ipm"])
@pytest.mark.parametrize("rule", ["mean", "trimmed-mean:b=2"])
def test_byzantine_messages_stream_chunk_by_chunk_like_the_whole_inbox(
    rule: str, attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Byzantine messages injected into 5 receivers' inboxes at a time give the models of the
    whole [n, k, d] inbox and ``algorithm.combine`` (omniscient attacks see each receiver's
    own view either way), with message loss, a crash and frozen receivers."""
    streamed, streamed_records = _byzantine_run(
        rule, attack, streams=True, chunk=5, monkeypatch=monkeypatch
    )
    whole, whole_records = _byzantine_run(
        rule, attack, streams=False, chunk=5, monkeypatch=monkeypatch
    )
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-6)
    np.testing.assert_equal(streamed_records, whole_records)


def test_byzantine_messages_for_a_chunk_of_receivers_equal_one_call_over_all() -> None:
    n, k, d = 9, 4, 6
    generator = torch.Generator().manual_seed(0)
    sent = torch.randn(n, d, generator=generator)
    index = torch.stack([torch.randperm(n, generator=generator)[:k] for _ in range(n)])
    weights = torch.full((n, k), 1 / (k + 1))
    mask = torch.rand(n, k, generator=generator) > 0.2
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[[2, 5]] = True
    attack = consensus.build_attack("alie")
    whole = consensus.byzantine_messages(attack, sent, sent[index], index, weights, mask, byzantine)
    for start in range(0, n, 4):
        rows = slice(start, min(start + 4, n))
        part = consensus.byzantine_messages(
            attack,
            sent,
            sent[index[rows]],
            index[rows],
            weights[rows],
            mask[rows],
            byzantine,
            receivers=torch.arange(rows.start, rows.stop),
        )
        torch.testing.assert_close(part, whole[rows], rtol=0, atol=0)
    assert not torch.equal(whole, sent[index])
    with pytest.raises(ValueError, match="receivers must be an integer tensor of shape"):
        consensus.byzantine_messages(
            attack,
            sent,
            sent[index[:3]],
            index[:3],
            weights[:3],
            mask[:3],
            byzantine,
            receivers=torch.arange(4),
        )


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_combine_then_adapt_gradient_inside_the_exchange_changes_no_bit(
    optimizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D-PSGD's combine-then-adapt takes each block's gradients at the pre-mixing models
    after mixing (one block of gradients in flight): the same models and records, bit for
    bit, as all gradients first and the step after the exchange."""
    from sim.algorithms import OptimizerConfig

    def trained(defer: bool) -> tuple[torch.Tensor, list[dict]]:
        n = 10
        failures = Failures(n, message_loss=0.3, seed=3, crashes=(Crash(peer=4, at=0.02),))
        config = OptimizerConfig(name=optimizer, lr=0.05, momentum=0.9 * (optimizer == "sgd"))
        ctx, evaluation = make_context(n, failures=failures, optimizer=config)
        gossip = SynchronousGossip(DecentralizedSGD(), static("ring", n))
        monkeypatch.setattr(
            SynchronousGossip, "_defers_gradient", lambda self: defer and self.state is not None
        )
        records = run(gossip, ctx, evaluation, rounds=6, eval_every=3)
        return gossip.parameters.clone(), [r.as_dict() for r in records]

    deferred, deferred_records = trained(True)
    direct, direct_records = trained(False)
    assert torch.equal(deferred, direct)
    np.testing.assert_equal(deferred_records, direct_records)


def test_models_of_an_all_honest_run_are_the_parameters_themselves() -> None:
    ctx, evaluation = make_context(4)
    gossip = SynchronousGossip(DecentralizedSGD(), static("ring", 4))
    run(gossip, ctx, evaluation, rounds=1)
    assert gossip.models(ctx) is gossip.parameters
    ctx, evaluation = make_context(4, byzantine=1)
    gossip = SynchronousGossip(DecentralizedSGD(), static("complete", 4))
    run(gossip, ctx, evaluation, rounds=1)
    assert gossip.models(ctx).shape[0] == 3


def test_a_byzantine_leaf_too_small_for_the_rule_keeps_its_model_and_honest_peers_run() -> None:
    """Only honest receivers must meet the rule's bound: a Byzantine leaf with one neighbour
    (n = 2 < 3 for ``trimmed-mean:b=1``) does not stop the run; it never aggregates, so it
    ends where local SGD alone takes it, and the same graph with that peer honest is refused."""
    import networkx as nx

    graph = nx.complete_graph(5)
    graph.add_edge(0, 5)
    schedule = topologies.Static(topologies.mixing_matrix(graph))

    def gossip() -> SynchronousGossip:
        rule = consensus.build("trimmed-mean:b=1")
        return SynchronousGossip(
            DecentralizedSGD(aggregator=rule), schedule, attack=consensus.build_attack("alie")
        )

    ctx, evaluation = make_context(6, byzantine=1)  # peer 5
    algorithm = gossip()
    records = run(algorithm, ctx, evaluation, rounds=4, eval_every=4)
    assert np.isfinite(records[-1].test_loss)
    alone, _ = make_context(6)
    solo = SynchronousGossip(DecentralizedSGD(), topologies.Static(np.eye(6)))
    run(solo, alone, evaluation, rounds=4, eval_every=4)
    torch.testing.assert_close(algorithm.parameters[5], solo.parameters[5], rtol=0, atol=1e-6)
    assert (algorithm.parameters[0] - solo.parameters[0]).abs().max() > 1e-3
    ctx, evaluation = make_context(6)
    with pytest.raises(ValueError, match=r"aggregator: .*smallest neighbourhood has n = 2"):
        run(gossip(), ctx, evaluation, rounds=1)
