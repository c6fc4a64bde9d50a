"""What each compressor costs and saves: wire bytes, and time on both paths, against a copy.

    python bench/compressors.py [--d D] [--n N] [--repeats R]     # default d=1e6, n=16, R=7

For every codec: bytes per message (exact, ``len(msgpack.packb(payload))``) and its ratio to
``none``; the batched path (``compress`` of ``[n, d]``, the simulator's call); the wire path
split into a sender's half (``encode`` + ``msgpack.packb`` of one ``[d]`` vector) and a
receiver's half (``msgpack.unpackb`` + ``decode``, which validates everything); and the
relative error ``|C(x) - x| / |x|`` on a Gaussian vector. Times are the fastest of R runs
(the steadiest estimate on a shared machine) and each comes with its ratio to ``clone()`` of
the same tensor (``[n, d]`` for the batched path, ``[d]`` for the wire halves) measured in the
same run, a floor that carries over between machines better than milliseconds.
"""

from __future__ import annotations

import argparse
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


def _best_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=1_000_000, help="coordinates per vector")
    parser.add_argument("--n", type=int, default=16, help="nodes in the batched path")
    parser.add_argument("--repeats", type=int, default=7, help="runs per measurement")
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
        batched = _best_ms(lambda: codec.compress(batch, generator), args.repeats)  # noqa: B023
        codec.reset()  # error feedback keeps a residual per batch shape
        send = _best_ms(lambda: msgpack.packb(codec.encode(vector, generator)), args.repeats)  # noqa: B023
        packed = msgpack.packb(codec.encode(vector, generator))
        receive = _best_ms(lambda: codec.decode(msgpack.unpackb(packed), args.d), args.repeats)  # noqa: B023
        codec.reset()
        error = float((codec.compress(vector, generator).values - vector).norm() / vector.norm())
        rows.append((spec, codec.wire_bytes(args.d), batched, send, receive, error))
    copy_batch = _best_ms(batch.clone, args.repeats)
    copy_vector = _best_ms(vector.clone, args.repeats)

    base_bytes = rows[0][1]
    print(
        f"d={args.d:,}, n={args.n}, best of {args.repeats} runs, 1 thread; clone() of [n, d] "
        f"{copy_batch:.2f} ms, of [d] {copy_vector:.2f} ms (torch {torch.__version__})"
    )
    header = (
        f"{'codec':<31}{'bytes':>9}{'/none':>8}{'batched ms':>11}{'/clone':>7}"
        f"{'send ms':>9}{'/clone':>7}{'receive ms':>11}{'/clone':>7}{'rel. error':>11}"
    )
    print(header)
    print("-" * len(header))
    for spec, nbytes, batched, send, receive, error in rows:
        print(
            f"{spec:<31}{nbytes:>9}{nbytes / base_bytes:>8.4f}{batched:>11.2f}"
            f"{batched / copy_batch:>7.1f}{send:>9.2f}{send / copy_vector:>7.1f}"
            f"{receive:>11.2f}{receive / copy_vector:>7.1f}{error:>11.2e}"
        )


if __name__ == "__main__":
    main()
