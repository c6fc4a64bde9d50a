"""One push-pull exchange between two peers over loopback, beside torch.distributed (gloo).

For each model size, in the same run:

* ``peer signed``: one ``Peer.gossip()`` (async mode, codec ``none``) from a caller
  to a callee running in another process: snapshot, msgpack envelope, HMAC-signed
  ``POST /v1/exchange``, validation, atomic averaging on the callee, the signed
  answer, validation and mixing on the caller. The model's bytes cross the
  loopback twice (there and back).
* ``peer open``: the same without a swarm secret (no HMAC over the bodies).
* ``gloo``: ``dist.send`` then ``dist.recv`` of the same number of bytes between
  two processes (``init_method=tcp://127.0.0.1:PORT``): the same bytes moved both
  ways, with no serialization, validation or mixing. This is the reference.

MB/s counts both directions (2 x model bytes per exchange). Ratio = time / gloo time.
Median of ``--repeats`` after one warm-up. Run::

    .venv/bin/python bench/exchange.py               # 1, 4, 16, 64 MB
    .venv/bin/python bench/exchange.py --sizes 1,4 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import statistics
import sys
import time
import warnings
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SECRET = b"bench-swarm-secret-0123456789"


class FlatModel(torch.nn.Module):
    """A model that is just ``numel`` float32 parameters."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.sum()


def _peer(peer_id: str, numel: int, secret: bytes | None, **config: Any) -> Any:
    from peer.config import PeerConfig
    from peer.node import Peer

    torch.manual_seed(len(peer_id))
    return Peer(
        FlatModel(numel),
        lambda params: torch.optim.SGD(params, lr=0.0),
        torch.nn.functional.mse_loss,
        [],
        PeerConfig(peer_id=peer_id, secret=secret, request_timeout_s=120.0, **config),
    )


def _quiet() -> None:
    """The open-swarm warning is expected here (the 'peer open' column)."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.getLogger("peer").setLevel(logging.ERROR)


def _serve(numel: int, secret: bytes | None, queue: Queue[str], stop: Event) -> None:
    _quiet()

    async def main() -> None:
        peer = _peer("callee", numel, secret)
        await peer.start()
        queue.put(peer.address)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await peer.stop()

    asyncio.run(main())


def time_peer(numel: int, secret: bytes | None, repeats: int) -> float:
    context = mp.get_context("spawn")
    queue: Queue[str] = context.Queue()
    stop = context.Event()
    server = context.Process(target=_serve, args=(numel, secret, queue, stop))
    server.start()
    try:
        address = queue.get(timeout=120)

        async def main() -> list[float]:
            caller = _peer(
                "caller", numel, secret, client_only=True, join=(address,), fetch_state=False
            )
            await caller.start()
            times = []
            try:
                for _ in range(repeats + 1):
                    started = time.perf_counter()
                    if await caller.gossip() != 1:
                        raise RuntimeError("exchange failed")
                    times.append(time.perf_counter() - started)
            finally:
                await caller.stop()
            return times[1:]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return statistics.median(asyncio.run(main()))
    finally:
        stop.set()
        server.join(timeout=30)


def _gloo(rank: int, port: int, numel: int, repeats: int, queue: Queue[float]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mine, theirs = torch.randn(numel), torch.empty(numel)
    dist.barrier()
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        if rank == 0:
            dist.send(mine, 1)
            dist.recv(theirs, 1)
        else:
            dist.recv(theirs, 0)
            dist.send(mine, 0)
        times.append(time.perf_counter() - started)
    if rank == 0:
        queue.put(statistics.median(times[1:]))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def time_gloo(numel: int, repeats: int) -> float:
    context = mp.get_context("spawn")
    queue: Queue[float] = context.Queue()
    port = _free_port()
    workers = [context.Process(target=_gloo, args=(r, port, numel, repeats, queue)) for r in (0, 1)]
    for w in workers:
        w.start()
    result = queue.get(timeout=300)
    for w in workers:
        w.join(timeout=30)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="1,4,16,64", help="model sizes in MB (float32), comma-separated"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed exchanges per size (median)")
    args = parser.parse_args(argv)
    _quiet()
    try:
        sizes = [float(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be comma-separated numbers of MB, got {args.sizes!r}")
    if any(s <= 0 for s in sizes):
        parser.error("--sizes must all be > 0")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    header = (
        f"{'model MB':>8}  {'peer signed ms':>14}  {'MB/s':>7}  {'ratio':>5}  "
        f"{'peer open ms':>12}  {'MB/s':>7}  {'ratio':>5}  {'gloo ms':>8}  {'MB/s':>7}"
    )
    print(header)
    print("-" * len(header))
    for size in sizes:
        numel = int(size * 2**20) // 4
        moved = 2 * numel * 4 / 2**20
        gloo = time_gloo(numel, args.repeats)
        signed = time_peer(numel, SECRET, args.repeats)
        open_ = time_peer(numel, None, args.repeats)
        print(
            f"{size:>8g}  {signed * 1e3:>14.1f}  {moved / signed:>7.0f}  {signed / gloo:>5.1f}  "
            f"{open_ * 1e3:>12.1f}  {moved / open_:>7.0f}  {open_ / gloo:>5.1f}  "
            f"{gloo * 1e3:>8.1f}  {moved / gloo:>7.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
