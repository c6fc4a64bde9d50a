"""A plain PyTorch training loop that gossips: two peers, each an ordinary script.

The loop is the one you already have (a DataLoader, a BatchNorm model, SGD with momentum,
a StepLR schedule, no async code); three lines make it a gossip peer:
``BackgroundPeer(model, optimizer, config)``, ``with swarm:`` and, optionally,
``swarm.report(loss)``. Every ``optimizer.step()`` then also averages the model, BatchNorm
running statistics included, with the other peer (D-PSGD rounds).

Run (CPU, a few seconds)::

    .venv/bin/python examples/dropin_loop.py [--epochs 3]

It starts peer ``a`` here and peer ``b`` as a second process of this same script (``--id b
--join HOST:PORT``), as two machines would. Each trains on its own half of the data; at
the end both print their test accuracy and the same running statistics.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peer import BackgroundPeer, PeerConfig
from workloads import load_dataset, partition

DATASET = "synthetic:num_samples=1200,seed=0"


def say(line: str) -> None:
    """One line in one write: both peers share this terminal (or pipe), and ``print`` writes
    the text and its newline apart when output is unbuffered, so lines could interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def model_for(inputs: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(inputs, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, classes)
    )


def train(peer_id: str, join: tuple[str, ...], epochs: int) -> None:
    torch.manual_seed(0 if peer_id == "a" else 1)
    torch.set_num_threads(1)
    data = load_dataset(DATASET)
    shard = partition("iid", data.y_train, num_peers=2, seed=0)[0 if peer_id == "a" else 1]
    loader = DataLoader(
        TensorDataset(data.x_train[shard], data.y_train[shard]), batch_size=32, shuffle=True
    )
    model = model_for(data.input_shape[0], data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=len(loader), gamma=0.5)

    # the swarm's secret comes from GOSSIPNET_SECRET (or secret_file=...), as on real machines
    config = PeerConfig(peer_id=peer_id, join=join, algorithm="dpsgd", round_deadline_s=10)
    with BackgroundPeer(model, optimizer, config) as swarm:
        helper = None
        if peer_id == "a":  # the second "machine": this script again, joining us
            command = [sys.executable, __file__, "--id", "b", "--join", str(swarm.address),
                       "--epochs", str(epochs)]  # fmt: skip
            helper = subprocess.Popen(command)
        swarm.wait_for_members(1)  # nobody trains alone before the other has joined
        for epoch in range(epochs):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()  # steps, then this round's exchange
                swarm.report(loss)  # what /v1/status and /metrics show
                scheduler.step()
            result = swarm.evaluate(data.x_test, data.y_test, F.cross_entropy)
            status = swarm.status()
            say(
                f"{peer_id}: epoch {epoch + 1}  step {status['step']}  loss {status['loss']:.3f}  "
                f"test acc {result['accuracy']:.2f}  lr {scheduler.get_last_lr()[0]:.3f}  "
                f"exchanges {status['exchanges']['ok']} ok"
            )
        with swarm.lock:
            statistics = model[1].running_mean[:3].tolist()  # type: ignore[index]
        say(f"{peer_id}: BatchNorm running_mean[:3] {[round(v, 4) for v in statistics]}")
        if helper is not None and helper.wait(timeout=120) != 0:
            sys.exit(f"peer b failed with exit code {helper.returncode}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--id", default="a", choices=["a", "b"], help=argparse.SUPPRESS)
    parser.add_argument("--join", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    # one random secret for this run; peer b, a child process, inherits it
    os.environ.setdefault("GOSSIPNET_SECRET", secrets.token_hex(32))
    train(args.id, tuple(args.join), args.epochs)
