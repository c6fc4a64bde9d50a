"""Embed gossip peers in your own asyncio program: three peers train one model together.

Each peer owns a shard of the data (a Dirichlet split, so the shards differ),
listens on a loopback port, and averages with a random neighbour after every
optimizer step (AD-PSGD). The swarm is authenticated with a random secret.
Run::

    .venv/bin/python examples/embed_peer.py [--steps 150] [--mode async|sync]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from contextlib import AsyncExitStack

import torch

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from workloads import build_model, load_dataset, partition, peer_batches


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


async def main(steps: int, mode: str, num_peers: int = 3) -> None:
    torch.set_num_threads(1)
    data = load_dataset("synthetic:num_samples=1200,seed=0")
    shards = partition("dirichlet:alpha=0.5", data.y_train, num_peers=num_peers, seed=0)
    secret = secrets.token_bytes(32)  # in a real swarm: --secret-file or GOSSIPNET_SECRET

    def make_peer(i: int, join: tuple[str, ...]) -> Peer:
        model = build_model("mlp", data.input_shape, data.num_classes, seed=i)
        config = PeerConfig(
            peer_id=f"peer-{i}", secret=secret, join=join, mode=mode, seed=0, round_deadline_s=2.0
        )
        return Peer(
            model,
            lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
            torch.nn.functional.cross_entropy,
            peer_batches(data, shards[i], batch_size=32, seed=0, peer=i),
            config,
        )

    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(make_peer(0, ()))
        peers = [first]
        for i in range(1, num_peers):
            peers.append(await stack.enter_async_context(make_peer(i, (first.address,))))
        print(f"swarm of {num_peers} at", ", ".join(p.address or "-" for p in peers))
        for _chunk in range(5):
            await asyncio.gather(*(p.run(steps=steps // 5) for p in peers))
            stacked = torch.stack([p.flat.vector for p in peers])
            distance = float((stacked - stacked.mean(0)).norm(dim=1).max())
            accs = [accuracy(p.model, data.x_test, data.y_test) for p in peers]
            print(
                f"step {peers[0].step:4d}  loss "
                + " ".join(f"{p.loss:.3f}" for p in peers)
                + "  test acc "
                + " ".join(f"{a:.2f}" for a in accs)
                + f"  max distance to mean {distance:.2e}"
            )
        status = peers[0].status()
        print(f"{status['id']}: round {status['round']}, {status['bytes_out']} bytes out")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--mode", choices=["async", "sync"], default="async")
    args = parser.parse_args()
    if args.steps < 5:
        parser.error(f"--steps must be >= 5, got {args.steps}")
    asyncio.run(main(args.steps, args.mode))
