"""Simulator throughput: peer-steps per second, vectorized engine vs the naive per-peer loop.

One D-PSGD step of every peer on a ring (adapt-then-combine): gradient on its own batch, SGD
with momentum, then gossip averaging with its two neighbours through ``consensus.WeightedMean``.

- vectorized: ``sim.batched.BatchedPeers`` over ``[n, d]`` (for this MLP the linear-chain
  kernels of ``sim.linear_chain``; ``--kernel vmap`` times ``vmap(grad)`` instead) with
  gradient and optimizer step fused per block of peers (``sim.optimizers.BlockedOptimizer``),
  then gossip averaging as one sparse product into a second buffer that becomes the
  parameters (``gather_mix``, ``BlockedOptimizer.swap``): what ``SynchronousGossip`` runs for
  D-PSGD. The unfused path (all gradients, then one optimizer over ``[n, d]``) is timed too;
- naive: ``sim.reference.ReferencePeers``, what a careful user writes: one ``nn.Module`` and one
  foreach ``torch.optim.SGD`` per peer, ``zero_grad(set_to_none=True)``, a Python loop; then a
  loop mixing each peer's flat vector with the same ``weighted_mean``.

Both run in this process, same model (``workloads`` ``mlp-100k``: 99,823 parameters on
MNIST-1D-shaped input), same batch size, same thread count. Every configuration is timed at
torch's default thread count (all cores: the vectorized bmm uses them, the naive loop of small
matmuls mostly cannot) and at one thread, and at batch sizes 8 and 32. The naive loop runs fewer
steps at large n. Peak memory at ``--memory-peers`` peers is measured in a fresh child process
(peak resident set size of a vectorized step).

    .venv/bin/python bench/sim_throughput.py                  # n = 16, 64, 256, 1024
    .venv/bin/python bench/sim_throughput.py --sizes 64 --batch-sizes 32 --threads 1 --steps 3
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

import torch

import topologies
from consensus.mean import WeightedMean, weighted_mean
from sim.batched import BatchedPeers
from sim.mixing import gather_mix, rows_for_budget
from sim.optimizers import BlockedOptimizer, build_optimizer
from sim.reference import ReferencePeers
from workloads import build_model, parameter_count

INPUT_SHAPE = (40,)
CLASSES = 10
KERNEL = {"name": "auto"}  # BatchedPeers(kernel=...), set by --kernel


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


def sgd(params: torch.Tensor) -> torch.optim.Optimizer:
    return build_optimizer(params, "sgd", lr=0.05, momentum=0.9)


def fused(n: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], list[float]]:
    """Seconds of each step after the first: (fused gradient + step, mixing into a buffer)."""
    peers = BatchedPeers(model, n, seed=0, kernel=KERNEL["name"])
    trainer = BlockedOptimizer(peers, peers.params, sgd)
    table = ring_table(n)
    rule = WeightedMean()
    chunk = rows_for_budget(n, table.width, peers.dim)
    mixed = torch.empty_like(peers.params)
    train, mix = [], []
    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        trainer.step(x, y)
        middle = time.perf_counter()
        gather_mix(peers.params, table, rule, chunk_rows=chunk, out=mixed)
        mixed = trainer.swap(mixed)  # the mixed rows become the parameters, no copy back
        if step > 0:
            train.append(middle - start)
            mix.append(time.perf_counter() - middle)
    return train, mix


def vectorized(n: int, batch: int, steps: int) -> tuple[float, float, float]:
    """Best seconds per step of all n peers over ``steps`` timed steps after a warm-up (the
    machine is shared; the fastest step is the least disturbed): (fused train = gradient +
    optimizer per block, mix, unfused train = all gradients, then one optimizer step)."""
    data = batches(n, batch, steps + 1)
    train, mix = fused(n, data)
    unfused = BatchedPeers(model, n, seed=0, kernel=KERNEL["name"])
    optimizer = sgd(unfused.params)
    plain = []
    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        _, unfused.params.grad = unfused.gradients(x, y)
        optimizer.step()
        if step > 0:
            plain.append(time.perf_counter() - start)
    return min(train), min(mix), min(plain)


def naive(n: int, batch: int, steps: int) -> tuple[float, float]:
    """The same with one module and optimizer per peer and a loop over peers for mixing
    (best seconds per step of all n peers)."""
    template = model()
    reference = ReferencePeers(
        template, n, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True)
    )
    table = ring_table(n)
    index = torch.as_tensor(table.index)
    weights = torch.as_tensor(table.weight, dtype=torch.float32)
    mask = torch.as_tensor(table.mask)
    data = batches(n, batch, steps + 1)
    train, mix = [], []
    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        reference.step(x, y)
        middle = time.perf_counter()
        flat = reference.flat()
        mixed = [weighted_mean(flat[i], flat[index[i]], weights[i], mask[i]) for i in range(n)]
        reference.set_flat(torch.stack(mixed))
        if step > 0:
            train.append(middle - start)
            mix.append(time.perf_counter() - middle)
    return min(train), min(mix)


def peak_rss_bytes() -> int:
    """This process's own peak resident set: ``VmHWM`` of ``/proc/self/status`` on Linux.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: on Linux that high-water mark lives in the
    signal struct, which a child inherits across fork and exec, so a child started by a
    parent that had grown to 4 GiB reports at least 4 GiB whatever it does itself.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def peak_memory_child(n: int, batch: int) -> None:
    """Run two fused vectorized steps of n peers and print the peak RSS in bytes."""
    fused(n, batches(n, batch, 2))
    print(peak_rss_bytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--steps", type=int, default=5, help="timed vectorized steps per size")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="vectorized and naive runs alternate this many times per configuration; the table "
        "shows medians, and the range of the per-repeat round ratios",
    )
    parser.add_argument(
        "--naive-peer-steps",
        type=int,
        default=1024,
        help="budget of naive peer-steps per size (fewer steps at large n, at least 2)",
    )
    default_threads = torch.get_num_threads()
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=sorted({default_threads, 1}, reverse=True),
        help=f"thread counts to time (default: torch's default {default_threads}, and 1)",
    )
    parser.add_argument("--memory-peers", type=int, default=1000)
    parser.add_argument(
        "--kernel",
        choices=["auto", "vmap"],
        default="auto",
        help="gradient kernel of the vectorized side (auto: the linear-chain kernels for this "
        "MLP; vmap: torch.func vmap(grad), what every other model runs)",
    )
    parser.add_argument("--child-memory", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.sizes + args.batch_sizes + args.threads + [args.steps, args.repeats]) < 1:
        parser.error("--sizes, --batch-sizes, --threads, --steps and --repeats must be >= 1")
    KERNEL["name"] = args.kernel
    if args.child_memory:
        torch.set_num_threads(args.threads[0])
        peak_memory_child(args.child_memory, args.batch_sizes[0])
        return 0
    print(
        f"model mlp-100k: {parameter_count(model()):,} parameters; D-PSGD step on a ring "
        f"(gradient + SGD momentum + mixing); torch default threads: {default_threads}; "
        f"vectorized kernel: {BatchedPeers(model, 1, kernel=args.kernel).kernel}"
    )
    print(
        "best-of-steps peer-steps per second; 'train' = gradient + optimizer step (vec: fused per block; "
        "unfused: all gradients then one step), 'round' = train + gossip mixing with the two "
        f"ring neighbours; ratios = vectorized / naive; medians of {args.repeats} alternating "
        "repeats"
    )
    header = (
        "threads",
        "batch",
        "peers",
        "vec train",
        "unfused",
        "naive train",
        "ratio",
        "vec round",
        "naive round",
        "ratio",
        "round ratio range",
    )
    line = "{:>7} {:>5} {:>6} {:>10} {:>8} {:>12} {:>6} {:>10} {:>12} {:>6} {:>18}"
    print(line.format(*header))
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batch_sizes:
            for n in args.sizes:
                naive_steps = max(2, min(args.steps, args.naive_peer_steps // n))
                runs = []  # vectorized and naive alternate: a slow spell hits both sides
                for _ in range(args.repeats):
                    fast_train, fast_mix, unfused = vectorized(n, batch, args.steps)
                    slow_train, slow_mix = naive(n, batch, naive_steps)
                    runs.append((fast_train, fast_mix, unfused, slow_train, slow_mix))
                fast_train, fast_mix, unfused, slow_train, slow_mix = (
                    statistics.median(column) for column in zip(*runs)
                )
                ratios = sorted((r[3] + r[4]) / (r[0] + r[1]) for r in runs)
                train_ratio = statistics.median(r[3] / r[0] for r in runs)
                spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}x"
                print(
                    f"{threads:>7} {batch:>5} {n:>6} {n / fast_train:>10,.0f} "
                    f"{n / unfused:>8,.0f} {n / slow_train:>12,.0f} "
                    f"{train_ratio:>5.2f}x {n / (fast_train + fast_mix):>10,.0f} "
                    f"{n / (slow_train + slow_mix):>12,.0f} "
                    f"{statistics.median(ratios):>5.2f}x {spread:>18}",
                    flush=True,
                )
    if args.memory_peers:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child-memory",
                str(args.memory_peers),
                "--batch-sizes",
                str(max(args.batch_sizes)),
                "--threads",
                "1",
                "--kernel",
                args.kernel,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        peak = int(child.stdout.strip().splitlines()[-1])
        print(
            f"peak resident memory, {args.memory_peers} peers x mlp-100k, vectorized step "
            f"(batch {max(args.batch_sizes)}): {peak / 2**30:.2f} GiB (target < 4 GiB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
