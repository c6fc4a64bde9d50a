"""Milliseconds per call of every consensus rule, with the ratio to the weighted mean.

One node (no batch) with k neighbours of d float32 coordinates on CPU, the
shape a peer aggregates every round, with uniform mixing weights 1/(k+1) (a
regular graph); the last rows repeat the order statistics with unequal weights.
Each rule runs ``--repeat`` times after one warm-up call (the mean also at the
end); the table shows the fastest call (on a shared machine the
minimum is the steadiest estimate of the cost). Ratios compare rules measured in
the same run, so they carry over between machines better than milliseconds.

    .venv/bin/python bench/consensus_rules.py            # k = 16, d = 1,000,000
    .venv/bin/python bench/consensus_rules.py --d 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

import consensus


def budget(k: int) -> int:
    """Half of Krum's largest f for n = k + 1 (n > 2f + 2), at least 1: 3 for k = 16."""
    return max((k - 2) // 2, 0) // 2 or 1


def specs(k: int) -> list[str]:
    """Every registered rule (wrappers in front of one rule), with budgets that fit n = k + 1."""
    n = k + 1
    f_krum = budget(k)
    f_bulyan = max((n - 3) // 4, 0)
    return [
        "mean",
        "median",
        f"trimmed-mean:b={f_krum}",
        f"krum:f={f_krum}",
        f"multi-krum:f={f_krum}",
        f"bulyan:f={f_bulyan}",
        "geometric-median:T=5",
        "centered-clipping:tau=1,L=1",
        "centered-clipping:tau=1,L=3",
        "clipped-gossip:tau=1",
        f"clipped-gossip:tau=auto,f={f_krum}",
        "bucketing:s=2+median",
        f"nnm+krum:f={f_krum}",
    ]


def time_rule(
    spec: str, own: torch.Tensor, neighbours: torch.Tensor, weights: torch.Tensor, repeat: int
) -> float:
    rule = consensus.build(spec)
    rule(own, neighbours, weights)  # warm-up (allocator, first-call paths)
    times = []
    for _ in range(repeat):
        rule.reset()
        start = time.perf_counter()
        rule(own, neighbours, weights)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=16, help="neighbours (default 16)")
    parser.add_argument("--d", type=int, default=1_000_000, help="coordinates (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per rule (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("k", "d", "repeat", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    own = torch.randn(args.d, generator=g)
    neighbours = own + 0.1 * torch.randn(args.k, args.d, generator=g)
    weights = torch.full((args.k,), 1.0 / (args.k + 1))
    print(
        f"consensus rules, one node: k={args.k} neighbours, d={args.d:,} float32, "
        f"{args.threads} thread(s), best of {args.repeat} (torch {torch.__version__})"
    )
    rows = [
        (spec, time_rule(spec, own, neighbours, weights, args.repeat)) for spec in specs(args.k)
    ]
    # unequal weights (an irregular graph) take the torch.sort path of the order statistics
    unequal = torch.linspace(0.5, 1.5, args.k) / (args.k + 1)
    for spec in ("median", f"trimmed-mean:b={budget(args.k)}"):
        ms = time_rule(spec, own, neighbours, unequal, args.repeat)
        rows.append((f"{spec} (unequal weights)", ms))
    # the reference is timed again at the end: other jobs on a shared machine come and go
    reference = min(rows[0][1], time_rule("mean", own, neighbours, weights, args.repeat))
    rows[0] = ("mean", reference)
    width = max(len(spec) for spec, _ in rows)
    print(f"{'rule':<{width}}  {'ms/call':>9}  {'x mean':>7}")
    for spec, ms in rows:
        print(f"{spec:<{width}}  {ms:>9.1f}  {ms / reference:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
