"""Experiment files: validation names the field; the CLI runs real processes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gossipnet.cli import main as gossipnet_main
from sim.build import build
from sim.config import (
    AlgorithmConfig,
    ConfigError,
    ExperimentConfig,
    WorkloadConfig,
    experiment_from_dict,
    load_experiment,
)
from sim.metrics import read_jsonl
from sim.runner import run

ROOT = Path(__file__).resolve().parents[2]

SMALL = """
name = "small"
seed = 3
rounds = 6
eval_every = 3

[workload]
dataset = "synthetic:num_samples=300"
peers = 6
batch_size = 8
model = "mlp:hidden=16"

[optimizer]
lr = 0.1
momentum = 0.5

[algorithm]
name = "dpsgd"
topology = "random-regular"
topology_params = {degree = 3, seed = 1}
aggregator = "trimmed-mean:b=1"

[network]
latency = 1e-3
bandwidth = 1e8
stragglers = {"2" = 4.0}
crashes = [{peer = 1, at = 0.02, rejoin = 0.05}]

[byzantine]
count = 1
attack = "sign-flip"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_a_full_file_loads_builds_and_runs_reproducibly(tmp_path: Path) -> None:
    config = load_experiment(write(tmp_path, SMALL))
    assert config.workload.peers == 6
    assert config.network.stragglers == {2: 4.0}
    assert config.network.crashes[0].rejoin == 0.05
    first = run(*build(config), rounds=config.rounds, eval_every=config.eval_every)
    again = run(*build(config), rounds=config.rounds, eval_every=config.eval_every)
    assert [r.as_dict() for r in first][1:] == [r.as_dict() for r in again][1:]
    assert first[-1].round == 6 and first[-1].time > 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"round": 3}, "round: unknown key; allowed: name, seed, rounds"),
        (
            {"workload": {"peer": 3}},
            r"workload.peer: unknown key in \[workload\]; allowed: dataset, ",
        ),
        ({"workload": {"peers": 0}}, "workload.peers: must be an integer >= 1"),
        ({"algorithm": {"name": "gossip"}}, "algorithm.name: got 'gossip'; allowed: centralized"),
        ({"algorithm": {"order": "cta"}}, "algorithm.order: must be one of combine-then-adapt"),
        ({"optimizer": {"name": "lbfgs"}}, "optimizer.name: got 'lbfgs'; allowed: sgd, adam"),
        ({"network": {"bandwidth": 0}}, r"network.bandwidth: must be in \(0"),
        (
            {"network": {"compute_distribution": "x"}},
            "network.compute_distribution: got .x.; allowed: constant",
        ),
        ({"network": {"crashes": [{"peer": 1}]}}, r"network.crashes\[0\]: needs keys peer, at"),
        ({"network": {"stragglers": {"40": 2.0}}}, "network.stragglers: peer 40 is outside"),
        ({"network": {"stragglers": {"0-40": 2.0}}}, "network.stragglers: peer 16 is outside"),
        ({"network": {"stragglers": {"1-x": 2.0}}}, "network.stragglers: keys must be peer"),
        (
            {"network": {"stragglers": {"0-3": 2.0, "3": 4.0}}},
            "network.stragglers: peer 3 is given twice",
        ),
        ({"byzantine": {"count": 16}}, "byzantine.count: must be < workload.peers = 16"),
        (
            {"byzantine": {"count": 1}, "algorithm": {"name": "allreduce"}},
            "byzantine.count: Byzantine peers are simulated for synchronous gossip",
        ),
        ({"workload": "x"}, r"workload: must be a table \[workload\]"),
        (
            {"workload": {"peers": 3}, "network": {"latency": [1e-3, 1e-3]}},
            r"network.latency: needs one value per peer \(3\), got 2",
        ),
        ({"network": {"bandwidth": [1e9, -1.0]}}, r"network.bandwidth\[1\]: must be in \(0"),
        ({"network": {"links": [{"source": 0, "target": 1}]}}, r"network.links\[0\]: needs"),
        (
            {"network": {"links": [{"source": 0, "target": 99, "latency": 0.1, "bandwidth": 1}]}},
            "network.links: link 0 -> 99 is outside peers",
        ),
    ],
)
def test_bad_fields_are_named_with_the_allowed_values(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        experiment_from_dict(data)


def test_stragglers_take_ranges_of_peers_as_groups_do() -> None:
    config = experiment_from_dict({"network": {"stragglers": {"0-2": 4.0, "5, 7": 2.0}}})
    assert config.network.stragglers == {0: 4.0, 1: 4.0, 2: 4.0, 5: 2.0, 7: 2.0}


def test_bad_specs_fail_naming_the_field() -> None:
    # algorithm settings are refused at construction (gossip.GossipConfig), data sets at build
    with pytest.raises(ConfigError, match=r"algorithm\.aggregator: .*no-such-rule"):
        AlgorithmConfig(aggregator="no-such-rule")
    with pytest.raises(ConfigError, match=r"workload\.dataset"):
        build(ExperimentConfig(workload=WorkloadConfig(dataset="imagenet", peers=4)))


def exit_code(argv: list[str]) -> int:
    """``gossipnet ARGV`` run in this process: the exit code it returns or exits with."""
    try:
        return gossipnet_main(argv)
    except SystemExit as exit:
        assert isinstance(exit.code, int)
        return exit.code


def gossipnet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gossipnet", "sim", *args],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=cwd,
    )


