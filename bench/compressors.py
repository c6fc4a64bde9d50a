"""What each compressor costs and saves: wire bytes, and time on both paths, relative to `none`.

    python bench/compressors.py [--d D] [--n N] [--repeats R]     # default d=1e6, n=16, R=5

For every codec: bytes per message (exact, ``len(msgpack.packb(payload))``) and its ratio to
``none``; the batched path (``compress`` of ``[n, d]``, the simulator's call) and the wire path
(``encode`` + ``msgpack.packb`` + ``unpackb`` + ``decode`` of one ``[d]`` vector, a peer's
send and receive), each as the median of R runs and as a ratio to ``none`` measured in the
same run; and the relative error ``|C(x) - x| / |x|`` on a Gaussian vector.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import msgpack
import torch

from gossip.compression import build_compressor

SPECS = [
    "none",
    "fp16",
    "bf16",
    "qsgd:bits=8",
    "qsgd:bits=4",
    "qsgd:bits=2",
    "topk:ratio=0.01",
    "randk:ratio=0.01",
    "topk:ratio=0.01,feedback=true",
]


def _median_seconds(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=1_000_000, help="coordinates per vector")
    parser.add_argument("--n", type=int, default=16, help="nodes in the batched path")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement")
    args = parser.parse_args()
    if args.d < 1 or args.n < 1 or args.repeats < 1:
        parser.error("--d, --n and --repeats must be >= 1")
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randn(args.n, args.d, generator=generator)
    vector = batch[0].clone()

    rows = []
    for spec in SPECS:
        codec = build_compressor(spec)
        batched_s = _median_seconds(lambda: codec.compress(batch, generator), args.repeats)  # noqa: B023
        codec.reset()  # error feedback keeps a residual per batch shape

        def wire() -> None:
            packed = msgpack.packb(codec.encode(vector, generator))  # noqa: B023
            codec.decode(msgpack.unpackb(packed), args.d)  # noqa: B023

        wire_s = _median_seconds(wire, args.repeats)
        codec.reset()
        error = float((codec.compress(vector, generator).values - vector).norm() / vector.norm())
        rows.append((spec, codec.wire_bytes(args.d), batched_s, wire_s, error))

    _, base_bytes, base_batched, base_wire, _ = rows[0]
    print(f"d={args.d}, n={args.n}, median of {args.repeats} runs, 1 thread; ratios vs 'none'")
    header = (
        f"{'codec':<32}{'bytes':>11}{'bytes/none':>12}{'batched s':>11}{'÷none':>8}"
        f"{'wire s':>10}{'÷none':>8}{'rel. error':>12}"
    )
    print(header)
    print("-" * len(header))
    for spec, nbytes, batched_s, wire_s, error in rows:
        print(
            f"{spec:<32}{nbytes:>11}{nbytes / base_bytes:>12.4f}{batched_s:>11.4f}"
            f"{batched_s / base_batched:>8.1f}{wire_s:>10.4f}{wire_s / base_wire:>8.1f}"
            f"{error:>12.2e}"
        )


if __name__ == "__main__":
    main()
