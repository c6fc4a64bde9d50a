"""DP-SGD in the simulator ([privacy]): the batched step is n applications of the shared
mechanism, ε is Opacus' for the run's σ, q and steps, and the budget stops the run."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from sim.batched import BatchedPeers
from sim.build import build
from sim.cli import main as sim_main
from sim.config import ConfigError, experiment_from_dict
from sim.metrics import Record, columns
from sim.privacy import SimPrivacy
from sim.runner import run
from workloads import load_dataset
from workloads.batching import StackedBatchSampler
from workloads.privacy import PrivacyConfig, poisson_batches, private_gradient
from workloads.task import cross_entropy


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(20, 8), nn.Tanh(), nn.Linear(8, 4))


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_the_batched_dp_step_is_n_applications_of_the_shared_mechanism(sampling: str) -> None:
    data = load_dataset("synthetic:num_samples=300,num_classes=4,seed=0")
    parts = [torch.arange(0, 60), torch.arange(60, 100), torch.arange(100, 200)]
    n, batch = len(parts), 8
    peers = BatchedPeers(net, n, init="independent", seed=1)
    config = PrivacyConfig(noise=0.8, clip=0.3, sampling=sampling)
    peers.privacy = privacy = SimPrivacy(config, parts, batch, seed=7, rounds=5)
    sampler = StackedBatchSampler(parts, batch, seed=7)
    streams = [poisson_batches(data, part, batch, seed=7, peer=i) for i, part in enumerate(parts)]
    for step in range(3):
        x, y = privacy.batch(sampler, step, data.x_train, data.y_train)
        losses, grads = peers.gradients(x, y)
        for i in range(n):
            if sampling == "poisson":
                xb, yb = next(streams[i])
            else:
                index = sampler.indices(step)[i]
                xb, yb = data.x_train[index], data.y_train[index]
            expected, loss = private_gradient(
                peers.module(i), cross_entropy, xb, yb, clip=0.3, noise_multiplier=0.8,
                batch_size=batch, seed=7, peer=i, step=step,
            )  # fmt: skip
            assert torch.allclose(grads[i], expected, atol=1e-6, rtol=1e-5), (step, i)
            assert float(losses[i]) == pytest.approx(loss, rel=1e-5)
    assert privacy.ledger.steps == 3


def experiment(tmp_path: Path, **privacy: object) -> dict[str, object]:
    return {
        "seed": 0,
        "rounds": 8,
        "eval_every": 4,
        "workload": {
            "dataset": "synthetic:num_samples=400,seed=0",
            "model": "mlp:hidden=8",
            "peers": 4,
            "batch_size": 8,
            "cache_dir": str(tmp_path),
        },
        "algorithm": {"name": "dpsgd", "topology": "ring"},
        "privacy": privacy,
    }


def test_records_carry_opacus_epsilon_and_the_budget_stops_the_run(tmp_path: Path) -> None:
    from opacus.accountants import RDPAccountant

    config = experiment_from_dict(experiment(tmp_path, noise=1.2, clip=1.0))
    algorithm, ctx, evaluation = build(config)
    # more rounds than the file's (which sized nothing here: sigma is given, no budget)
    records = run(algorithm, ctx, evaluation, rounds=config.rounds + 2, eval_every=4)
    q = 8 / 80  # 400 samples, 80 % for training, 4 equal shards
    assert ctx.privacy is not None and ctx.privacy.sample_rate == pytest.approx(q)
    for record in records:
        reference = RDPAccountant()
        if record.steps:
            reference.history = [(1.2, ctx.privacy.sample_rate, record.round)]
        expected = reference.get_epsilon(1e-5) if record.steps else 0.0
        assert record.epsilon == pytest.approx(expected, rel=1e-9)
        assert record.privacy_stopped_at is None
    assert [r.round for r in records] == [0, 4, 8, 10]
    assert "epsilon" in columns(records)
    assert Record.from_dict(records[-1].as_dict()) == records[-1]
    # a budget: the run ends before the round that would pass it, loudly, and says so
    budget = records[1].epsilon + 1e-9  # reached after 4 rounds, passed at the 5th
    config = experiment_from_dict(experiment(tmp_path, noise=1.2, clip=1.0, epsilon=budget))
    algorithm, ctx, evaluation = build(config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stopped = run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=3)
    lines = [str(w.message) for w in caught if "privacy" in str(w.message)]
    assert len(lines) == 1 and "stopped before round 5" in lines[0] and "budget" in lines[0]
    assert [r.round for r in stopped] == [0, 3, 4]
    assert all(r.privacy_stopped_at == 4 for r in stopped)
    assert stopped[-1].epsilon == pytest.approx(records[1].epsilon)
    # same seed, same run (noise and Poisson batches included)
    assert stopped[-1].test_accuracy == records[1].test_accuracy


def test_a_target_epsilon_picks_sigma_for_the_runs_steps(tmp_path: Path) -> None:
    config = experiment_from_dict(experiment(tmp_path, epsilon=4.0, clip=1.0))
    algorithm, ctx, evaluation = build(config)
    records = run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=4)
    assert records[-1].round == 8 and records[-1].privacy_stopped_at is None
    assert 3.9 <= records[-1].epsilon <= 4.0


@pytest.mark.parametrize(
    ("privacy", "algorithm", "message"),
    [
        ({"noise": 1.0, "clip": -1}, "dpsgd", "privacy.clip: must be > 0, got -1"),
        ({"noise": 1.0}, "dpsgd", "privacy.clip: is required"),
        ({"noise": 1.0, "clip": 1, "nois": 2}, "dpsgd", "privacy.nois: unknown key in [privacy]"),
        ({"noise": 1.0, "clip": 1}, "allreduce", "privacy: DP-SGD runs in the synchronous"),
        ({"noise": 1.0, "clip": 1}, "ad-psgd", "not 'ad-psgd'; remove [privacy]"),
    ],
)
def test_a_bad_privacy_table_is_one_line_naming_the_key(
    tmp_path: Path, privacy: dict[str, object], algorithm: str, message: str
) -> None:
    table = experiment(tmp_path, **privacy)
    table["algorithm"] = {"name": algorithm}
    with pytest.raises(ConfigError) as info:
        experiment_from_dict(table)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sim_run_refuses_a_bad_privacy_table_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "exp.toml"
    path.write_text('[algorithm]\nname = "dpsgd"\n[privacy]\nnoise = 1.0\nclip = 1.0\ndelta = 2\n')
    with pytest.raises(SystemExit) as info:
        sim_main(["run", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "privacy.delta: must be > 0 and < 1, got 2" in err[-1]
    assert list(itertools.islice(err, 0, None))[-1].count("\n") == 0


def test_sim_run_shows_epsilon_and_the_budget_stop_in_its_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(
        'rounds = 6\neval_every = 3\n[workload]\ndataset = "synthetic:num_samples=200"\n'
        'model = "mlp:hidden=4"\npeers = 2\nbatch_size = 8\n[algorithm]\nname = "dpsgd"\n'
        "[privacy]\nnoise = 1.0\nclip = 1.0\nepsilon = 2.5\n"
    )
    with pytest.warns(UserWarning, match="privacy: stopped before round"):
        assert sim_main(["run", str(path), "--quiet", "--csv", str(tmp_path / "r.csv")]) == 0
    out = capsys.readouterr().out
    assert "epsilon" in out and "(budget)" in out
    header = (tmp_path / "r.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["epsilon", "privacy_stopped_at"]
