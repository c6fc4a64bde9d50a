"""The outer-optimizer family (gossip.outer) against the papers' equations, written out here
independently of the rule, batched over nodes and per node."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossip import DecentralizedSGD
from gossip.configuration import ConfigurationError, GossipConfig, build_algorithm
from gossip.outer import DiLoCo, NoLoCo, SparseLoCo, check_outer_optimizer
from topologies import build, mixing_matrix
from topologies.neighbours import neighbour_table
from topologies.schedules import RandomMatching, Static

D = 7


def _inner(x: torch.Tensor, step: int) -> None:
    """H "inner steps" stand-in: a deterministic, node-dependent move of the fast weights."""
    n = x.shape[0]
    g = torch.Generator().manual_seed(1000 + step)
    x.add_(torch.randn(n, x.shape[1], generator=g) * 0.1 - 0.05 * x)


def _tables(schedule, t):
    table = schedule.neighbour_table(t)
    index = torch.as_tensor(table.index, dtype=torch.long)
    weight = torch.as_tensor(table.weight, dtype=torch.float32)
    mask = torch.as_tensor(table.mask)
    return index, weight, mask


def _run(algorithm, schedule, x, rounds):
    state = algorithm.init(x)
    for t in range(rounds):
        _inner(x, t)
        message = algorithm.message(state)
        index, weight, mask = _tables(schedule, t)
        received = message[index.clamp(min=0)]
        algorithm.combine(state, message, received, weight, mask)
    return state


def _complete(n):
    return Static(np.full((n, n), 1.0 / n))


def test_diloco_on_the_complete_graph_is_the_exact_mean_pseudo_gradient_with_outer_nesterov():
    n, rounds = 5, 4
    start = torch.randn(1, D).repeat(n, 1)
    x = start.clone()
    _run(DiLoCo(local_steps=3), _complete(n), x, rounds)
    # the paper: one model phi; every worker starts at phi, Delta_i = phi - theta_i, outer
    # Nesterov SGD (lr 0.7, momentum 0.9) on the mean Delta; here with torch's SGD on one copy
    phi = start[0].clone()
    reference = torch.optim.SGD([phi], lr=0.7, momentum=0.9, nesterov=True)
    for t in range(rounds):
        theta = phi.expand(n, D).clone()
        _inner(theta, t)
        phi.grad = (phi - theta).mean(0)
        reference.step()
    torch.testing.assert_close(x, phi.expand(n, D), rtol=1e-5, atol=1e-6)


def test_outer_sgd_with_lr_1_and_no_momentum_is_local_sgd_on_any_topology():
    n = 6
    schedule = Static(mixing_matrix(build("ring", n)))
    x0 = torch.randn(n, D)
    x_outer, x_local = x0.clone(), x0.clone()
    _run(DiLoCo(local_steps=2, outer_optimizer="sgd:lr=1"), schedule, x_outer, 5)
    _run(DecentralizedSGD(order="adapt-then-combine", local_steps=2), schedule, x_local, 5)
    torch.testing.assert_close(x_outer, x_local, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [6, 7])
def test_noloco_follows_the_papers_update_with_pairs_from_the_seed(n):
    rounds, beta, gamma, mu = 5, 0.7, 0.4, 0.5
    schedule = RandomMatching(n, seed=3)
    x = torch.randn(n, D)
    start = x.clone()
    algorithm = NoLoCo(
        local_steps=2, outer_optimizer=f"sgd:lr={beta},momentum={mu}", consensus_step=gamma
    )
    _run(algorithm, schedule, x, rounds)
    # m <- mu m - beta mean(Delta) + gamma (mean(phi) - phi_i), phi <- phi + m, over each pair
    phi, m = start.clone(), torch.zeros(n, D)
    for t in range(rounds):
        theta = phi.clone()
        _inner(theta, t)
        delta = phi - theta
        group = {i: [i] for i in range(n)}
        for a, b in schedule.pairs(t):
            group[int(a)] = group[int(b)] = [int(a), int(b)]
        mean_delta = torch.stack([delta[group[i]].mean(0) for i in range(n)])
        mean_phi = torch.stack([phi[group[i]].mean(0) for i in range(n)])
        m = mu * m - beta * mean_delta + gamma * (mean_phi - phi)
        phi = phi + m
    torch.testing.assert_close(x, phi, rtol=1e-4, atol=1e-5)


def test_diloco_with_noloco_sgd_is_noloco_with_gamma_equal_to_beta_at_half_the_bytes():
    n = 8
    schedule = RandomMatching(n, seed=1)
    x0 = torch.randn(n, D)
    a, b = x0.clone(), x0.clone()
    _run(DiLoCo(local_steps=2, outer_optimizer="sgd:lr=0.6,momentum=0.5"), schedule, a, 4)
    noloco = NoLoCo(local_steps=2, outer_optimizer="sgd:lr=0.6,momentum=0.5", consensus_step=0.6)
    _run(noloco, schedule, b, 4)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert noloco.message_size(D) == 2 * DiLoCo(local_steps=1).message_size(D)


def test_sparseloco_keeps_what_it_did_not_send_and_steps_on_the_mean_sent():
    n, beta = 4, 0.9
    schedule = _complete(n)
    x = torch.randn(1, D).repeat(n, 1)
    algorithm = SparseLoCo(local_steps=1, error_feedback=beta, outer_optimizer="sgd:lr=1")
    state = algorithm.init(x)
    error = torch.zeros(n, D)
    phi = x.clone()
    for t in range(3):
        _inner(x, t)
        message = algorithm.message(state)
        expected = beta * error + (phi - x)
        torch.testing.assert_close(message, expected)
        # a lossy "codec": keep the 3 largest magnitudes of each row
        top = message.abs().topk(3, dim=1).indices
        sent = torch.zeros_like(message).scatter(1, top, message.gather(1, top))
        index, weight, mask = _tables(schedule, t)
        algorithm.combine(state, sent, sent[index], weight, mask)
        error = expected - sent
        phi = phi - sent.mean(0)
        torch.testing.assert_close(state.error, error)
        torch.testing.assert_close(x, phi, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [lambda: DiLoCo(local_steps=2), lambda: NoLoCo(local_steps=2)])
def test_batched_over_nodes_equals_each_node_alone(make):
    n = 4
    schedule = RandomMatching(n, seed=0)
    x = torch.randn(n, D)
    singles = [x[i].clone() for i in range(n)]
    batched = make()
    state = batched.init(x)
    alone = [make() for _ in range(n)]
    states = [rule.init(v) for rule, v in zip(alone, singles, strict=True)]
    for t in range(3):
        _inner(x, t)
        for i in range(n):
            singles[i].copy_(x[i])
        message = batched.message(state)
        own = [rule.message(s).clone() for rule, s in zip(alone, states, strict=True)]
        index, weight, mask = _tables(schedule, t)
        batched.combine(state, message, message[index.clamp(min=0)], weight, mask)
        for i in range(n):
            received = torch.stack([own[j] for j in index[i].clamp(min=0).tolist()])
            alone[i].combine(states[i], own[i], received, weight[i], mask[i])
        for i in range(n):
            torch.testing.assert_close(singles[i], x[i], rtol=1e-6, atol=1e-6)


def test_the_outer_state_survives_a_checkpoint_round_trip():
    algorithm = DiLoCo(local_steps=1, outer_optimizer="adamw:lr=0.01")
    x = torch.randn(D)
    state = algorithm.init(x)
    x.add_(1.0)
    algorithm.combine(state, algorithm.message(state), torch.empty(0, D), torch.empty(0))
    saved = {key: value.clone() for key, value in state.tensors().items()}
    assert {"phi", "outer.exp_avg", "outer.exp_avg_sq", "outer.step"} <= set(saved)
    fresh_x = x.clone()
    fresh = algorithm.init(fresh_x)
    fresh.load(saved)
    for key, value in fresh.tensors().items():
        torch.testing.assert_close(value, saved[key])
    with pytest.raises(ValueError, match="phi has shape"):
        fresh.load({"phi": torch.zeros(D + 1)})


def test_settings_of_the_family_are_validated_with_the_field_named():
    config = GossipConfig("noloco")
    assert config.given()["consensus_step"] == 0.7
    assert config.outer_optimizer == "sgd:lr=0.7,momentum=0.5"
    assert isinstance(build_algorithm(GossipConfig("sparseloco")), SparseLoCo)
    bad = [
        (dict(algorithm="noloco", outer_optimizer="adam"), "outer_optimizer", "heavy-ball"),
        (dict(algorithm="diloco", outer_optimizer="sgd:lr=0"), "outer_optimizer", "lr"),
        (dict(algorithm="diloco", outer_optimizer="sgd:mom=1"), "outer_optimizer", "unknown"),
        (dict(algorithm="diloco", compressor="topk"), "compressor", "sparseloco"),
        (dict(algorithm="sparseloco", error_feedback=1.0), "error_feedback", r"\[0, 1\)"),
        (dict(algorithm="diloco", local_steps=0), "local_steps", ">= 1"),
        (dict(algorithm="diloco", error_feedback=0.5), "error_feedback", "not used"),
        (dict(algorithm="dpsgd", outer_optimizer="sgd"), "outer_optimizer", "not used"),
    ]
    for settings, field, words in bad:
        with pytest.raises(ConfigurationError, match=words) as caught:
            GossipConfig(**settings)
        assert caught.value.field == field
    assert check_outer_optimizer("adamw")[1]["weight_decay"] == 0.01


def test_noloco_needs_a_topology_and_a_node_the_matching_leaves_out_still_steps():
    assert GossipConfig("noloco").needs_topology
    table = neighbour_table(RandomMatching(5, seed=0).mixing(0), width=1)
    alone = int(np.flatnonzero(~np.asarray(table.mask)[:, 0])[0])
    x = torch.zeros(5, D)
    algorithm = NoLoCo(local_steps=1)
    state = algorithm.init(x)
    x.add_(1.0)  # every node moved by +1: Delta = -1
    index = torch.as_tensor(table.index).clamp(min=0)
    message = algorithm.message(state)
    algorithm.combine(
        state,
        message,
        message[index],
        torch.as_tensor(table.weight, dtype=torch.float32),
        torch.as_tensor(table.mask),
    )
    # alone: m = -beta * Delta = +0.7, so phi = theta = 0.7
    torch.testing.assert_close(x[alone], torch.full((D,), 0.7))


def test_sparseloco_names_the_topologies_it_drifts_on_and_no_other_rule_does() -> None:
    sparse = GossipConfig("sparseloco")
    assert sparse.topology_caveat("complete") is None
    assert sparse.topology_caveat(None) is None  # a sync peer mixes every member
    for topology in ("ring", "random-regular:degree=4"):
        caveat = sparse.topology_caveat(topology)
        assert caveat is not None and caveat.startswith(f"sparseloco on topology {topology!r}: ")
    assert GossipConfig("diloco").topology_caveat("ring") is None
