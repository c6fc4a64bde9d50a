"""Optimizers that step some rows of the stacked leaf: per-row state, cost of those rows only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sim.algorithms import OptimizerConfig
from sim.batched import BatchedPeers
from sim.optimizers import BlockedOptimizer, RowOptimizer, build_optimizer

CONFIGS = [
    OptimizerConfig(lr=0.1),
    OptimizerConfig(lr=0.05, momentum=0.9),
    OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=1e-2, nesterov=True),
    OptimizerConfig(name="adam", lr=0.01, weight_decay=1e-3),
]
IDS = ["sgd", "momentum", "nesterov-decay", "adam"]


def _torch_optimizer(config: OptimizerConfig, parameter: torch.Tensor) -> torch.optim.Optimizer:
    if config.name == "adam":
        return torch.optim.Adam([parameter], lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(
        [parameter],
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        nesterov=config.nesterov,
    )


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_each_row_steps_like_its_own_torch_optimizer(config: OptimizerConfig) -> None:
    """Rows step different numbers of times, in changing groups; each row ends where its
    own torch optimizer ends (Adam's bias correction counting that row's steps), and rows
    that never step keep their values and zero state."""
    n, d = 6, 7
    generator = torch.Generator().manual_seed(0)
    leaf = torch.randn(n, d, generator=generator)
    rows_optimizer = config.build_rows(leaf)
    parameters = [leaf[i].clone() for i in range(n)]
    reference = [_torch_optimizer(config, p) for p in parameters]
    schedule = [[0, 1, 2], [2, 4], [4, 0, 2], [2], [1, 4, 2, 0]]  # row 3 and 5 never step
    for rows in schedule:
        grads = torch.randn(len(rows), d, generator=generator)
        values = leaf[rows].clone()
        assert rows_optimizer.step(torch.tensor(rows), values, grads) is values
        leaf[rows] = values
        for row, grad in zip(rows, grads, strict=True):
            parameters[row].grad = grad.clone()
            reference[row].step()
    torch.testing.assert_close(leaf, torch.stack(parameters), rtol=1e-6, atol=1e-7)
    for name, state in rows_optimizer.state.items():
        assert not state[[3, 5]].any(), name
    if config.name == "adam":
        assert rows_optimizer.state["step"].tolist() == [3.0, 2.0, 5.0, 0.0, 3.0, 0.0]


def test_no_rows_is_a_no_op_and_bad_input_names_the_field() -> None:
    optimizer = RowOptimizer((3, 2), "sgd", lr=0.1, momentum=0.5)
    values = torch.ones(0, 2)
    assert optimizer.step(torch.zeros(0, dtype=torch.long), values, values) is values
    assert optimizer.state == {}
    with pytest.raises(ValueError, match="rows, values, grads"):
        optimizer.step(torch.tensor([0]), torch.ones(1, 3), torch.ones(1, 3))
    for kwargs, field in [
        ({"name": "lamb"}, "optimizer"),
        ({"lr": 0.0}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"nesterov": True}, "nesterov"),
        ({"betas": (0.9, 1.0), "name": "adam"}, "betas"),
    ]:
        with pytest.raises(ValueError, match=field):
            RowOptimizer((3, 2), **kwargs)  # type: ignore[arg-type]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_blocked_step_at_other_rows_is_gradient_there_then_step(config: OptimizerConfig) -> None:
    """``step(x, y, active, at=A)``: gradients taken at A, applied to the parameters, bit for
    bit the gradients of A followed by ``step_with`` (combine-then-adapt, one block of
    gradients in flight)."""
    n = 7
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 4, 5, generator=generator), torch.randint(0, 3, (n, 4))
    at = torch.randn(n, BatchedPeers(_mlp, 1).dim, generator=generator)
    active = torch.tensor([True, False, True, True, True, True, False])
    fused = BatchedPeers(_mlp, n, init="independent", seed=2)
    plain = BatchedPeers(_mlp, n, init="independent", seed=2)
    trainer = BlockedOptimizer(fused, fused.params, config.build, block_rows=3)
    split = BlockedOptimizer(plain, plain.params, config.build, block_rows=3)
    for _ in range(3):
        losses = trainer.step(x, y, active, at=at)
        expected, grads = plain.gradients(x, y, at, block_rows=3)
        split.step_with(grads, active)
        assert torch.equal(fused.params, plain.params)
        assert torch.equal(losses[active], expected[active])
        assert bool(losses[~active].isnan().all())
    with pytest.raises(ValueError, match="at: must have"):
        trainer.step(x, y, at=at[:3])


def test_row_optimizer_matches_one_optimizer_over_all_rows_when_all_step() -> None:
    n, d = 4, 9
    generator = torch.Generator().manual_seed(3)
    leaf = torch.randn(n, d, generator=generator)
    stacked = leaf.clone()
    whole = build_optimizer(stacked, "sgd", lr=0.1, momentum=0.9, weight_decay=1e-3)
    rows = RowOptimizer((n, d), "sgd", lr=0.1, momentum=0.9, weight_decay=1e-3)
    for _ in range(4):
        grads = torch.randn(n, d, generator=generator)
        stacked.grad = grads
        whole.step()
        rows.step(torch.arange(n), leaf, grads)
    torch.testing.assert_close(leaf, stacked, rtol=1e-6, atol=1e-7)
