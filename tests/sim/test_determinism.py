"""One seed, one run: the simulator's dropout masks come from the experiment's seed alone.

Not from torch's global generator (which nothing in a simulator run seeds, and which the test
suite's conftest seeds for every test, hiding the difference): two runs of one experiment in
fresh processes give the same records bit for bit, and a gradient call's masks do not depend
on how the rows are split into blocks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from sim.batched import BatchedPeers

EXPERIMENT = """
name = "determinism"
seed = 3
rounds = 3
eval_every = 1

[workload]
dataset = "synthetic:num_samples=400,seed=0"
model = "he2022-cnn"    # dropout 0.25 and 0.5
peers = 4
batch_size = 8

[optimizer]
name = "sgd"
lr = 0.05

[algorithm]
name = "dpsgd"
topology = "ring"
"""


GOSSIPNET_SIM_RUN = [sys.executable, "-m", "gossipnet", "sim", "run"]


@pytest.mark.slow
def test_two_runs_of_one_experiment_in_fresh_processes_are_bit_identical(tmp_path: Path) -> None:
    path = tmp_path / "experiment.toml"
    path.write_text(EXPERIMENT)
    outputs = [tmp_path / f"run{i}.jsonl" for i in range(2)]
    runs = [
        subprocess.Popen(
            [*GOSSIPNET_SIM_RUN, str(path), "--quiet", "--jsonl", str(output)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for output in outputs
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=110)
        assert run.returncode == 0, stderr
    first, second = (output.read_bytes() for output in outputs)
    assert first.count(b"\n") == 4  # rounds 0..3
    assert b'"train_loss": 2.' in first  # it trained (dropout on)
    assert first == second


def dropout_model() -> nn.Module:
    return nn.Sequential(nn.Dropout(0.3), nn.Linear(50, 3), nn.ReLU(), nn.Dropout(0.5))


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, 50, generator=generator).expand(n, -1, -1)
    y = torch.randint(0, 3, (1, 16), generator=generator).expand(n, -1)
    return x, y


def test_masks_follow_the_seed_not_the_blocks_nor_the_global_generator() -> None:
    n = 6
    x, y = batch(n)
    torch.manual_seed(0)
    whole = BatchedPeers(dropout_model, n, seed=7)
    losses, grads = whole.gradients(x, y)
    torch.manual_seed(12345)
    split = BatchedPeers(dropout_model, n, seed=7)
    for block_rows in (1, 4):
        again = BatchedPeers(dropout_model, n, seed=7)
        torch.manual_seed(block_rows)
        other_losses, other_grads = again.gradients(x, y, block_rows=block_rows)
        assert torch.equal(other_grads, grads)
        assert torch.equal(other_losses, losses)
    # same weights, same batch: the rows differ by their masks only, and so do the calls
    assert len(set(losses.tolist())) == n
    second = whole.gradients(x, y)[1]
    assert not torch.equal(second, grads)
    assert torch.equal(split.gradients(x, y)[1], grads)
    assert torch.equal(split.gradients(x, y, block_rows=2)[1], second)
    assert not torch.equal(BatchedPeers(dropout_model, n, seed=8).gradients(x, y)[1], grads)


def test_masks_drop_at_the_rate_asked_and_scale_what_is_kept() -> None:
    n, width, p = 3, 4000, 0.3
    peers = BatchedPeers(lambda: nn.Sequential(nn.Dropout(p), nn.Linear(width, 2)), n, seed=0)
    x = torch.ones(n, 1, width)
    _, grads = peers.gradients(x, torch.zeros(n, 1, dtype=torch.long))
    weight = peers.layout.unflatten(grads)["1.weight"][:, 0]  # [n, width]: mask / (1 - p) * g
    kept = weight != 0
    assert ((kept.double().mean(dim=1) - (1 - p)).abs() < 0.03).all()
    scaled = weight[kept] / peers.layout.unflatten(grads)["1.bias"][:, 0].repeat_interleave(
        kept.sum(dim=1)
    )
    assert torch.allclose(scaled, torch.full_like(scaled, 1 / (1 - p)))
    # the rows' masks are independent: about (1 - p)^2 of the elements are kept by both
    both = (kept[0] & kept[1]).double().mean()
    assert abs(float(both) - (1 - p) ** 2) < 0.03
