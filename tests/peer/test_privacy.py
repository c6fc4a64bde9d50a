"""DP-SGD in a networked peer (--dp-*): the trainer's private gradient is the simulator's row,
the budget stops a real peer loudly, ε is Opacus' in status, metrics and launch's table, and
bad flags are one line with exit 2."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.node.privacy import PrivateTraining
from peer.node.trainer import Trainer
from sim.batched import BatchedPeers
from sim.privacy import SimPrivacy
from workloads import load_dataset
from workloads.batching import StackedBatchSampler
from workloads.privacy import PrivacyConfig, poisson_batches, sample_rates
from workloads.task import cross_entropy

from .conftest import SECRET, make_data, make_model

ROOT = Path(__file__).resolve().parents[2]


def opacus_epsilon(sigma: float, q: float, steps: int, delta: float = 1e-5) -> float:
    """Opacus' own RDP accountant (imported here: collecting the suite need not load it)."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(sigma, q, steps)]
    return float(accountant.get_epsilon(delta))


def test_the_trainers_private_gradient_is_its_row_of_the_simulators() -> None:
    data = load_dataset("synthetic:num_samples=300,num_classes=4,seed=0")
    parts = [torch.arange(0, 70), torch.arange(70, 160)]
    config = PrivacyConfig(noise=0.9, clip=0.4)

    def net() -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Linear(20, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
        model[0].bias.requires_grad_(False)  # frozen: neither clipped over nor noised
        return model

    peers = BatchedPeers(net, 2, init="independent", seed=3)
    peers.privacy = SimPrivacy(config, parts, 8, seed=11, rounds=4)
    sampler = StackedBatchSampler(parts, 8, seed=11)
    rates = sample_rates([len(p) for p in parts], 8)
    trainers = []
    for i, part in enumerate(parts):
        trainer = Trainer(
            peers.module(i),
            lambda p: torch.optim.SGD(p, lr=0.1),
            cross_entropy,
            poisson_batches(data, part, 8, seed=11, peer=i),
            torch.device("cpu"),
        )
        trainer.privacy = PrivateTraining(
            config, noise_multiplier=0.9, sample_rate=float(rates[i]), batch_size=8, seed=11,
            peer=i,
        )  # fmt: skip
        trainers.append(trainer)
    for step in range(2):
        x, y = peers.privacy.batch(sampler, step, data.x_train, data.y_train)
        losses, grads = peers.gradients(x, y)
        for i, trainer in enumerate(trainers):
            trainer.step = step  # the noise key: the step this gradient is for
            loss = trainer.gradient()
            trained = trainer.flat.grad.numel()
            assert trained == grads.shape[1] - 6 and not grads[i, trained:].any()
            assert torch.allclose(trainer.flat.grad, grads[i, :trained], atol=1e-6, rtol=1e-5)
            assert loss == pytest.approx(float(losses[i]), rel=1e-5)
    assert [t.privacy.ledger.steps for t in trainers if t.privacy] == [2, 2]


async def test_a_peer_stops_training_at_its_budget_loudly(caplog: pytest.LogCaptureFixture) -> None:
    q = 8 / 32  # make_data: batches of 8; the peer's shard: 32 examples
    budget = opacus_epsilon(1.5, q, 3) + 1e-9  # three steps fit, the fourth does not
    privacy = PrivateTraining(
        PrivacyConfig(noise=1.5, clip=1.0, epsilon=budget, sampling="fixed"),
        noise_multiplier=1.5, sample_rate=q, batch_size=8, seed=0, peer=0,
    )  # fmt: skip
    peer = Peer(
        make_model(0),
        lambda params: torch.optim.SGD(params, lr=0.1),
        F.cross_entropy,
        make_data(0),
        PeerConfig(peer_id="a", secret=SECRET),
        privacy=privacy,
    )
    await peer.start()
    try:
        with caplog.at_level(logging.WARNING):
            await peer.run(10)
    finally:
        await peer.stop()
    assert peer.step == 3
    status = peer.status()["privacy"]
    assert status["stopped"] is True and status["steps"] == 3
    assert status["epsilon"] == pytest.approx(opacus_epsilon(1.5, q, 3), rel=1e-9)
    assert status["target_epsilon"] == budget and status["delta"] == 1e-5
    warned = [r.getMessage() for r in caplog.records if "privacy budget" in r.getMessage()]
    assert len(warned) == 1 and "stopped training at step 3" in warned[0]
    assert f"budget {budget:g}" in warned[0]
    from peer.app.status import render

    shown = next(line for line in render(peer.status()).splitlines() if "privacy" in line)
    assert f"epsilon {status['epsilon']:.4g} at delta 1e-05" in shown and "STOPPED" in shown
    metrics = peer.render_metrics().decode()
    line = next(x for x in metrics.splitlines() if x.startswith("gossipnet_privacy_epsilon "))
    assert float(line.split()[1]) == pytest.approx(status["epsilon"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dp-noise", "1"], "--dp-clip: is required"),
        (["--dp-noise", "-1", "--dp-clip", "1"], "--dp-noise: must be > 0, got -1.0"),
        (["--dp-noise", "1", "--dp-clip", "1", "--dp-delta", "1.5"], "--dp-delta: must be > 0"),
        (["--dp-delta", "1e-6"], "--dp-delta: applies to DP-SGD only"),
        (["--dp-epsilon", "2", "--dp-clip", "1"], "--dp-epsilon: without --dp-noise it picks"),
        (["--dp-noise", "1", "--dp-clip", "1", "--dp-sampling", "x"], "--dp-sampling: invalid"),
        (["--dp-noise", "1", "--dp-clip", "1", "--dp-accountant", "prv"], "prv needs the run's"),
        (["--dp-seeded"], "--dp-seeded: applies to DP-SGD only"),
    ],
)
def test_bad_dp_flags_exit_2_with_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gossipnet.cli import main

    commands = [["peer", "--id", "a"], ["launch", "--peers", "2"]]
    if "--dp-epsilon" in flags or "prv" in flags:  # launch's --steps default 500 is given
        commands = commands[:1]
    for command in commands:
        with pytest.raises(SystemExit) as info:
            main([*command, *flags])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"gossipnet {command[0]}: error: --dp-")
        assert message in err[0], err


