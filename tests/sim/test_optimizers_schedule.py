"""The simulator's local optimizer with a learning-rate schedule and per-peer gradient
clipping: the batched optimizers over the stacked ``[n, d]`` rows equal n per-peer torch
optimizers stepped by torch's own LambdaLR and clip_grad_norm_, and the ``[optimizer]``
table takes the same keys as the peer's flags."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sim.algorithms import OptimizerConfig
from sim.batched import BatchedPeers
from sim.build import build
from sim.config import ConfigError, experiment_from_dict
from sim.reference import ReferencePeers

SCHEDULED = [
    OptimizerConfig(
        "adamw", lr=0.02, betas=(0.9, 0.95), weight_decay=0.1, schedule="cosine",
        warmup_steps=2, min_lr=0.002, decay_steps=4, clip_norm=0.5,
    ),
    OptimizerConfig(
        "sgd", lr=0.1, momentum=0.9, nesterov=True, schedule="step", step_size=2, gamma=0.5,
        warmup_steps=1, clip_norm=1.0,
    ),
]  # fmt: skip
IDS = ["adamw-cosine-clip", "nesterov-step-clip"]


def torch_reference(config: OptimizerConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """One peer's optimizer as torch has it: the optimizer at the peak lr, LambdaLR over
    ``lr_at(t) / lr`` stepped after each step, clip_grad_norm_ before it."""
    if config.name == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            params, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov,
            weight_decay=config.weight_decay,
        )  # fmt: skip
    else:
        optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: config.lr_at(t) / config.lr)
    clip = config.clip_norm
    assert clip is not None

    def clip_first(*_: object) -> None:
        nn.utils.clip_grad_norm_(params, clip)

    optimizer.register_step_pre_hook(clip_first)
    optimizer.register_step_post_hook(lambda *_: scheduler.step())
    return optimizer


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


@pytest.mark.parametrize("config", SCHEDULED, ids=IDS)
def test_batched_step_with_schedule_and_clipping_equals_n_torch_optimizers(
    config: OptimizerConfig,
) -> None:
    n = 4
    peers = BatchedPeers(mlp, n, init="independent", seed=3)
    optimizer = config.build(peers.params)
    reference = ReferencePeers(
        peers.template, n, lambda p: torch_reference(config, p), initial=peers.params
    )
    generator = torch.Generator().manual_seed(0)
    for _ in range(8):  # warm-up, decay, and past its end
        x = torch.randn(n, 8, 6, generator=generator) * 4  # large gradients: clipped
        y = torch.randint(0, 3, (n, 8), generator=generator)
        lrs = [o.param_groups[0]["lr"] for o in reference.optimizers]  # this step's
        _, peers.params.grad = peers.gradients(x, y)
        optimizer.step()
        reference.step(x, y)
        assert lrs == pytest.approx([optimizer.param_groups[0]["lr"]] * n)
    torch.testing.assert_close(peers.params, reference.flat(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", SCHEDULED, ids=IDS)
def test_rows_stepping_apart_each_follow_their_own_schedule(config: OptimizerConfig) -> None:
    """AD-PSGD's optimizer: rows step different numbers of times, each at the lr of its own
    step count, and each row's gradient is clipped to its own norm."""
    n, d = 5, 6
    generator = torch.Generator().manual_seed(1)
    leaf = torch.randn(n, d, generator=generator)
    initial = leaf.clone()
    rows_optimizer = config.build_rows(leaf)
    parameters = [nn.Parameter(leaf[i].clone()) for i in range(n)]
    reference = [torch_reference(config, [p]) for p in parameters]
    for rows in [[0, 1, 2], [2, 4], [4, 0, 2], [2], [1, 4, 2, 0], [2, 0], [2]]:
        grads = torch.randn(len(rows), d, generator=generator) * 3
        values = leaf[rows].clone()
        for row, grad in zip(rows, grads, strict=True):
            parameters[row].grad = grad.clone()
            reference[row].step()
        rows_optimizer.step(torch.tensor(rows), values, grads)
        leaf[rows] = values
    torch.testing.assert_close(leaf, torch.stack([p.detach() for p in parameters]))
    assert torch.equal(leaf[3], initial[3])  # row 3 never stepped


def test_the_optimizer_table_takes_the_flags_keys_and_refuses_one_it_does_not_read() -> None:
    base = {"workload": {"dataset": "synthetic:num_samples=64", "peers": 2}, "rounds": 10}
    table = {"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "schedule": "cosine",
             "warmup_steps": 4, "min_lr": 1e-4, "clip_norm": 1.0}  # fmt: skip
    config = experiment_from_dict(
        {**base, "optimizer": table, "algorithm": {"name": "local-sgd", "local_steps": 3}}
    )
    assert config.optimizer.betas == (0.9, 0.95)
    _, ctx, _ = build(config)
    assert ctx.optimizer.decay_steps == 10 * 3 - 4  # the run's local steps less the warm-up
    for bad, message in [
        ({"name": "adamw", "momentum": 0.9}, "optimizer.momentum: optimizer adamw does not"),
        ({"schedule": "cosine", "gamma": 0.5}, "optimizer.gamma: schedule cosine does not"),
        ({"schedule": "step"}, "optimizer.step_size: the step schedule needs it"),
    ]:
        with pytest.raises(ConfigError, match="^" + message):
            experiment_from_dict({**base, "optimizer": bad})
