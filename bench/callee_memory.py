"""A callee under many concurrent callers: its peak memory in model copies, and the share of
its own training it keeps while it serves.

For each slot bound ``C`` (``--slots``), a callee process runs an async peer (AD-PSGD, codec
``none``, plain SGD: no optimizer state) whose model is an MLP of about ``--numel`` float32
parameters, training back to back in its round loop, served by ``peer.transport.server.make_runner``.
This process then runs, for ``--seconds`` each, an idle period and one period per caller
count (``--callers``): that many concurrent callers, each sending stream-signed exchanges
(``POST /v1/exchange``, a model-sized body with its Poly1305 tag) back to back and reading
each answer to the end. The callee reports, per period, its training steps/s and the kernel's
peak RSS (VmHWM, reset at the start of the period).

Columns:

* ``served``: exchanges answered 200 in the period;
* ``held``: the callee's RSS at the start of the period beyond its imports and torch's
  one-time allocations, in model copies (the model, its gradient, the receive buffers kept
  for reuse: up to C);
* ``peak``: the peak RSS in the period beyond the same baseline, in model copies;
* ``growth``: ``peak`` minus the idle period's peak (training's own transients are in both):
  what serving added;
* ``bound``: what docs/protocol.md says serving adds at most, :func:`serving_bound`:
  ``2C + C/4 + 1`` copies and the connections' and unauthenticated bodies' bytes;
* ``busy`` / ``other``: ``409 busy``, and anything else (``429 overloaded`` beyond the
  connection bound, connections reset as they were refused);
* ``steps/s``: the callee's training steps per second; ``share``: steps/s while serving over
  steps/s idle, in the same run.

With two CPUs or more the callee is pinned to one and the callers to another, so the share is
what serving takes from training inside the callee (one core for both: training in a worker
thread, serving on the event loop and in worker threads). Run::

    .venv/bin/python bench/callee_memory.py                     # C = 1, 8; 1, 8, 64 callers
    .venv/bin/python bench/callee_memory.py --numel 4000000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import resource
import secrets
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"bench-swarm-secret-0123456789"
CALLEE = "callee"
BACKOFF_S = 0.1
"""A caller refused (busy, overloaded, unreachable) waits this long before its next call, as
a peer does by taking a training step first."""


# ---------------------------------------------------------------------- the callee process


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> None:
    """Restart the kernel's peak-RSS counter (VmHWM) at the current RSS."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def _mlp_width(numel: int) -> int:
    return max(8, int(numel**0.5))


def _mlp(numel: int) -> torch.nn.Sequential:
    """``Linear(w, w) -> ReLU -> Linear(w, 10)`` with about ``numel`` parameters."""
    width = _mlp_width(numel)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
    )


def _warm_up_torch() -> None:
    """Run once what training runs, on a tiny model: torch's one-time allocations (thread
    pools, kernels' workspaces) then belong to the baseline, not to the model's copies."""
    from gossip.flat import FlatParameters

    tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    flat = FlatParameters(tiny)
    optimizer = torch.optim.SGD([flat.parameter], lr=0.1)
    torch.nn.functional.cross_entropy(
        tiny(torch.randn(4, 8)), torch.tensor([0, 1, 0, 1])
    ).backward()
    optimizer.step()


async def _callee(numel: int, slots: int) -> None:
    from aiohttp import web

    from peer.node.config import PeerConfig
    from peer.node.peer import Peer
    from peer.transport.server import make_runner

    _warm_up_torch()
    baseline = _rss_bytes()
    torch.manual_seed(0)
    model = _mlp(numel)
    width = _mlp_width(numel)
    batches = [(torch.randn(32, width), torch.randint(0, 10, (32,))) for _ in range(4)]
    config = PeerConfig(
        peer_id=CALLEE,
        mode="async",
        secret=SECRET,
        max_concurrent_exchanges=slots,
        request_timeout_s=60.0,
    )
    peer = Peer(
        model,
        lambda params: torch.optim.SGD(params, lr=1e-3),
        torch.nn.functional.cross_entropy,
        batches,
        config,
    )
    await peer.start()
    runner = make_runner(peer)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()

    async def train() -> None:
        while True:
            await peer.run_round()

    training = asyncio.create_task(train())
    model_bytes = peer.spec.num_bytes
    print(
        json.dumps(
            {
                "address": f"127.0.0.1:{runner.addresses[0][1]}",
                "numel": peer.spec.numel,
                "model_bytes": model_bytes,
            }
        ),
        flush=True,
    )
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "mark":
            break
        now = time.monotonic()
        print(
            json.dumps(
                {
                    "time": now,
                    "steps": peer.step,
                    "rss": _rss_bytes() - baseline,
                    "peak": _peak_rss_bytes() - baseline,
                }
            ),
            flush=True,
        )
        _reset_peak()
    training.cancel()
    await runner.cleanup()
    await peer.stop()