@pytest.mark.slow
def test_launch_with_dp_shows_each_peers_opacus_epsilon_and_stops_at_the_budget(
    tmp_path: Path,
) -> None:
    q = 8 / 80  # 160 training samples in two shards, batch 8
    budget = opacus_epsilon(1.1, q, 4) + 1e-6  # 4 of the 8 steps fit
    result = subprocess.run(
        [sys.executable, "-m", "gossipnet", "launch", "--peers", "2", "--steps", "8",
         "--dataset", "synthetic:num_samples=200,seed=0", "--batch-size", "8",
         "--algorithm", "dpsgd", "--topology", "ring", "--dp-noise", "1.1", "--dp-clip", "1.0",
         "--dp-epsilon", repr(budget), "--progress", "none", "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=110,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(result.stdout.splitlines()[-1])
    header = next(line for line in result.stdout.splitlines() if "vs centralized" in line)
    assert "epsilon" in header
    for peer in results["peers"]:
        assert peer["step"] == 4 and peer["privacy_stopped"] is True
        assert peer["epsilon"] == pytest.approx(opacus_epsilon(1.1, q, 4), rel=1e-9)
    row = next(line for line in result.stdout.splitlines() if "peer-0" in line)
    assert f"{results['peers'][0]['epsilon']:.3g} (budget)" in row
    for index in (0, 1):
        log = (tmp_path / f"peer-{index}.err").read_text()
        assert "privacy budget: stopped training at step 4" in log


def test_a_peers_noise_key_is_a_secret_unless_dp_seeded() -> None:
    """Neighbours know the swarm's --seed: by default a peer keys its noise and its Poisson
    draws by a secret from the OS (two peers built from the same flags differ); with
    --dp-seeded by --seed, as the simulator does."""
    from peer.app.cli import parse_peer_args
    from peer.app.run import build_peer

    flags = ["--id", "a", "--dataset", "synthetic:num_samples=200,seed=0", "--model",
             "logistic", "--seed", "7", "--dp-noise", "1", "--dp-clip", "1"]  # fmt: skip
    keys = []
    for extra in ([], [], ["--dp-seeded"]):
        args, config = parse_peer_args([*flags, *extra], raise_errors=True)
        peer, _ = build_peer(args, config)
        assert peer.privacy is not None
        keys.append(peer.privacy.seed)
    secret, other, seeded = keys
    assert secret != other and 7 not in (secret, other)
    assert seeded == 7


async def test_a_resumed_peer_keeps_the_sigma_its_run_picked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dp-epsilon picks σ for the run's steps. A resumed peer's account holds its steps
    before the checkpoint (launch --resume and --crashes pass what is left as --steps), so its
    σ covers those and the steps left: its first life's σ, not that of a run of the steps left."""
    from peer.app.cli import parse_peer_args
    from peer.app.run import build_peer

    flags = ["--id", "a", "--dataset", "synthetic:num_samples=200,seed=0", "--model",
             "logistic", "--dp-epsilon", "2", "--dp-clip", "1", "--batch-size", "10",
             "--checkpoint-dir", str(tmp_path), "--port", "0"]  # fmt: skip
    monkeypatch.setenv("GOSSIPNET_SECRET", "a swarm secret of this test")

    def sigma(*extra: str) -> tuple[Peer, float]:
        args, config = parse_peer_args([*flags, *extra], raise_errors=True)
        peer, _ = build_peer(args, config)
        assert peer.privacy is not None
        return peer, peer.privacy.noise_multiplier

    first, whole_run = sigma("--steps", "40")
    await first.start()
    await first.run(steps=30)
    await first.stop()  # checkpoints at step 30
    _, resumed = sigma("--steps", "10", "--resume")
    _, short_run = sigma("--steps", "10")
    assert resumed == whole_run
    assert short_run < whole_run  # 10 steps alone would take less noise for the same ε
