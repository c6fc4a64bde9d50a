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

More rows (``--rows``), each a whole simulated round of the real runners
(``sim.gossip_runner``, ``sim.algorithms``) on a ``sim.algorithms.Context`` over synthetic
MNIST-1D-shaped data (64 samples per peer), the same model and SGD (momentum 0.9), seconds per
round at the first of ``--threads`` (torch's default), best of ``--rounds`` rounds after a
warm-up round:

- ``adpsgd``: AD-PSGD (``AsynchronousGossip``: the next n events in conflict-free waves) against
  D-PSGD (``SynchronousGossip``, combine-then-adapt) on a ring, rounds alternating, at
  ``--adpsgd-sizes`` peers and each of ``--threads``; the ratio and AD-PSGD's waves per round;
- ``fedavg``: FedAvg with 5 local steps, client fraction 0.1 against 1.0;
- ``byzantine``: D-PSGD with trimmed mean (b=2) on a random 8-regular graph, no Byzantine peers
  against 10 % of them sending sign-flip or ALIE (their messages injected chunk by chunk);
- ``scale``: D-PSGD and AD-PSGD at ``--scale-peers`` peers (10,000 by default);
- ``gpt``: the language model (``workloads`` ``gpt``, ``--gpt-model`` on byte contexts of
  ``--gpt-context``) at ``--gpt-peers`` peers (16), batch ``--gpt-batch`` contexts: peer-steps
  per second of the simulator's engine (``BatchedPeers``' ``gpt`` kernel, the forward over
  the peers with one backward, ``sim.gpt_kernel``, and the fused ``BlockedOptimizer``, SGD
  with momentum; its ``vmap(grad)`` too) against the per-peer loop of ``ReferencePeers``
  (one module and one foreach SGD per peer), training only, best of ``--steps`` steps after a
  warm-up, medians of ``--repeats`` alternating repeats, at each of ``--threads``.

Rows with a ``peak`` column run in a fresh child process each; peak is that process's peak
resident set size (``VmHWM`` of ``/proc/self/status``, ``ru_maxrss`` where there is no
``/proc``): the whole simulation, data, torch and Python included.

    .venv/bin/python bench/sim_throughput.py                  # every row
    .venv/bin/python bench/sim_throughput.py --sizes 64 --batch-sizes 32 --threads 1 --steps 3
    .venv/bin/python bench/sim_throughput.py --rows adpsgd,scale --rounds 3
    .venv/bin/python bench/sim_throughput.py --rows gpt
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import consensus
import topologies
from consensus.mean import WeightedMean, weighted_mean
from gossip.algorithms import DecentralizedSGD
from sim.algorithms import Algorithm, Context, FedAvg, OptimizerConfig
from sim.batched import BatchedPeers
from sim.gossip_runner import AsynchronousGossip, SynchronousGossip
from sim.mixing import gather_mix, rows_for_budget
from sim.network import ComputeModel, Failures, Links
from sim.optimizers import BlockedOptimizer, build_optimizer
from sim.reference import ReferencePeers
from workloads import build_model, parameter_count
from workloads.batching import StackedBatchSampler

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


# --------------------------------------------------------------------------- whole rounds

ROWS = ("throughput", "adpsgd", "fedavg", "byzantine", "scale", "gpt")
SAMPLES_PER_PEER = 64
BYTES_PER_VALUE = 4


