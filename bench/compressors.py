"""What each codec costs and saves at model sizes: encode and decode time beside ``clone()``.

    python bench/compressors.py                          # 10M and 100M parameters, every codec
    python bench/compressors.py --sizes 1M,10M --codec qsgd:bits=4 --codec topk:ratio=0.01
    python bench/compressors.py --batched 1024x100000    # also the simulator's batched path
    python bench/compressors.py --markdown               # tables as markdown

For every codec and size ``d`` (float32 parameters): the payload's exact bytes on the wire
(``len(msgpack.packb(payload))``) and their ratio to dense float32 (``none``); the wire path's
two halves, ``encode`` (``x [d] -> payload``, what a sender computes) and ``decode``
(``payload -> [d]`` with every check a receiver runs, from the payload as received: byte
fields as ``bytes``); each beside ``clone()`` of the same vector measured in the same run, a
floor that carries over between machines better than milliseconds (a fresh 400 MB tensor
costs its page faults); and the relative error ``|C(x) - x| / |x|`` on a Gaussian vector.
With ``--batched NxD``: the simulator's path, ``compress`` of ``[N, D]`` rows with one
generator per row (as ``sim.gossip_runner`` draws), beside ``clone()`` of ``[N, D]``.

Times are medians of ``--repeats`` runs after one warm-up, in one thread (``--threads``), by
the wall clock or (``--clock cpu``) the thread's CPU time, which other processes on a shared
machine disturb much less.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch

from gossip.compression import build_compressor, node_generators

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
    "chunked-topk",
    "chunked-topk:k=128",
    "chunked-topk:feedback=true",
]

_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9}


def parse_count(text: str) -> int:
    """``"10M"`` -> 10_000_000; plain integers and ``1e7`` pass too."""
    text = text.strip()
    scale = _SUFFIXES.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in _SUFFIXES else text
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (e.g. 100000, 10M, 1e8)") from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"a count must be a whole number >= 1, got {text!r}")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    return [parse_count(part) for part in text.split(",") if part.strip()]


def parse_batch(text: str) -> tuple[int, int] | None:
    """``"1024x100000"`` -> (1024, 100000); ``"none"`` -> None."""
    if text.strip().lower() == "none":
        return None
    rows, sep, d = text.lower().partition("x")
    if not sep:
        raise argparse.ArgumentTypeError(f"--batched must look like NxD or none, got {text!r}")
    return parse_count(rows), parse_count(d)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}
"""``wall``: elapsed time; ``cpu``: this thread's CPU time (steadier on a shared machine, and
the same work: every kernel runs in the calling thread at ``--threads 1``)."""


def median_ms(call: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    """Median time of ``repeats`` calls after one warm-up, in milliseconds, by ``clock``."""
    call()
    times = []
    for _ in range(repeats):
        start = clock()
        call()
        times.append(clock() - start)
    return statistics.median(times) * 1e3


def as_received(payload: dict) -> dict:
    """What a receiver holds: byte fields as ``bytes`` (msgpack's output), without packing."""
    return {
        key: bytes(value) if isinstance(value, memoryview) else value
        for key, value in payload.items()
    }


def human(count: int) -> str:
    for suffix, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if count >= scale and count % scale == 0:
            return f"{count // scale}{suffix}"
    return str(count)


def vector_rows(
    d: int, specs: list[str], repeats: int, clock: Callable[[], float]
) -> tuple[float, list[tuple]]:
    """clone() of [d], and per codec: bytes, /dense, encode, decode, error."""
    x = torch.randn(d, generator=torch.Generator().manual_seed(0))
    copy = median_ms(x.clone, repeats, clock)
    dense = build_compressor("none").wire_bytes(d)
    rows = []
    for spec in specs:
        codec = build_compressor(spec)
        generator = torch.Generator().manual_seed(1)
        encode = median_ms(lambda: codec.encode(x, generator), repeats, clock)  # noqa: B023
        received = as_received(codec.encode(x, generator))
        decode = median_ms(lambda: codec.decode(received, d), repeats, clock)  # noqa: B023
        first = build_compressor(spec)  # error feedback's first message: C(x), as the others
        decoded = first.decode(as_received(first.encode(x, generator)), d)
        error = float((decoded.float() - x).norm() / x.norm())
        nbytes = codec.wire_bytes(d)
        rows.append(
            (
                spec,
                human(d),
                nbytes,
                nbytes / dense,
                encode,
                encode / copy,
                decode,
                decode / copy,
                error,
            )
        )
    return copy, rows


def batched_rows(
    n: int, d: int, specs: list[str], repeats: int, clock: Callable[[], float]
) -> tuple[float, list[tuple]]:
    """clone() of [n, d], and per codec the batched compress with per-row generators."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    copy = median_ms(x.clone, repeats, clock)
    names = [f"peer-{i}" for i in range(n)]
    rows = []
    for spec in specs:
        codec = build_compressor(spec)
        generators = node_generators(0, names)

        def compress() -> None:
            codec.reset()  # noqa: B023 - error feedback keeps a residual per batch
            codec.compress(x, generators)  # noqa: B023

        took = median_ms(compress, repeats, clock)
        rows.append((spec, f"{n}x{human(d)}", took, took / copy))
    return copy, rows


def table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{widths[0]}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*header), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    return "\n".join(lines + [fmt.format(*row) for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes("10M,100M"),
        help="parameters per vector, comma separated (default 10M,100M)",
    )
    parser.add_argument(
        "--codec",
        action="append",
        dest="codecs",
        metavar="SPEC",
        help="a codec spec (repeatable; default: every codec)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per measurement (median)"
    )
    parser.add_argument(
        "--batched",
        type=parse_batch,
        default=None,
        metavar="NxD",
        help="also time the simulator's batched compress of [N, D] rows (e.g. 1024x100000)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time (default); cpu: the thread's CPU time, steadier on a shared "
        "machine (valid with --threads 1)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    args = parser.parse_args()
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    specs = args.codecs or SPECS
    for spec in specs:
        try:
            build_compressor(spec)
        except ValueError as error:
            parser.error(f"--codec {spec!r}: {error}")
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu counts one thread: use it with --threads 1")
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]

    command = "python bench/compressors.py " + " ".join(sys.argv[1:])
    print(
        f"{command.strip()}\n{datetime.date.today().isoformat()}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {args.threads} thread(s), "
        f"median of {args.repeats} runs after a warm-up, {args.clock} clock"
    )
    for d in args.sizes:
        copy, rows = vector_rows(d, specs, args.repeats, clock)
        print(f"\nd = {human(d)} float32 parameters: clone() {copy:.1f} ms")
        header = [
            "codec",
            "d",
            "bytes",
            "/dense",
            "encode ms",
            "/clone",
            "decode ms",
            "/clone",
            "rel. error",
        ]
        cells = [
            [
                spec,
                size,
                f"{nbytes:,}",
                f"{ratio:.4f}",
                f"{enc:.1f}",
                f"{enc_ratio:.2f}",
                f"{dec:.1f}",
                f"{dec_ratio:.2f}",
                f"{error:.2e}",
            ]
            for spec, size, nbytes, ratio, enc, enc_ratio, dec, dec_ratio, error in rows
        ]
        print(table(header, cells, args.markdown))
    if args.batched is not None:
        n, d = args.batched
        copy, rows = batched_rows(n, d, specs, args.repeats, clock)
        print(
            f"\nbatched (simulator) compress of [{n}, {human(d)}], one generator per row: clone() {copy:.1f} ms"
        )
        cells = [[spec, shape, f"{took:.1f}", f"{ratio:.2f}"] for spec, shape, took, ratio in rows]
        print(table(["codec", "n x d", "compress ms", "/clone"], cells, args.markdown))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak resident memory {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
