"""AD-PSGD in batched waves equals the events run one by one, in time order."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
import torch
from torch import nn

import consensus
import topologies
from gossip.compression import build_compressor, launch_envelope_bytes
from gossip.pairwise import PairwiseGossip, ad_psgd
from sim.algorithms import Context, OptimizerConfig
from sim.gossip_runner import AsynchronousGossip, conflict_free_waves
from sim.network import ComputeModel, Crash, Event, Failures, Links, asynchronous_gossip_events
from sim.reference import ReferencePeers
from sim.runner import run

from .helpers import make_context


def static(name: str, n: int, **params: object) -> topologies.Static:
    return topologies.Static(topologies.mixing_matrix(topologies.build(name, n, **params)))


# --------------------------------------------------------------------------- waves


@pytest.mark.parametrize("seed", range(20))
def test_waves_are_matchings_that_keep_the_order_of_events_sharing_a_node(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    count = int(rng.integers(1, 3 * n))
    peers = rng.integers(0, n, count)
    partners = np.where(rng.random(count) < 0.2, -1, rng.integers(0, n, count))
    partners = np.where(partners == peers, -1, partners)
    waves = conflict_free_waves(peers.tolist(), partners.tolist(), n)
    wave_of = np.full(count, -1)
    for number, wave in enumerate(waves):
        assert wave == sorted(wave) and wave
        wave_of[wave] = number
        nodes = [int(v) for e in wave for v in (peers[e], partners[e]) if v >= 0]
        assert len(nodes) == len(set(nodes)), "a node twice in one wave"
    assert (wave_of >= 0).all()  # every event once
    assert sum(len(w) for w in waves) == count
    for e in range(count):
        for f in range(e):
            shared = {int(peers[e]), int(partners[e])} & {int(peers[f]), int(partners[f])} - {-1}
            if shared:
                assert wave_of[f] < wave_of[e], "events sharing a node ran out of order"
    # each event is in the earliest wave allowed: it shares a node with the previous one
    for e in range(count):
        if wave_of[e] > 0:
            before = [f for f in range(e) if wave_of[f] == wave_of[e] - 1]
            mine = {int(peers[e]), int(partners[e])} - {-1}
            assert any(mine & {int(peers[f]), int(partners[f])} for f in before)


# --------------------------------------------------------------------------- events


def _events_one_link_at_a_time(
    compute: ComputeModel,
    links: Links,
    index: np.ndarray,
    mask: np.ndarray,
    size: float,
    total: int,
    failures: Failures,
    seed: int,
) -> list[Event]:
    """The discrete-event loop written plainly: one link, one step time at a time."""
    n = compute.n
    rng = np.random.default_rng((seed, 2))
    first = compute.sample(0)
    queue = [(float(first[i]), i, 0) for i in range(n)]
    heapq.heapify(queue)
    events: list[Event] = []
    while len(events) < total and queue:
        time, peer, step = heapq.heappop(queue)
        if not failures.alive(time)[peer]:
            later = [c.rejoin for c in failures.crashes if c.peer == peer and c.rejoin]
            later = [r for r in later if r > time]
            if later:
                heapq.heappush(queue, (min(later), peer, step))
            continue
        choices = index[peer][mask[peer]]
        partner, exchange = -1, 0.0
        if choices.size:
            candidate = int(choices[rng.integers(choices.size)])
            if failures.alive(time)[candidate]:
                partner = candidate
                trip = links.transfer_time(np.array([peer]), np.array([partner]), size)
                exchange = 2 * float(trip[0])
        events.append(Event(time, peer, step, partner))
        following = float(compute.sample(step + 1, np.array([peer]))[0])
        heapq.heappush(queue, (time + exchange + following, peer, step + 1))
    return events


def test_event_stream_equals_the_plain_one_link_at_a_time_loop() -> None:
    n = 9
    table = topologies.neighbour_table(
        topologies.mixing_matrix(topologies.build("random-regular", n, degree=4, seed=3))
    )
    compute = ComputeModel(
        n, step_time=0.01, distribution="exponential", stragglers={2: 5.0}, seed=4
    )
    links = Links.uniform(
        n, latency=np.linspace(1e-4, 1e-3, n), bandwidth=1e8, overrides={(0, 1): (0.01, 1e6)}
    )
    failures = Failures(n, crashes=(Crash(peer=3, at=0.05, rejoin=0.2), Crash(peer=5, at=0.1)))
    index, mask = np.asarray(table.index), np.asarray(table.mask)
    fast = asynchronous_gossip_events(
        compute, links, index, mask, 4000.0, total_steps=400, failures=failures, seed=6
    )
    expected = _events_one_link_at_a_time(compute, links, index, mask, 4000.0, 400, failures, 6)
    assert list(fast) == expected
    assert any(e.partner == -1 for e in expected) and len({e.step for e in expected}) > 20


# --------------------------------------------------------------------------- training


def _reference(
    ctx: Context,
    schedule: topologies.Static,
    initial: torch.Tensor,
    optimizer: OptimizerConfig,
    rounds: int,
    exchange: PairwiseGossip | None,
) -> torch.Tensor:
    """The same events one at a time: peer i's own module and torch optimizer take the
    gradient at x_i on the batch i draws at its step, i and its partner average (plain
    arithmetic, or the shared rule on that one pair), then i's optimizer applies the
    gradient."""
    n = ctx.n
    table = schedule.neighbour_table(0)
    events = asynchronous_gossip_events(
        ctx.compute,
        ctx.links,
        np.asarray(table.index),
        np.asarray(table.mask),
        1.0,  # sizes change the times only through the link terms, which are tiny here
        total_steps=rounds * n,
        failures=ctx.failures,
        seed=ctx.seed,
    )
    options = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay}
    if optimizer.name == "sgd":
        options |= {"momentum": optimizer.momentum, "nesterov": optimizer.nesterov}
    kind = torch.optim.SGD if optimizer.name == "sgd" else torch.optim.Adam
    reference = ReferencePeers(ctx.peers.template, n, lambda p: kind(p, **options), initial=initial)
    for event in events:
        i, j = event.peer, event.partner
        index = ctx.sampler.indices(event.step)[i]
        model = reference.models[i]
        reference.optimizers[i].zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(ctx.x_train[index]), ctx.y_train[index]).backward()
        if j >= 0:
            flat = reference.flat()
            if exchange is None:
                average = (flat[i] + flat[j]) / 2
                reference.load(reference.models[i], average)
                reference.load(reference.models[j], average)
            else:
                exchange.exchange(flat, torch.tensor([[i, j]]))
                reference.load(reference.models[i], flat[i])
                reference.load(reference.models[j], flat[j])
        reference.optimizers[i].step()
    return reference.flat()


@pytest.mark.parametrize(
    "optimizer",
    [
        OptimizerConfig(lr=0.1),
        OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=1e-3),
        OptimizerConfig(lr=0.05, momentum=0.9, nesterov=True),
        OptimizerConfig(name="adam", lr=0.01),
    ],
    ids=["sgd", "momentum", "nesterov", "adam"],
)
def test_batched_waves_equal_the_events_one_by_one(optimizer: OptimizerConfig) -> None:
    """Random step times, a straggler and a crash: peers at different steps, exchanges
    with a down neighbour skipped (partner -1), many waves per round."""
    n, rounds = 10, 6
    compute = ComputeModel(n, distribution="exponential", stragglers={4: 3.0}, seed=1)
    failures = Failures(n, crashes=(Crash(peer=7, at=0.02, rejoin=0.06),))
    schedule = static("random-regular", n, degree=3, seed=2)
    ctx, evaluation = make_context(n, optimizer=optimizer, compute=compute, failures=failures)
    initial = ctx.peers.params.clone()
    algorithm = AsynchronousGossip(schedule)
    records = run(algorithm, ctx, evaluation, rounds=rounds, eval_every=rounds)
    ctx_again, _ = make_context(n, optimizer=optimizer, compute=compute, failures=failures)
    expected = _reference(ctx_again, schedule, initial, optimizer, rounds, exchange=None)
    torch.testing.assert_close(algorithm.parameters, expected, atol=2e-5, rtol=1e-5)
    assert records[-1].steps == rounds * n
    assert (ctx.step_count != ctx.step_count[0]).any()  # peers ran at different speeds
    assert (algorithm.parameters - initial).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("rule", "codec"), [("median", "fp16"), ("clipped-gossip:tau=0.05", "none")]
)
def test_batched_waves_run_the_shared_pairwise_rule(rule: str, codec: str) -> None:
    """A lossy codec and a robust two-input rule: the reference calls the same
    ``PairwiseGossip`` on one pair at a time."""
    n, rounds = 8, 5
    algorithm_rule = ad_psgd(aggregator=consensus.build(rule), compressor=build_compressor(codec))
    schedule = static("ring", n)
    compute = ComputeModel(n, distribution="uniform", spread=0.5, seed=3)
    ctx, evaluation = make_context(n, compute=compute)
    initial = ctx.peers.params.clone()
    algorithm = AsynchronousGossip(schedule, algorithm=algorithm_rule)
    run(algorithm, ctx, evaluation, rounds=rounds, eval_every=rounds)
    ctx_again, _ = make_context(n, compute=compute)
    expected = _reference(
        ctx_again,
        schedule,
        initial,
        ctx.optimizer,
        rounds,
        exchange=PairwiseGossip.of(algorithm_rule),
    )
    # fp16 rounds the kernels' last-bit differences to 2^-11 relative at worst
    torch.testing.assert_close(algorithm.parameters, expected, atol=1e-4, rtol=1e-3)


def test_each_side_of_an_exchange_is_charged_its_envelope_at_that_event() -> None:
    """Bytes equal a per-event count: caller and callee each send one envelope whose
    counters are the sender's steps so far, across the 1-byte/2-byte varint boundary."""
    n, rounds = 6, 4
    compute = ComputeModel(n, distribution="exponential", seed=5)
    ctx, evaluation = make_context(n, compute=compute)
    ctx.step_count[:] = 126  # the counters cross 127 during the run
    algorithm = AsynchronousGossip(static("ring", n))
    records = run(algorithm, ctx, evaluation, rounds=rounds, eval_every=rounds)
    table = static("ring", n).neighbour_table(0)
    payload = algorithm.exchange.message_bytes(ctx.peers.dim)
    events = asynchronous_gossip_events(
        ctx.compute,
        ctx.links,
        np.asarray(table.index),
        np.asarray(table.mask),
        payload,
        total_steps=rounds * n,
        seed=ctx.seed,
    )
    counts = np.full(n, 126, dtype=np.int64)
    sent = np.zeros(n)
    for event in events:
        bodies = launch_envelope_bytes(payload, round=counts, steps=counts, codec="none")
        if event.partner >= 0:
            sent[event.peer] += bodies[event.peer]
            sent[event.partner] += bodies[event.partner]
        counts[event.peer] += 1
    assert records[-1].bytes_total == sent.sum()
    assert records[-1].bytes_busiest == sent.max()
    np.testing.assert_array_equal(ctx.step_count, counts)


def test_the_same_seed_gives_the_same_run() -> None:
    def records() -> list[dict]:
        n = 8
        compute = ComputeModel(n, distribution="lognormal", spread=0.5, seed=2)
        ctx, evaluation = make_context(n, compute=compute)
        algorithm = AsynchronousGossip(
            static("ring", n), algorithm=ad_psgd(compressor=build_compressor("qsgd"))
        )
        return [r.as_dict() for r in run(algorithm, ctx, evaluation, rounds=5, eval_every=1)]

    first = records()
    np.testing.assert_equal(records(), first)
    assert first[-1]["test_accuracy"] > first[0]["test_accuracy"]