def test_cli_run_writes_jsonl_and_csv(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL)
    result = gossipnet(
        "run",
        str(path),
        "--quiet",
        "--rounds",
        "4",
        "--jsonl",
        "out.jsonl",
        "--csv",
        "out.csv",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "dpsgd" in result.stdout and "accuracy" in result.stdout
    records = read_jsonl(tmp_path / "out.jsonl")
    assert [r.round for r in records] == [0, 3, 4]
    assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])["train_loss"] is None
    assert (tmp_path / "out.csv").read_text().splitlines()[0].startswith("algorithm,round,time")


def test_cli_compare_draws_one_figure_for_several_algorithms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the command's entry point in this process (``sim compare`` runs as a real
    process in tests/sim/test_sweep.py)."""
    text = SMALL.replace("count = 1", "count = 0")
    path = write(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    argv = ["sim", "compare", str(path), "--quiet", "--rounds", "3", "--algorithms",
            "dpsgd,allreduce", "--plot", "cmp.png", "--jsonl", "cmp.jsonl"]  # fmt: skip
    assert exit_code(argv) == 0
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    names = {r.algorithm for r in read_jsonl(tmp_path / "cmp.jsonl")}
    assert names == {"dpsgd", "allreduce"}


def test_cli_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first case in a real process; the others through the same entry point in-process
    (``gossipnet.cli.main``), which saves a Python start-up each."""
    path = write(tmp_path, SMALL.replace("peers = 6", "peers = -1"))
    result = gossipnet("run", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "workload.peers: must be an integer >= 1" in result.stderr
    assert "Traceback" not in result.stderr
    monkeypatch.chdir(tmp_path)
    assert exit_code(["sim", "compare", str(path), "--algorithms", "nope"]) == 2
    capsys.readouterr()
    assert exit_code(["sim", "run", str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_per_peer_links_and_link_overrides_slow_the_ring_down() -> None:
    def round_time(network: dict) -> float:
        config = experiment_from_dict(
            {
                "rounds": 2,
                "eval_every": 2,
                "workload": {
                    "dataset": "synthetic:num_samples=200",
                    "peers": 4,
                    "model": "logistic",
                },
                "algorithm": {"name": "allreduce"},
                "network": network,
            }
        )
        return run(*build(config), rounds=2, eval_every=2)[-1].time

    uniform = round_time({"latency": 1e-4})
    per_peer = round_time({"latency": [1e-4, 1e-4, 1e-2, 1e-4]})
    override = round_time(
        {"links": [{"source": 1, "target": 2, "latency": 1e-1, "bandwidth": 1e9}]}
    )
    # ring all-reduce: 2(p-1) = 6 latency terms per round, each the worst ring link
    assert per_peer - uniform == pytest.approx(2 * 6 * (1e-2 - 1e-4))
    assert override - uniform == pytest.approx(2 * 6 * (1e-1 - 1e-4), rel=1e-3)


def test_each_graph_gets_its_natural_weights_so_the_directed_exponential_graph_runs() -> None:
    config = ExperimentConfig(
        rounds=2,
        eval_every=1,
        workload=WorkloadConfig(dataset="synthetic:num_samples=200", peers=8, model="logistic"),
        algorithm=AlgorithmConfig(name="push-sum", topology="exponential"),
    )
    assert config.algorithm.weights is None
    algorithm, ctx, evaluation = build(config)
    records = run(algorithm, ctx, evaluation, rounds=2, eval_every=1)
    assert records[-1].round == 2
    # column-stochastic uniform weights 1/(1 + ceil(log2 8)) = 1/4 on the directed graph
    table = algorithm.schedule.neighbour_table(0)  # type: ignore[attr-defined]
    assert table.weight[table.mask] == pytest.approx(0.25)
    explicit = dataclasses.replace(
        config, algorithm=dataclasses.replace(config.algorithm, weights="metropolis")
    )
    with pytest.raises(ConfigError, match=r"algorithm\.weights: .*needs an undirected graph"):
        build(explicit)


def test_mnist1d_is_generated_once_into_the_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOSSIPNET_CACHE", str(tmp_path / "env-cache"))
    spec = "mnist1d:num_samples=200"
    config = ExperimentConfig(
        rounds=0, workload=WorkloadConfig(dataset=spec, peers=2, model="logistic")
    )
    build(config)
    cached = list((tmp_path / "env-cache").glob("mnist1d-*.npz"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    build(config)  # a cache hit: the file is read, not rewritten
    assert cached[0].stat().st_mtime_ns == stamp
    own = dataclasses.replace(
        config, workload=dataclasses.replace(config.workload, cache_dir=str(tmp_path / "own"))
    )
    build(own)
    assert len(list((tmp_path / "own").glob("mnist1d-*.npz"))) == 1
    with pytest.raises(ConfigError, match=r"workload\.cache_dir"):
        WorkloadConfig(cache_dir="")


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        # issue 15: fields the simulator used to accept and silently drop
        ({"name": "ad-psgd", "aggregator": "trimmed-mean:b=1"}, "algorithm.aggregator: .*2 models"),
        ({"name": "ad-psgd", "compressor": "topk:ratio=0.1"}, "algorithm.compressor: topk drops"),
        ({"name": "ad-psgd", "local_steps": 4}, "algorithm.local_steps: ad-psgd is always"),
        ({"name": "ad-psgd", "order": "adapt-then-combine"}, "algorithm.order: ad-psgd is always"),
        ({"name": "push-sum", "aggregator": "median"}, "algorithm.aggregator: is not used by"),
        ({"name": "choco", "aggregator": "median"}, "algorithm.aggregator: is not used by"),
        ({"name": "choco", "order": "combine-then-adapt"}, "algorithm.order: choco is always"),
        ({"name": "allreduce", "topology": "ring"}, "algorithm.topology: is not used by"),
        ({"name": "fedavg", "alpha": 0.1}, "algorithm.alpha: is not used by fedavg"),
        ({"name": "dpsgd", "fraction": 0.5}, "algorithm.fraction: is not used by dpsgd"),
        ({"name": "dpsgd", "schedule": "random-matching"}, "algorithm.schedule: .*topology"),
    ],
)
def test_a_key_the_algorithm_does_not_read_is_refused(algorithm: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        experiment_from_dict({"algorithm": algorithm})


@pytest.mark.parametrize(
    ("topology", "message"),
    [
        ("random-k-out:k=2,seed=3", None),
        ("random-k-out:seed=3", None),
        ("one-peer-exponential:bogus=1", "algorithm.topology: .*bogus"),
        ("ring:degree=3", "algorithm.topology: .*degree"),
    ],
)
def test_topology_specs_use_the_one_grammar(topology: str, message: str | None) -> None:
    config = ExperimentConfig(
        rounds=1,
        workload=WorkloadConfig(dataset="synthetic:num_samples=200", peers=6, model="logistic"),
        algorithm=AlgorithmConfig(topology=topology),
    )
    if message is None:
        algorithm, _, _ = build(config)
        schedule = algorithm.schedule  # type: ignore[attr-defined]
        expected = 2 if "k=2" in topology else 1
        assert schedule.k == expected and schedule.seed == 3
    else:
        with pytest.raises(ConfigError, match=message):
            build(config)


def test_a_robust_rule_the_topology_cannot_feed_is_refused_before_any_data() -> None:
    config = ExperimentConfig(
        workload=WorkloadConfig(dataset="no-such-dataset", peers=8),
        algorithm=AlgorithmConfig(topology="ring", aggregator="krum:f=1"),
    )
    # the topology check comes first: the data set is never looked at
    with pytest.raises(ConfigError, match=r"algorithm\.aggregator: krum:f=1 cannot run.*ring"):
        build(config)


def test_compare_keeps_only_the_keys_each_algorithm_reads() -> None:
    config = experiment_from_dict(
        {"algorithm": {"name": "dpsgd", "topology": "torus", "aggregator": "median"}}
    )
    assert config.with_algorithm("allreduce").algorithm == AlgorithmConfig(name="allreduce")
    push_sum = config.with_algorithm("push-sum").algorithm
    assert push_sum.topology == "torus" and push_sum.aggregator is None
    assert push_sum.gossip.order == "adapt-then-combine"  # push-sum's own default
