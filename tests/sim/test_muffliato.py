"""Noisy gossip in the simulator: ``gossip_steps`` K (K exchanges per round, each counted)
and ``[privacy] pair`` (epsilon of u's data against v's view in the records), with the
refusals of both as one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gossip.configuration import GossipConfig
from gossip.settings import ConfigurationError
from peer.app.cli import parse_peer_args
from sim.build import build
from sim.config import ConfigError, experiment_from_dict
from sim.metrics import Record, columns
from sim.runner import run
from topologies import build as build_graph
from topologies import mixing_matrix
from workloads.network_privacy import muffliato_coefficient, pair_epsilon, view_coefficient


def experiment(tmp_path: Path, algorithm: dict[str, object], **privacy: object) -> dict:
    table: dict[str, object] = {
        "seed": 0,
        "rounds": 4,
        "eval_every": 2,
        "workload": {
            "dataset": "synthetic:num_samples=240,seed=0",
            "model": "mlp:hidden=4",
            "peers": 6,
            "batch_size": 8,
            "cache_dir": str(tmp_path),
        },
        "algorithm": {"name": "dpsgd", "topology": "ring", **algorithm},
    }
    if privacy:
        table["privacy"] = {"noise": 1.5, "clip": 1.0, **privacy}
    return table


def test_k_gossip_steps_send_k_times_the_bytes_and_take_k_times_the_link_time(
    tmp_path: Path,
) -> None:
    ends = {}
    for k in (1, 3):
        config = experiment_from_dict(experiment(tmp_path, {"gossip_steps": k}))
        algorithm, ctx, evaluation = build(config)
        ends[k] = run(algorithm, ctx, evaluation, rounds=2, eval_every=2)[-1]
    assert ends[3].bytes_total == pytest.approx(3 * ends[1].bytes_total, rel=1e-3)
    assert ends[3].time > ends[1].time
    assert ends[3].consensus_distance < ends[1].consensus_distance
    assert ends[3].steps == ends[1].steps  # one local step per round either way


def test_records_carry_the_pair_epsilon_of_the_account(tmp_path: Path) -> None:
    config = experiment_from_dict(
        experiment(tmp_path, {"gossip_steps": 2, "order": "adapt-then-combine"}, pair=[0, 3])
    )
    algorithm, ctx, evaluation = build(config)
    records = run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=2)
    w = mixing_matrix(build_graph("ring", 6)).toarray()
    for record in records[1:]:
        view = view_coefficient(w, 0, 3, rounds=record.round, gossip_steps=2)
        paper = muffliato_coefficient(w, 0, 3, rounds=record.round, gossip_steps=2)
        assert record.epsilon_pair == pytest.approx(
            min(record.epsilon, pair_epsilon(view, 1.5, 1e-5))
        )
        assert record.epsilon_pair_muffliato == pytest.approx(
            min(record.epsilon, pair_epsilon(paper, 1.5, 1e-5))
        )
        assert 0 < record.epsilon_pair < record.epsilon  # distance 3: below the local epsilon
    assert records[0].epsilon_pair == 0.0
    assert {"epsilon_pair", "epsilon_pair_muffliato"} <= set(columns(records))
    assert Record.from_dict(records[-1].as_dict()) == records[-1]
    assert np.isfinite(records[-1].epsilon_pair)


@pytest.mark.parametrize(
    ("algorithm", "privacy", "message"),
    [
        ({}, {"pair": [0, 6]}, "privacy.pair: nodes are 0..5; got [0, 6]"),
        ({}, {"pair": [2, 2]}, "privacy.pair: u and v must be two different nodes, got [2, 2]"),
        ({}, {"pair": [1]}, "privacy.pair: must be two node indices [u, v], got [1]"),
        ({"compressor": "fp16"}, {"pair": [0, 1]}, "privacy.pair: the pairwise account models"),
        ({"name": "local-sgd"}, {"pair": [0, 1]}, "privacy.pair: the pairwise account models"),
        ({"gossip_steps": 0}, {}, "algorithm.gossip_steps: must be an integer >= 1; got 0"),
        ({"lossy": True}, {"pair": [0, 1]}, "privacy.pair: the pairwise account assumes every"),
        ({"name": "choco", "gossip_steps": 2}, {}, "gossip_steps"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(
    tmp_path: Path, algorithm: dict, privacy: dict, message: str
) -> None:
    table = experiment(tmp_path, {k: v for k, v in algorithm.items() if k != "lossy"}, **privacy)
    if algorithm.get("lossy"):
        table["network"] = {"message_loss": 0.1}
    with pytest.raises(ConfigError) as info:
        experiment_from_dict(table)
    assert message in str(info.value) and "\n" not in str(info.value)


FLAGS = ["--id", "a", "--peers", "2", "--peer-index", "0", "--algorithm", "dpsgd"]
FLAGS += ["--gossip-steps", "0"]


def test_the_setting_and_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert GossipConfig("dpsgd", gossip_steps=3).gossip_steps == 3
    with pytest.raises(ConfigurationError, match="gossip_steps"):
        GossipConfig("local-sgd", gossip_steps=2)
    with pytest.raises(SystemExit) as exit:
        parse_peer_args(FLAGS)
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--gossip-steps: must be an integer >= 1; got 0" in err and "\n" not in err
