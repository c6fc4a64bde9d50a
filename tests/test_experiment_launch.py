"""``gossipnet launch EXPERIMENT.toml``: an experiment file's real peers, or one line naming
the key only the simulator runs (exit code 2, before anything starts). The one real launch of
a file is in ``tests/test_predict.py``, which checks its final accuracy against the
simulator's."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gossipnet.cli import main
from gossipnet.experiment_launch import launch_plan
from sim.build import byzantine_mask
from sim.config import load_experiment

BASE = """
seed = 3
rounds = 5
eval_every = 2
[workload]
dataset = "synthetic:num_samples=200"
model = "logistic"
peers = 5
batch_size = 8
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "experiment.toml"
    path.write_text(BASE + text)
    return path


def _flags(plan_flags: list[str]) -> dict[str, list[str]]:
    """``--flag value`` pairs (a repeated flag keeps every value; a bare flag maps to [])."""
    found: dict[str, list[str]] = {}
    for position, token in enumerate(plan_flags):
        if token.startswith("--"):
            following = plan_flags[position + 1 : position + 2]
            value = following if following and not following[0].startswith("--") else []
            found.setdefault(token, []).extend(value)
    return found


def test_the_plan_is_the_files_run_in_launchs_flags(tmp_path: Path) -> None:
    text = """
[optimizer]
name = "sgd"
lr = 0.3
[algorithm]
name = "local-sgd"
topology = "random-regular"
topology_params = {degree = 2, seed = 1}
[network]
latency = [0.01, 0.01, 0.02, 0.01, 0.01]
bandwidth = 1.25e7
message_loss = 0.01
stragglers = {"3-4" = 3.0}
crashes = [{peer = 1, at = 0.5, rejoin = 2.0}, {peer = 2, at = 1.0}]
[byzantine]
count = 1
attack = "sign-flip"
"""
    config = load_experiment(_file(tmp_path, text))
    plan = launch_plan(config)
    flags = _flags(plan.flags)
    assert flags["--peers"] == ["5"] and flags["--seed"] == ["3"]
    assert flags["--steps"] == ["20"]  # 5 rounds x local-sgd's H = 4 local steps
    assert flags["--eval-every"] == ["8"]  # every 2 rounds
    assert flags["--momentum"] == ["0.0"]  # the simulator's default, not a peer's 0.9
    assert flags["--topology"] == ["random-regular:degree=2,seed=1"]
    drawn = [int(i) for i in byzantine_mask(config).nonzero()[0]]  # the simulator's draw
    assert flags["--byzantine"] == ["1:sign-flip"]
    assert flags["--byzantine-peers"] == [",".join(map(str, drawn))]
    per_peer = {
        int(item.split("=", 1)[0]): shlex.split(item.split("=", 1)[1])
        for item in flags["--peer-args-for"]
    }
    assert per_peer[2][:2] == ["--latency", "0.02"] and per_peer[0][:2] == ["--latency", "0.01"]
    assert all("--message-loss" in own and "--bandwidth" in own for own in per_peer.values())
    assert "--latency" not in flags  # per peer, not swarm-wide
    assert flags["--stragglers"] == ["3=3.0,4=3.0"]
    assert flags["--crashes"] == ["1@0.5+1.5,2@1.0"]  # rejoin = AT + DOWN; no rejoin: for good
    assert plan.origins["--peers"] == "workload.peers"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[algorithm]\nname = "allreduce"', "algorithm.name"),
        (
            "[network]\nlinks = [{source = 0, target = 1, latency = 0.1, bandwidth = 1e6}]",
            "network.links",
        ),
        ("[network]\nserver_bandwidth = 1e9", "network.server_bandwidth"),
        ('[network]\ncompute_distribution = "exponential"', "network.compute_distribution"),
        ("[workload2]\n", "workload2"),
    ],
)
def test_what_only_the_simulator_runs_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str
) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(SystemExit) as stopped:
        main(["launch", str(path), "--dir", str(tmp_path / "run")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"gossipnet launch: error: {path}: {key}"), err
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_flag_the_file_sets_is_refused_and_a_mapped_flags_error_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, "")
    with pytest.raises(SystemExit) as stopped:
        main(["launch", str(path), "--peers", "3"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith("gossipnet launch: error: --peers: the experiment")
    one_peer = tmp_path / "one.toml"
    one_peer.write_text(BASE.replace("peers = 5", "peers = 1"))
    with pytest.raises(SystemExit):
        main(["launch", str(one_peer)])
    err = capsys.readouterr().err
    assert err.startswith("gossipnet launch: error: workload.peers (--peers): must be"), err
    faster = tmp_path / "faster.toml"
    faster.write_text(BASE + '[network]\nstragglers = {"1" = 0.5}\n')  # the simulator takes it
    with pytest.raises(SystemExit):
        main(["launch", str(faster)])
    err = capsys.readouterr().err
    assert err.startswith("gossipnet launch: error: network.stragglers (--stragglers):"), err


def test_a_label_sets_table_becomes_the_peers_spec_with_the_same_shards(tmp_path: Path) -> None:
    import torch

    from workloads import load_dataset, partition
    from workloads.partition import label_sets

    path = tmp_path / "experiment.toml"
    path.write_text(
        BASE
        + 'partition = "label-sets"\nlabel_sets = {left = "0-4", right = "5-9"}\n'
        + '[groups]\nleft = "0-1"\nright = "2-4"\n'
    )
    config = load_experiment(path)
    flags = _flags(launch_plan(config).flags)
    low, high = "0+1+2+3+4", "5+6+7+8+9"
    assert flags["--partition"] == [f"label-sets:sets={low}|{low}|{high}|{high}|{high}"]
    labels = load_dataset(config.workload.dataset).y_train
    simulated = label_sets(labels, 5, config.peer_labels(), seed=config.seed)  # sim.build's
    real = partition(flags["--partition"][0], labels, 5, seed=config.seed)  # a peer's
    assert all(torch.equal(a, b) for a, b in zip(simulated, real, strict=True))