# ---------------------------------------------------------------------- the callers


MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
"""glibc serves allocations of 1 MiB and more straight from mmap, and gives them back when
freed (its default threshold grows up to 32 MiB after a large free, so freed model-sized
buffers would stay in its heap and in RSS): RSS then counts the model copies alive."""


CALLEE_CPU = 0
CALLERS_CPU = -1
"""With two CPUs or more, the callee runs on the first and the callers on the last, so the
share measures what serving takes from training inside the callee, not the callers' load."""


def _pin(which: int) -> None:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[which]})


class Callee:
    """The callee process, driven over its stdin/stdout."""

    def __init__(self, numel: int, slots: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--child", str(numel), str(slots)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT), **MALLOC_ENV},
            text=True,
        )
        ready = self._read()
        self.address = str(ready["address"])
        self.numel = int(ready["numel"])
        self.model_bytes = int(ready["model_bytes"])

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the callee process ended")
        loaded: dict[str, Any] = json.loads(line)
        return loaded

    def mark(self) -> dict[str, Any]:
        """Steps and memory now; the peak counter restarts."""
        assert self.process.stdin is not None
        self.process.stdin.write("mark\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _callers(callee: Callee, count: int, seconds: float) -> dict[str, int]:
    """``count`` concurrent callers exchanging back to back for ``seconds``."""
    import aiohttp

    from peer.protocol import auth
    from peer.protocol.codecs import DenseCodec
    from peer.protocol.wire import Envelope, envelope_object
    from peer.transport.body import EnvelopeBody
    from peer.transport.client import EXPECT_CONTINUE_BYTES

    payload = DenseCodec().encode(torch.full((callee.numel,), 0.5))
    outcomes = {"served": 0, "busy": 0, "other": 0}
    errors: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    url = f"http://{callee.address}/v1/exchange"

    async def caller(index: int, session: aiohttp.ClientSession) -> None:
        sender = f"caller-{index}"
        while time.monotonic() < deadline:
            nonce = secrets.token_hex(16)
            envelope = Envelope(sender=sender, round=0, step=0, codec="none", payload=payload)
            body = EnvelopeBody(
                envelope_object(envelope), tag_key=auth.body_key(SECRET, nonce, "request")
            )
            headers = auth.sign_stream_request(
                SECRET, "POST", "/v1/exchange", body.size or 0, receiver=CALLEE, nonce=nonce
            )
            try:
                async with session.post(
                    url,
                    data=body,
                    headers=headers,
                    expect100=(body.size or 0) >= EXPECT_CONTINUE_BYTES,  # as PeerClient does
                ) as response:
                    async for _ in response.content.iter_chunked(1 << 20):
                        pass
                    status = response.status
            except (aiohttp.ClientError, OSError) as error:
                status = 0
                errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
            if status == 200:
                outcomes["served"] += 1
            elif status == 409:
                outcomes["busy"] += 1
                await asyncio.sleep(BACKOFF_S)
            else:
                outcomes["other"] += 1
                errors[str(status)] = errors.get(str(status), 0) + 1
                await asyncio.sleep(BACKOFF_S)

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(caller(i, session) for i in range(count)))
    if errors:
        print(f"# {count} callers: not served nor busy: {errors}", file=sys.stderr)
    return outcomes


