"""A small seeded workload for the simulator's tests (synthetic Gaussian mixture, tiny MLP)."""

from __future__ import annotations

import torch
from torch import nn

from sim.algorithms import Context, OptimizerConfig
from sim.batched import BatchedPeers
from sim.metrics import Evaluation
from sim.network import ComputeModel, Failures, Links
from workloads.batching import StackedBatchSampler
from workloads.datasets import load_dataset
from workloads.partition import partition


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 10))


def make_context(
    n: int = 4,
    *,
    seed: int = 0,
    batch_size: int = 8,
    optimizer: OptimizerConfig | None = None,
    compute: ComputeModel | None = None,
    failures: Failures | None = None,
    byzantine: int = 0,
    links: Links | None = None,
) -> tuple[Context, Evaluation]:
    data = load_dataset("synthetic:num_samples=400,test_fraction=0.2,seed=0")
    parts = partition("iid", data.y_train, n, seed=seed)
    peers = BatchedPeers(mlp, n, seed=seed)
    flags = torch.zeros(n, dtype=torch.bool)
    flags[n - byzantine :] = byzantine > 0
    ctx = Context(
        peers=peers,
        sampler=StackedBatchSampler(parts, batch_size, seed=seed),
        x_train=data.x_train,
        y_train=data.y_train,
        optimizer=optimizer or OptimizerConfig(lr=0.1),
        links=links or Links.uniform(n),
        compute=compute or ComputeModel(n, step_time=0.01),
        failures=failures or Failures(n),
        byzantine=flags,
        seed=seed,
    )
    return ctx, Evaluation(data.x_test, data.y_test)
