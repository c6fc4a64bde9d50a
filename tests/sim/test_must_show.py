"""What the simulator must show on a real data set (MNIST-1D, generated locally).

- D-PSGD over 16 peers on a ring ends within a few points of centralized SGD that sees the
  same samples per round;
- with 20% Byzantine peers sending sign-flipped models, plain gossip averaging collapses to
  chance while a robust rule (coordinate-wise trimmed mean) keeps learning.
"""

from __future__ import annotations

import pytest

from sim.algorithms import OptimizerConfig
from sim.config import (
    AlgorithmConfig,
    ByzantineConfig,
    ExperimentConfig,
    WorkloadConfig,
    build,
)
from sim.runner import run

pytestmark = pytest.mark.slow

ROUNDS = 150


def final_accuracy(
    algorithm: AlgorithmConfig, peers: int, byzantine: ByzantineConfig | None = None
) -> float:
    config = ExperimentConfig(
        rounds=ROUNDS,
        eval_every=ROUNDS,
        workload=WorkloadConfig(dataset="mnist1d", peers=peers, batch_size=32, model="mlp"),
        optimizer=OptimizerConfig(lr=0.1, momentum=0.9),
        algorithm=algorithm,
        byzantine=byzantine or ByzantineConfig(),
    )
    algorithm_object, ctx, evaluation = build(config)
    records = run(algorithm_object, ctx, evaluation, rounds=ROUNDS, eval_every=ROUNDS)
    return records[-1].test_accuracy


def test_dpsgd_on_a_ring_of_16_is_within_a_few_points_of_centralized() -> None:
    centralized = final_accuracy(AlgorithmConfig(name="centralized"), 16)
    dpsgd = final_accuracy(AlgorithmConfig(name="dpsgd", topology="ring"), 16)
    assert centralized > 0.45  # far above chance (0.1)
    assert dpsgd > centralized - 0.05


def test_twenty_percent_sign_flip_breaks_averaging_but_not_trimmed_mean() -> None:
    byzantine = ByzantineConfig(count=4, attack="sign-flip")

    def gossip(aggregator: str) -> AlgorithmConfig:
        return AlgorithmConfig(
            name="dpsgd",
            topology="random-regular",
            topology_params={"degree": 8, "seed": 0},
            aggregator=aggregator,
        )

    averaging = final_accuracy(gossip("mean"), 20, byzantine)
    robust = final_accuracy(gossip("trimmed-mean:b=4"), 20, byzantine)
    assert averaging < 0.15
    assert robust > 0.4