def measure(numel: int, slots: int, callers: list[int], seconds: float) -> list[dict[str, Any]]:
    """One callee with ``slots``: an idle period, then one per caller count."""
    callee = Callee(numel, slots)
    rows = []
    try:
        time.sleep(2.0)  # warm up: the first training steps allocate what they keep
        start = callee.mark()
        time.sleep(seconds)
        idle = callee.mark()
        idle_rate = (idle["steps"] - start["steps"]) / (idle["time"] - start["time"])
        copies = callee.model_bytes
        idle_peak = idle["peak"]
        rows.append(_row(0, slots, {}, start, idle, idle_rate, idle_rate, idle_peak, copies))
        for count in callers:
            begin = callee.mark()
            outcomes = asyncio.run(_callers(callee, count, seconds))
            end = callee.mark()
            rate = (end["steps"] - begin["steps"]) / (end["time"] - begin["time"])
            rows.append(
                _row(count, slots, outcomes, begin, end, rate, idle_rate, idle_peak, copies)
            )
    finally:
        callee.close()
    return rows


def _row(
    callers: int,
    slots: int,
    outcomes: dict[str, int],
    begin: dict[str, Any],
    end: dict[str, Any],
    rate: float,
    idle_rate: float,
    idle_peak: int,
    model_bytes: int,
) -> dict[str, Any]:
    return {
        "callers": callers,
        "slots": slots,
        "served": outcomes.get("served", 0),
        "busy": outcomes.get("busy", 0),
        "other": outcomes.get("other", 0),
        "held": begin["rss"] / model_bytes,
        "peak": end["peak"] / model_bytes,
        "growth": (end["peak"] - idle_peak) / model_bytes,
        "bound": serving_bound(slots, model_bytes),
        "steps_per_s": rate,
        "share": rate / idle_rate if idle_rate else float("nan"),
    }


def serving_bound(slots: int, model_bytes: int) -> float:
    """What serving may add to a peer's peak, in model copies (docs/protocol.md, "Memory"):
    two per slot (the request's buffer, the answer), the validation masks of the exchanges
    being checked (1/4 each, float32), one averaging temporary (one exchange at a time
    averages, under the model lock), and the part that does not scale with the model
    (``peer.transport.admission.fixed_memory_bytes``: connection buffers, the unauthenticated budget)."""
    from peer.transport.admission import ServerLimits, default_max_connections, fixed_memory_bytes

    limits = ServerLimits(
        max_concurrent_exchanges=slots, max_connections=default_max_connections(slots)
    )
    return 2 * slots + slots / 4 + 1 + fixed_memory_bytes(limits) / model_bytes


def print_table(rows: list[dict[str, Any]], numel: int, seconds: float) -> None:
    today = datetime.date.today().isoformat()
    print(
        f"# bench/callee_memory.py, {today}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{numel / 1e6:.1f}M float32 parameters, {seconds:g} s per row; memory in model copies "
        f"beyond the callee's imports"
    )
    header = (
        f"{'callers':>7} {'C':>3} {'served':>7} {'busy':>6} {'other':>5} {'held':>6} "
        f"{'peak':>6} {'growth':>7} {'bound':>6} {'steps/s':>8} {'share':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['callers']:>7} {row['slots']:>3} {row['served']:>7} {row['busy']:>6} "
            f"{row['other']:>5} {row['held']:>6.1f} {row['peak']:>6.1f} {row['growth']:>7.1f} "
            f"{row['bound']:>6.2f} {row['steps_per_s']:>8.1f} {row['share']:>6.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=4_000_000, help="model parameters")
    parser.add_argument("--slots", default="1,8", help="max_concurrent_exchanges values")
    parser.add_argument("--callers", default="1,8,64", help="concurrent caller counts")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each period")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.basicConfig(level=logging.ERROR)
    if args.child:
        torch.set_num_threads(1)
        _pin(CALLEE_CPU)
        asyncio.run(_callee(*args.child))
        return 0
    _pin(CALLERS_CPU)
    if not Path("/proc/self/clear_refs").exists():
        parser.error("this bench reads peak memory from /proc (Linux)")
    callers = [int(c) for c in args.callers.split(",")]
    rows = []
    for slots in (int(s) for s in args.slots.split(",")):
        rows += measure(args.numel, slots, callers, args.seconds)
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(rows, args.numel, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
