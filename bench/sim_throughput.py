"""Simulator throughput: peer-steps per second, vectorized engine vs the naive per-peer loop.

One D-PSGD step of every peer on a ring: gradient on its own batch, SGD with momentum, then
gossip averaging with its two neighbours through ``consensus.WeightedMean``.

- vectorized: ``sim.engine.BatchedPeers`` (one ``vmap(grad)`` over ``[n, d]``), one optimizer
  over the stacked rows, one gather ``[n, k, d]`` along the neighbour table;
- naive: ``sim.reference.ReferencePeers`` (one ``nn.Module`` and optimizer per peer, a Python
  loop), then a loop mixing each peer's flat vector with the same ``weighted_mean``.

Both run in this process, same model (``workloads`` ``mlp-100k``: 99,823 parameters on
MNIST-1D-shaped input), same batch size, same thread count; the table prints the ratio. The
naive loop runs fewer steps at large n. Peak memory at ``--memory-peers`` peers is measured
in a fresh child process (peak resident set size of a vectorized run).

    .venv/bin/python bench/sim_throughput.py                  # n = 16, 64, 256, 1024
    .venv/bin/python bench/sim_throughput.py --sizes 16 64 --steps 3
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import torch

import topologies
from consensus.mean import WeightedMean, weighted_mean
from sim.engine import BatchedPeers, build_optimizer, gather_mix, rows_for_budget
from sim.reference import ReferencePeers
from workloads import build_model, parameter_count

INPUT_SHAPE = (40,)
CLASSES = 10


def model() -> torch.nn.Module:
    return build_model("mlp-100k", INPUT_SHAPE, CLASSES, seed=0)


def batches(n: int, batch: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(n, batch, *INPUT_SHAPE, generator=generator),
            torch.randint(0, CLASSES, (n, batch), generator=generator),
        )
        for _ in range(steps)
    ]


def ring_table(n: int) -> topologies.NeighbourTable:
    return topologies.neighbour_table(topologies.mixing_matrix(topologies.build("ring", n)))


def vectorized(n: int, batch: int, steps: int) -> tuple[float, float]:
    """Seconds per step of all n peers: (train = gradient + optimizer, mix), after a warm-up."""
    peers = BatchedPeers(model, n, seed=0)
    optimizer = build_optimizer(peers.params, "sgd", lr=0.05, momentum=0.9)
    table = ring_table(n)
    rule = WeightedMean()
    chunk = rows_for_budget(n, table.width, peers.dim)
    data = batches(n, batch, steps + 1)
    train = mix = 0.0
    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        _, peers.params.grad = peers.gradients(x, y)
        optimizer.step()
        middle = time.perf_counter()
        peers.params.copy_(gather_mix(peers.params, table, rule, chunk_rows=chunk))
        if step > 0:
            train += middle - start
            mix += time.perf_counter() - middle
    return train / steps, mix / steps


def naive(n: int, batch: int, steps: int) -> tuple[float, float]:
    """The same with one module and optimizer per peer and a loop over peers for mixing."""
    template = model()
    reference = ReferencePeers(template, n, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    table = ring_table(n)
    index = torch.as_tensor(table.index)
    weights = torch.as_tensor(table.weight, dtype=torch.float32)
    mask = torch.as_tensor(table.mask)
    data = batches(n, batch, steps + 1)
    train = mix = 0.0
    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        reference.step(x, y)
        middle = time.perf_counter()
        flat = reference.flat()
        mixed = [weighted_mean(flat[i], flat[index[i]], weights[i], mask[i]) for i in range(n)]
        reference.set_flat(torch.stack(mixed))
        if step > 0:
            train += middle - start
            mix += time.perf_counter() - middle
    return train / steps, mix / steps


def peak_memory_child(n: int, batch: int) -> None:
    """Run two vectorized steps of n peers and print the peak RSS in bytes."""
    vectorized(n, batch, 1)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="timed vectorized steps per size")
    parser.add_argument(
        "--naive-peer-steps",
        type=int,
        default=1024,
        help="budget of naive peer-steps per size (fewer steps at large n, at least 1)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-peers", type=int, default=1000)
    parser.add_argument("--child-memory", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child_memory:
        peak_memory_child(args.child_memory, args.batch_size)
        return 0
    print(
        f"model mlp-100k: {parameter_count(model()):,} parameters; batch {args.batch_size}; "
        f"{args.threads} thread(s); D-PSGD step on a ring (gradient + SGD momentum + mixing)"
    )
    print(
        "peer-steps per second; 'train' = gradient + optimizer step, 'round' = train + gossip "
        "mixing with the two ring neighbours"
    )
    header = ("peers", "vec train", "naive train", "ratio", "vec round", "naive round", "ratio")
    print("{:>6} {:>10} {:>12} {:>6} {:>10} {:>12} {:>6}".format(*header))
    for n in args.sizes:
        fast_train, fast_mix = vectorized(n, args.batch_size, args.steps)
        naive_steps = max(1, min(args.steps, args.naive_peer_steps // n))
        slow_train, slow_mix = naive(n, args.batch_size, naive_steps)
        fast_round, slow_round = fast_train + fast_mix, slow_train + slow_mix
        print(
            f"{n:>6} {n / fast_train:>10,.0f} {n / slow_train:>12,.0f} "
            f"{slow_train / fast_train:>5.2f}x {n / fast_round:>10,.0f} "
            f"{n / slow_round:>12,.0f} {slow_round / fast_round:>5.2f}x"
        )
    if args.memory_peers:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child-memory",
                str(args.memory_peers),
                "--batch-size",
                str(args.batch_size),
                "--threads",
                str(args.threads),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        peak = int(child.stdout.strip().splitlines()[-1])
        print(
            f"peak resident memory, {args.memory_peers} peers x mlp-100k, vectorized step: "
            f"{peak / 2**30:.2f} GiB (target < 4 GiB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
