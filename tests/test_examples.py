"""The example experiment files stay valid against the simulator's config schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config import load_experiment

EXPERIMENTS = sorted(
    (Path(__file__).resolve().parents[1] / "examples" / "experiments").glob("*.toml")
)


def test_there_are_example_experiments() -> None:
    assert EXPERIMENTS


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_example_experiment_is_valid(path: Path) -> None:
    config = load_experiment(path)
    assert config.rounds > 0
    assert config.workload.peers >= 2
