"""Parity of the outer-optimizer family (gossip.outer): the simulator and N real peers on
loopback end R outer steps with the same parameters (the tolerance of test_parity.py)."""

from __future__ import annotations

import pytest

from gossip.configuration import GossipConfig, build_algorithm

from .harness import Problem, RunResult, max_abs_difference, run_simulator
from .test_parity import ATOL, LOCAL_STEPS, ROUNDS, _assert_parity, _both_runners

CASES = {
    "gossip-DiLoCo on a ring, AdamW inside, outer Nesterov": (
        Problem(topology="ring", optimizer_name="adamw", lr=0.01),
        {"algorithm": "diloco"},
    ),
    "NoLoCo on random matchings of 5 (one left out each step)": (
        Problem(n=5, topology="random-matching", optimizer_name="adamw", lr=0.01),
        {"algorithm": "noloco", "consensus_step": 0.4},
    ),
    # a ring, not the paper's complete graph, where every node ends equal and a comparison
    # of rows could not tell one node's error buffer from another's
    "SparseLoCo with chunked top-k at 2 bits and error feedback on a ring": (
        Problem(topology="ring"),
        {
            "algorithm": "sparseloco",
            "compressor": "chunked-topk:chunk=16,k=4,bits=2",
            "error_feedback": 0.9,
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_outer_family_peers_match_the_simulator(case: str) -> None:
    problem, settings = CASES[case]
    settings = {**settings, "local_steps": LOCAL_STEPS}
    rule = build_algorithm(GossipConfig(**settings))
    simulated, networked = await _both_runners(
        problem, rule, steps_per_round=LOCAL_STEPS, **settings
    )
    _assert_parity(simulated, networked, case)


async def test_robust_diloco_with_one_byzantine_peer_matches_the_simulator() -> None:
    """Gossip-DiLoCo mixing with trimmed-mean and one sign-flip peer: the honest peers of
    both runners end alike, and the attack did reach them."""
    problem = Problem(topology="ring", optimizer_name="adamw", lr=0.01)
    settings = {"algorithm": "diloco", "aggregator": "trimmed-mean:b=1", "local_steps": LOCAL_STEPS}
    rule = build_algorithm(GossipConfig(**settings))
    simulated, networked = await _both_runners(
        problem,
        rule,
        steps_per_round=LOCAL_STEPS,
        byzantine=[1],
        attack="sign-flip",
        **settings,
    )
    honest = [0, 2, 3]
    _assert_parity(
        RunResult(simulated.initial[honest], simulated.final[honest], []),
        RunResult(networked.initial[honest], networked.final[honest], []),
        "robust gossip-DiLoCo with a sign-flip peer",
    )
    clean = run_simulator(problem, build_algorithm(GossipConfig(**settings)), ROUNDS)
    assert max_abs_difference(clean.final[honest], simulated.final[honest]) > 100 * ATOL
