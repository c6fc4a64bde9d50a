"""Milliseconds per call of gossip averaging (``consensus.weighted_mean``), against ``torch.add``.

``weighted_mean`` is the one gossip average the simulator and the peer call, so its cost is
paid on every exchange. Each row times, on CPU with float32:

* ``add``: ``torch.add(own, neighbours[..., 0, :])`` -- one fresh output of the result's size,
  two vectors read. No weighted mean can do less for k = 1, so this is the floor reference
  (for d = 16M the floor is mostly the page faults of a fresh 64 MB output);
* ``mean``: ``consensus.weighted_mean(own, neighbours, weights)`` (input checks, the fused
  combination and the finiteness check on the result included);
* ``naive``: the textbook expression ``own * w_ii + (weights[..., None] * neighbours).sum(-2)``,
  which allocates a second copy of all neighbours;
* ``pair`` (k = 1, no batch): ``gossip.average_pair``, the peer's pairwise exchange.

Ratios are to ``add`` of the same size measured in the same run (interleaved, best of
``--repeat``), so they carry over between machines better than milliseconds::

    .venv/bin/python bench/weighted_mean.py                 # d = 1M and 16M, k = 1..16, batches
    .venv/bin/python bench/weighted_mean.py --quick         # d = 1M only
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

import torch

import consensus
import gossip

Case = tuple[tuple[int, ...], int, int]  # (batch, k, d)


def cases(quick: bool) -> list[Case]:
    """Unbatched k = 1..16 at d = 1M (and 16M), then simulator-style batches [n, k, d]."""
    out: list[Case] = [((), k, 1_000_000) for k in (1, 2, 4, 8, 16)]
    if not quick:
        out += [((), k, 16_000_000) for k in (1, 2, 4, 8, 16)]
    out += [((64,), 4, 250_000), ((16,), 16, 62_500), ((256,), 8, 10_000)]
    if not quick:
        out += [((16,), 16, 1_000_000)]
    return out


def best_of(calls: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Milliseconds of the fastest call of each, the calls interleaved (one warm-up each)."""
    for call in calls.values():
        call()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeat):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds * 1e3 for name, seconds in best.items()}


def measure(batch: tuple[int, ...], k: int, d: int, repeat: int, seed: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(seed)
    own = torch.randn(*batch, d, generator=g)
    neighbours = torch.randn(*batch, k, d, generator=g)
    weights = torch.rand(*batch, k, generator=g) / (k + 1)
    self_weight = 1.0 - weights.sum(-1, keepdim=True)
    calls: dict[str, Callable[[], object]] = {
        "add": lambda: torch.add(own, neighbours[..., 0, :]),
        "mean": lambda: consensus.weighted_mean(own, neighbours, weights),
    }
    if k == 1 and not batch:
        other = neighbours[0]
        calls["pair"] = lambda: gossip.average_pair(own, other)
    ms = best_of(calls, repeat)
    # timed on its own: its large temporaries, once freed, make the next call fault its pages
    naive = {"naive": lambda: own * self_weight + (weights[..., None] * neighbours).sum(-2)}
    return ms | best_of(naive, repeat)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per row (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="skip the d = 16M rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("repeat", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    print(
        f"weighted_mean, float32, {args.threads} thread(s), best of {args.repeat}, "
        f"ratios to torch.add of the same size (torch {torch.__version__})"
    )
    header = (
        f"{'shape [*, k, d]':<22}{'add ms':>9}{'mean ms':>10}{'x add':>7}"
        f"{'naive ms':>10}{'x add':>7}{'pair ms':>9}{'x add':>7}"
    )
    print(header)
    print("-" * len(header))
    measure((), 1, 1_000_000, 1, args.seed)  # warm-up: allocator, BLAS and first-call paths
    for batch, k, d in cases(args.quick):
        ms = measure(batch, k, d, args.repeat, args.seed)
        floor = ms["add"]
        shape = "[" + ", ".join(str(s) for s in (*batch, k, d)) + "]"
        pair = f"{ms['pair']:>9.2f}{ms['pair'] / floor:>7.2f}" if "pair" in ms else f"{'':>16}"
        print(
            f"{shape:<22}{floor:>9.2f}{ms['mean']:>10.2f}{ms['mean'] / floor:>7.2f}"
            f"{ms['naive']:>10.2f}{ms['naive'] / floor:>7.2f}{pair}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
