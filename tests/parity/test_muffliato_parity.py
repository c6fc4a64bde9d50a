"""Parity of Muffliato's K gossip steps: after R rounds of D-PSGD with ``gossip_steps = 3``
(one local step, then ``x <- W x`` three times, three exchanges with their own round ids in
a peer), N real peers on loopback hold the simulator's rows."""

from __future__ import annotations

import pytest

from gossip.algorithms import DecentralizedSGD, Order

from .harness import Problem, run_simulator
from .test_parity import ROUNDS, _assert_parity, _both_runners

K = 3


@pytest.mark.parametrize("order", ["adapt-then-combine", "combine-then-adapt"])
async def test_dpsgd_with_three_gossip_steps_matches_the_simulator(order: Order) -> None:
    rule = DecentralizedSGD(order=order, gossip_steps=K)
    assert rule.plan.phases().count("exchange") == K
    simulated, networked = await _both_runners(
        Problem(), rule, algorithm="dpsgd", order=order, gossip_steps=K
    )
    _assert_parity(simulated, networked, f"D-PSGD {order} with {K} gossip steps")
    # the K steps are not one: the same run with K = 1 ends elsewhere
    single = run_simulator(Problem(), DecentralizedSGD(order=order), ROUNDS)
    assert (single.final - simulated.final).abs().max() > 1e-3
