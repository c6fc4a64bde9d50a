"""The local (inner) optimizer from the command line: one flag per key of
workloads.optimizers.OPTIMIZER_KEYS on `gossipnet peer` and `gossipnet launch` (the
simulator's [optimizer] keys with dashes), checked once, and the peer that steps it."""

from __future__ import annotations

import pytest
import torch

from gossipnet.cli import main
from peer.app.cli import parse_peer_args
from peer.app.run import build_peer
from workloads.optimizers import LocalOptimizer


def test_a_peer_built_from_the_flags_steps_adamw(tmp_path):
    args, config = parse_peer_args(
        ["--id", "a", "--port", "0", "--dataset", "synthetic:num_samples=64",
         "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.1", "--betas", "0.8,0.9",
         "--eps", "1e-6"]
    )  # fmt: skip
    peer, _ = build_peer(args, config)
    optimizer = peer.trainer.optimizer
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (
        0.01, 0.1, (0.8, 0.9), 1e-6
    )  # fmt: skip
    sgd, _ = build_peer(*parse_peer_args(["--id", "b", "--dataset", "synthetic:num_samples=64"]))
    assert sgd.trainer.optimizer.param_groups[0]["momentum"] == 0.9  # SGD's default
    nesterov, _ = build_peer(
        *parse_peer_args(["--id", "c", "--dataset", "synthetic:num_samples=64", "--nesterov"])
    )
    assert nesterov.trainer.optimizer.param_groups[0]["nesterov"] is True


def test_the_peer_steps_at_the_scheduled_lr_with_its_gradient_clipped():
    """Warm-up then cosine over --steps, and every gradient clipped to --clip-norm, as the
    one schedule function says (LocalOptimizer.lr_at)."""
    args, config = parse_peer_args(
        ["--id", "a", "--dataset", "synthetic:num_samples=64", "--steps", "8",
         "--optimizer", "adamw", "--lr", "0.01", "--schedule", "cosine", "--warmup-steps", "3",
         "--min-lr", "0.001", "--clip-norm", "0.05"]
    )  # fmt: skip
    peer, _ = build_peer(args, config)
    expected = LocalOptimizer(
        "adamw", lr=0.01, schedule="cosine", warmup_steps=3, min_lr=0.001, decay_steps=5
    )
    trainer, seen = peer.trainer, []
    for _ in range(8):
        trainer.gradient()
        with trainer.lock:
            trainer.optimizer_step()
        seen.append(trainer.optimizer.param_groups[0]["lr"])
        assert float(trainer.flat.parameter.grad.norm()) == pytest.approx(0.05, rel=1e-4)
    assert seen == [expected.lr_at(t) for t in range(8)]
    assert seen[2] == 0.01 and seen[-1] == pytest.approx(0.001 + 0.009 * (1 - 0.809017) / 2)


@pytest.mark.parametrize("command", ["peer", "launch"])
@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--optimizer", "adamw", "--momentum", "0.5"], "--momentum: optimizer adamw does not"),
        (["--optimizer", "adam", "--nesterov"], "--nesterov: optimizer adam does not read it"),
        (["--betas", "0.9,0.99"], "--betas: optimizer sgd does not read it (only adam, adamw)"),
        (["--schedule", "cosine", "--gamma", "0.5"], "--gamma: schedule cosine does not"),
        (["--schedule", "step"], "--step-size: the step schedule needs it"),
        (["--min-lr", "0.01"], "--min-lr: schedule constant does not read it (only cosine)"),
        (["--clip-norm", "0"], r"--clip-norm: must be a finite number > 0; got 0.0"),
    ],
)
def test_a_flag_the_optimizer_or_schedule_does_not_read_is_one_line_naming_it(
    command, flags, line, capsys
):
    extra = ["--id", "a"] if command == "peer" else ["--peers", "2"]
    with pytest.raises(SystemExit) as caught:
        main([command, *extra, "--dataset", "synthetic:num_samples=64", *flags])
    assert caught.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and line in lines[0], lines


def test_a_cosine_schedule_of_a_peer_without_steps_needs_decay_steps(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["peer", "--id", "a", "--dataset", "synthetic:num_samples=64",
              "--schedule", "cosine"])  # fmt: skip
    assert caught.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--decay-steps: the cosine schedule needs it" in lines[0], lines


def test_a_checkpointed_peer_resumes_its_schedule_where_it_stopped(tmp_path):
    from peer.node.training_state import load_training_state, save_training_state

    argv = ["--id", "a", "--dataset", "synthetic:num_samples=64", "--steps", "10",
            "--optimizer", "adamw", "--lr", "0.01", "--schedule", "cosine",
            "--warmup-steps", "2"]  # fmt: skip
    trainer = build_peer(*parse_peer_args(argv))[0].trainer
    for _ in range(4):
        trainer.gradient()
        with trainer.lock:
            trainer.optimizer_step()
    with trainer.lock:
        save_training_state(trainer, tmp_path, round=0, peer_id="a", keep=1)
    resumed = build_peer(*parse_peer_args(argv))[0].trainer
    load_training_state(resumed, tmp_path)
    resumed.gradient()
    with resumed.lock:
        resumed.optimizer_step()
    expected = LocalOptimizer("adamw", lr=0.01, schedule="cosine", warmup_steps=2, decay_steps=8)
    assert resumed.optimizer.param_groups[0]["lr"] == expected.lr_at(4) != expected.lr_at(0)
