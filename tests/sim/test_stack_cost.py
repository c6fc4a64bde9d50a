"""The software stack's cost per message in the time model ([network] stack_latency and
stack_bandwidth, what ``gossipnet sim calibrate`` measures): in series with every link,
and nothing when unset."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sim.build import build
from sim.config import ConfigError, experiment_from_dict
from sim.network import Links
from sim.runner import run


def test_the_stack_adds_its_latency_and_its_throughput_in_series_with_each_link() -> None:
    source, target = np.array([0, 1, 2]), np.array([1, 2, 0])
    wire = Links.uniform(3, latency=[1e-3, 2e-3, 1e-3], bandwidth=1e6)
    stacked = Links.uniform(
        3, latency=[1e-3, 2e-3, 1e-3], bandwidth=1e6, stack_latency=5e-4, stack_bandwidth=4e6
    )
    size = 2e4
    np.testing.assert_allclose(
        stacked.transfer_time(source, target, size),
        wire.transfer_time(source, target, size) + 5e-4 + size / 4e6,
    )
    unset = Links.uniform(3, latency=[1e-3, 2e-3, 1e-3], bandwidth=1e6, stack_latency=0.0)
    assert np.array_equal(unset.link(source, target)[1], wire.link(source, target)[1])
    with pytest.raises(ValueError, match="stack_bandwidth"):
        Links.uniform(3, stack_bandwidth=0.0)


def experiment(**network: Any) -> dict[str, Any]:
    return {
        "rounds": 3,
        "eval_every": 3,
        "workload": {
            "dataset": "synthetic:num_samples=200,test_fraction=0.2,seed=0",
            "model": "logistic",
            "peers": 4,
            "batch_size": 8,
        },
        "algorithm": {"name": "dpsgd", "topology": "ring"},
        "network": {"latency": 1e-3, "bandwidth": 1e7, "step_time": 0.01, **network},
    }


def simulated_time(**network: Any) -> float:
    records = run(*build(experiment_from_dict(experiment(**network))), rounds=3, eval_every=3)
    return records[-1].time


def test_an_experiment_with_a_stack_cost_takes_it_once_per_message() -> None:
    wire = simulated_time()
    # a ring peer sends two messages a round: 3 rounds x 2 x 4 ms more
    assert simulated_time(stack_latency=4e-3) == pytest.approx(wire + 3 * 2 * 4e-3)
    with pytest.raises(ConfigError, match=r"^network.stack_latency: must be in \[0, inf\]"):
        experiment_from_dict(experiment(stack_latency=-1.0))


def test_peers_sharing_a_host_stretch_the_cpu_terms_not_the_wire() -> None:
    """4 peers on 2 cores: step_time and the stack's terms take twice as long; a host with
    as many cores as peers (or more) changes nothing."""
    cpu = {"step_time": 0.01, "stack_latency": 4e-3}
    alone = simulated_time(**cpu)
    doubled = simulated_time(step_time=0.02, stack_latency=8e-3)
    assert simulated_time(**cpu, host_cores=2) == pytest.approx(doubled)
    assert simulated_time(**cpu, host_cores=4) == pytest.approx(alone)
    assert simulated_time(**cpu, host_cores=64) == pytest.approx(alone)
    assert doubled > alone
    with pytest.raises(ConfigError, match=r"^network.host_cores: must be an integer >= 1"):
        experiment_from_dict(experiment(host_cores=0))