def context(n: int, batch: int, *, momentum: float = 0.9, byzantine: int = 0) -> Context:
    """A simulation of n peers of ``mlp-100k`` on synthetic data (64 samples per peer), SGD
    (lr 0.05), a uniform network; the last ``byzantine`` peers Byzantine."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n * SAMPLES_PER_PEER, *INPUT_SHAPE, generator=generator)
    y = torch.randint(0, CLASSES, (n * SAMPLES_PER_PEER,), generator=generator)
    parts = list(torch.arange(n * SAMPLES_PER_PEER).view(n, SAMPLES_PER_PEER).unbind(0))
    flags = torch.zeros(n, dtype=torch.bool)
    if byzantine:
        flags[n - byzantine :] = True
    return Context(
        peers=BatchedPeers(model, n, seed=0, kernel=KERNEL["name"]),
        sampler=StackedBatchSampler(parts, batch, seed=0),
        x_train=x,
        y_train=y,
        optimizer=OptimizerConfig(lr=0.05, momentum=momentum),
        links=Links.uniform(n),
        compute=ComputeModel(n),
        failures=Failures(n),
        byzantine=flags,
    )


def ring(n: int) -> topologies.Static:
    return topologies.Static(topologies.mixing_matrix(topologies.build("ring", n)))


def one_round(algorithm: Algorithm, ctx: Context) -> float:
    """Wall seconds of one round (the runner's bookkeeping of ``sim.runner.run`` included)."""
    start = time.perf_counter()
    report = algorithm.round(ctx)
    ctx.time += report.time
    ctx.round += 1
    return time.perf_counter() - start


def build_run(spec: dict[str, Any]) -> tuple[Algorithm, Context]:
    """The algorithm and context a child row runs (``spec`` from :func:`child_spec`)."""
    n, batch = spec["peers"], spec["batch"]
    ctx = context(n, batch, momentum=spec["momentum"], byzantine=spec.get("byzantine", 0))
    name = spec["algorithm"]
    algorithm: Algorithm
    if name == "adpsgd":
        algorithm = AsynchronousGossip(ring(n))
    elif name == "fedavg":
        algorithm = FedAvg(local_steps=5, fraction=spec["fraction"])
    else:
        schedule = ring(n)
        rule = None
        if spec.get("rule"):
            rule = consensus.build(spec["rule"])
            graph = topologies.build("random-regular", n, degree=8, seed=0)
            schedule = topologies.Static(topologies.mixing_matrix(graph))
        attack = consensus.build_attack(spec["attack"]) if spec.get("attack") else None
        algorithm = SynchronousGossip(DecentralizedSGD(aggregator=rule), schedule, attack=attack)
    return algorithm, ctx


def child_run(spec: dict[str, Any]) -> None:
    """One row in this (fresh) process: a warm-up round, ``rounds`` timed ones; prints JSON
    with the seconds of each, the peak resident set and AD-PSGD's waves per round."""
    torch.set_num_threads(spec["threads"])
    algorithm, ctx = build_run(spec)
    algorithm.setup(ctx)
    one_round(algorithm, ctx)
    seconds = [one_round(algorithm, ctx) for _ in range(spec["rounds"])]
    waves = getattr(algorithm, "waves", None)
    print(json.dumps({"seconds": seconds, "peak": peak_rss_bytes(), "waves": waves}))


def in_child(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`child_run` in a fresh interpreter (its peak memory is the row's alone)."""
    command = [sys.executable, __file__, "--child-run", json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"row {spec} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def adpsgd_rows(args: argparse.Namespace) -> None:
    print(
        f"\nAD-PSGD vs D-PSGD, seconds per round (n peer-steps each), ring, batch {args.batch}, "
        f"SGD momentum 0.9, best of {args.rounds} alternating rounds after a warm-up"
    )
    line = "{:>7} {:>6} {:>13} {:>14} {:>7} {:>12}"
    print(line.format("threads", "peers", "D-PSGD s/rnd", "AD-PSGD s/rnd", "ratio", "waves/round"))
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n in args.adpsgd_sizes:
            adpsgd_row(args, threads, n, line)
    torch.set_num_threads(args.threads[0])


def adpsgd_row(args: argparse.Namespace, threads: int, n: int, line: str) -> None:
    """One row: D-PSGD and AD-PSGD rounds alternate (a slow spell hits both)."""
    runs: dict[str, tuple[Algorithm, Context]] = {}
    for name, algorithm in (
        ("dpsgd", SynchronousGossip(DecentralizedSGD(), ring(n))),
        ("adpsgd", AsynchronousGossip(ring(n))),
    ):
        ctx = context(n, args.batch)
        algorithm.setup(ctx)
        one_round(algorithm, ctx)  # warm-up: buffers and optimizer state
        runs[name] = (algorithm, ctx)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (algorithm, ctx) in runs.items():
            times[name].append(one_round(algorithm, ctx))
    sync, asynchronous = min(times["dpsgd"]), min(times["adpsgd"])
    waves = getattr(runs["adpsgd"][0], "waves", 0)
    ratio = f"{asynchronous / sync:.2f}x"
    print(
        line.format(threads, n, f"{sync:.3f}", f"{asynchronous:.3f}", ratio, waves),
        flush=True,
    )


def fedavg_rows(args: argparse.Namespace) -> None:
    n = args.fedavg_peers
    print(
        f"\nFedAvg, {n} clients, 5 local steps, batch {args.batch}: seconds per round, best of "
        f"{args.rounds} after a warm-up"
    )
    line = "{:>9} {:>9} {:>8} {:>7}"
    print(line.format("fraction", "clients", "s/round", "ratio"))
    full = None
    for fraction in (1.0, 0.1):
        ctx = context(n, args.batch)
        algorithm = FedAvg(local_steps=5, fraction=fraction)
        algorithm.setup(ctx)
        one_round(algorithm, ctx)
        best = min(one_round(algorithm, ctx) for _ in range(args.rounds))
        full = best if full is None else full
        clients = max(1, round(fraction * n))
        print(line.format(fraction, clients, f"{best:.3f}", f"{best / full:.2f}x"), flush=True)


def child_spec(args: argparse.Namespace, **fields: Any) -> dict[str, Any]:
    base = {
        "batch": args.batch,
        "rounds": args.rounds,
        "threads": args.threads[0],
        "momentum": 0.9,
        "kernel": args.kernel,
    }
    return base | fields


def byzantine_rows(args: argparse.Namespace) -> None:
    n = args.byzantine_peers
    bad = max(1, n // 10)
    print(
        f"\nD-PSGD, trimmed mean (b=2), random 8-regular graph, {n} peers, batch {args.batch}: "
        f"seconds per round (best of {args.rounds}) and peak memory (child process)"
    )
    line = "{:>26} {:>8} {:>10}"
    print(line.format("peers sending", "s/round", "peak GiB"))
    for label, fields in (
        ("all honest", {}),
        (f"{bad} Byzantine, sign-flip", {"byzantine": bad, "attack": "sign-flip"}),
        (f"{bad} Byzantine, alie", {"byzantine": bad, "attack": "alie"}),
    ):
        spec = child_spec(args, algorithm="dpsgd", peers=n, rule="trimmed-mean:b=2", **fields)
        result = in_child(spec)
        print(
            line.format(label, f"{min(result['seconds']):.3f}", f"{result['peak'] / 2**30:.2f}"),
            flush=True,
        )


def scale_rows(args: argparse.Namespace) -> None:
    n = args.scale_peers
    matrix = n * parameter_count(model()) * BYTES_PER_VALUE
    momentum = args.scale_momentum
    state = 1 if momentum else 0  # SGD's momentum buffer: one more [n, d]
    copies = {"dpsgd": 2 + state, "adpsgd": 1 + state}  # + D-PSGD's mixing buffer
    print(
        f"\n{n:,} peers x mlp-100k (one [n, d] = {matrix / 2**30:.2f} GiB), ring, batch "
        f"{args.batch}, SGD momentum {momentum}: seconds per round (best of {args.rounds} after "
        "a warm-up) and peak memory (child process)"
    )
    line = "{:>9} {:>8} {:>10} {:>12} {:>12}"
    print(line.format("algorithm", "s/round", "peak GiB", "[n, d] held", "waves/round"))
    for name, label in (("dpsgd", "D-PSGD"), ("adpsgd", "AD-PSGD")):
        needed = copies[name] * matrix
        free = available_bytes()
        if free is not None and free < needed * 1.1:
            print(
                f"{label:>9} skipped: needs about {needed / 2**30:.1f} GiB, "
                f"{free / 2**30:.1f} GiB available"
            )
            continue
        spec = child_spec(args, algorithm=name, peers=n, momentum=momentum)
        result = in_child(spec)
        waves = result["waves"] if result["waves"] is not None else "-"
        print(
            line.format(
                label,
                f"{min(result['seconds']):.2f}",
                f"{result['peak'] / 2**30:.2f}",
                copies[name],
                waves,
            ),
            flush=True,
        )


def gpt_rows(args: argparse.Namespace) -> None:
    n, batch, length = args.gpt_peers, args.gpt_batch, args.gpt_context
    device = torch.device(args.gpt_device)

    def factory() -> torch.nn.Module:
        return build_model(args.gpt_model, (length,), 256, seed=0)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    generator = torch.Generator().manual_seed(0)
    data = [
        (
            torch.randint(0, 256, (n, batch, length), generator=generator).to(device),
            torch.randint(0, 256, (n, batch, length), generator=generator).to(device),
        )
        for _ in range(args.steps + 1)
    ]

    def engine(kernel: str = "auto") -> float:
        peers = BatchedPeers(factory, n, seed=0, device=device, kernel=kernel)
        trainer = BlockedOptimizer(peers, peers.params, sgd)
        times = []
        for x, y in data:
            synchronize()
            start = time.perf_counter()
            trainer.step(x, y)
            synchronize()
            times.append(time.perf_counter() - start)
        return min(times[1:])

    def loop() -> float:
        reference = ReferencePeers(
            factory().to(device),
            n,
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
        )
        times = []
        for x, y in data:
            synchronize()
            start = time.perf_counter()
            reference.step(x, y)
            synchronize()
            times.append(time.perf_counter() - start)
        return min(times[1:])

    print(
        f"\ngpt {args.gpt_model!r} on {device}: {parameter_count(factory()):,} parameters, {n} "
        f"peers, batch "
        f"{batch} contexts of {length} bytes; training peer-steps per second (gradient + SGD "
        f"momentum), best of {args.steps} steps, medians of {args.repeats} alternating repeats"
    )
    line = "{:>7} {:>12} {:>12} {:>14} {:>7} {:>14} {:>11}"
    print(
        line.format(
            "threads",
            "gpt kernel",
            "vmap(grad)",
            "per-peer loop",
            "ratio",
            "ratio range",
            "vmap ratio",
        )
    )
    for threads in args.threads:
        torch.set_num_threads(threads)
        runs = [(engine("gpt"), engine("vmap"), loop()) for _ in range(args.repeats)]
        fast = statistics.median(r[0] for r in runs)
        vmapped = statistics.median(r[1] for r in runs)
        slow = statistics.median(r[2] for r in runs)
        ratios = sorted(r[2] / r[0] for r in runs)
        print(
            line.format(
                threads,
                f"{n / fast:,.0f}",
                f"{n / vmapped:,.0f}",
                f"{n / slow:,.0f}",
                f"{statistics.median(ratios):.2f}x",
                f"{ratios[0]:.2f}-{ratios[-1]:.2f}x",
                f"{statistics.median(r[2] / r[1] for r in runs):.2f}x",
            ),
            flush=True,
        )
    torch.set_num_threads(args.threads[0])


ROW_RUNNERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "adpsgd": adpsgd_rows,
    "fedavg": fedavg_rows,
    "byzantine": byzantine_rows,
    "scale": scale_rows,
    "gpt": gpt_rows,
}


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
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"comma-separated rows to run, of {', '.join(ROWS)} (default: all; 'throughput' is "
        "the table above and the memory row)",
    )
    parser.add_argument("--batch", type=int, default=32, help="batch size of the round rows")
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed rounds per round row, after a warm-up"
    )
    parser.add_argument("--adpsgd-sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--fedavg-peers", type=int, default=256)
    parser.add_argument("--byzantine-peers", type=int, default=256)
    parser.add_argument("--scale-peers", type=int, default=10_000)
    parser.add_argument(
        "--scale-momentum",
        type=float,
        default=0.9,
        help="SGD momentum of the scale rows (0: no momentum buffer, one [n, d] less)",
    )
    parser.add_argument("--gpt-model", default="gpt", help="the gpt row's model spec")
    parser.add_argument("--gpt-peers", type=int, default=16)
    parser.add_argument("--gpt-batch", type=int, default=8, help="contexts per peer and step")
    parser.add_argument("--gpt-context", type=int, default=64, help="bytes per context")
    parser.add_argument("--gpt-device", default="cpu", help="the gpt row's device (cpu, cuda)")
    parser.add_argument("--child-memory", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.sizes + args.batch_sizes + args.threads + [args.steps, args.repeats]) < 1:
        parser.error("--sizes, --batch-sizes, --threads, --steps and --repeats must be >= 1")
    rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or not rows:
        parser.error(f"--rows: must name some of {', '.join(ROWS)}, got {args.rows!r}")
    sizes = [*args.adpsgd_sizes, args.fedavg_peers, args.byzantine_peers, args.scale_peers]
    if min([*sizes, args.batch, args.rounds]) < 1:
        parser.error("--batch, --rounds and the peer counts of the round rows must be >= 1")
    KERNEL["name"] = args.kernel
    if args.child_memory:
        torch.set_num_threads(args.threads[0])
        peak_memory_child(args.child_memory, args.batch_sizes[0])
        return 0
    if args.child_run:
        spec = json.loads(args.child_run)
        KERNEL["name"] = spec["kernel"]
        child_run(spec)
        return 0
    print(f"{time.strftime('%Y-%m-%d')}: {' '.join(sys.argv)}")
    if "throughput" in rows:
        throughput_rows(args, default_threads)
    torch.set_num_threads(args.threads[0])
    for row in rows:
        if row != "throughput":
            ROW_RUNNERS[row](args)
    return 0


def throughput_rows(args: argparse.Namespace, default_threads: int) -> None:
    """The vectorized engine against the naive per-peer loop, and the memory row."""
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


if __name__ == "__main__":
    sys.exit(main())
