"""The outer-optimizer family in the simulator: the all-reduce form of DiLoCo, crashed peers
keeping their outer state, and an experiment file that compares the family."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gossip.outer import DiLoCo
from sim.gossip_runner import SynchronousGossip
from sim.network import Crash, Failures
from sim.outer_allreduce import OuterAllReduce
from tests.parity.harness import Problem, simulator_context
from topologies.schedules import Static

H = 3


def _run(runner, ctx, rounds):
    runner.setup(ctx)
    reports = []
    for _ in range(rounds):
        reports.append(runner.round(ctx))
        ctx.time += reports[-1].time
        ctx.round += 1
    return reports


def test_allreduce_diloco_gives_the_models_of_diloco_on_the_complete_graph_for_fewer_bytes():
    problem = Problem(n=4, optimizer_name="adamw", lr=0.01)
    n = problem.n
    complete = Static(np.full((n, n), 1.0 / n))
    rule = dict(local_steps=H, outer_optimizer="sgd:lr=0.7,momentum=0.9,nesterov=true")
    gossip_ctx, allreduce_ctx = simulator_context(problem), simulator_context(problem)
    gossip = _run(SynchronousGossip(DiLoCo(**rule), complete), gossip_ctx, 3)
    allreduce = _run(OuterAllReduce(DiLoCo(**rule), n), allreduce_ctx, 3)
    torch.testing.assert_close(
        allreduce_ctx.peers.params, gossip_ctx.peers.params, rtol=1e-5, atol=1e-6
    )
    assert not torch.equal(allreduce_ctx.peers.params, simulator_context(problem).peers.params)
    model = gossip_ctx.model_bytes
    assert allreduce[0].bytes_sent.sum() == n * 2 * (n - 1) / n * model
    assert gossip[0].bytes_sent.sum() > n * (n - 1) * model  # every message to every peer
    assert allreduce[0].steps == gossip[0].steps == n * H


def test_a_crashed_peer_keeps_its_slow_weights_and_outer_momentum():
    problem = Problem(n=4)
    ctx = simulator_context(problem)
    ctx = dataclasses.replace(ctx, failures=Failures(4, crashes=(Crash(peer=2, at=0.0),)))
    runner = SynchronousGossip(DiLoCo(local_steps=H), problem.schedule())
    runner.setup(ctx)
    start = ctx.peers.params[2].clone()
    for _ in range(3):
        ctx.time += runner.round(ctx).time
        ctx.round += 1
    state = runner.state
    assert torch.equal(ctx.peers.params[2], start) and torch.equal(state.phi[2], start)
    momentum = state.optimizer.state[state.phi]["momentum_buffer"]
    assert float(momentum[2].abs().max()) == 0.0  # never stepped: the state of a fresh node
    assert float(momentum[0].abs().max()) > 0.0
