"""The terms of a real peer's time that the simulator's time model leaves out, measured.

The simulator charges a local step ``step_time`` and a message ``α + σ + M/B`` (with the
calibrated stack terms σ, S; docs/calibration.md). A real peer also pays what this script
measures on the machine at hand, for one model size (default: the default experiment's MLP on
MNIST-1D, batch 32):

* ``handoff``: a local step's two trips to a worker thread (``asyncio.to_thread`` for the
  gradient, then for the optimizer step), beyond the step itself;
* ``encode``/``decode``: building and parsing one envelope of the model (DenseCodec + msgpack,
  ``pack_envelope`` / ``unpack_envelope``), and ``tag``: the Poly1305 body tag of it (the
  stream signature; both are inside σ and S when calibrated, shown here apart), and
  ``compress``: a ``topk:ratio=0.01`` encode of the model (CHOCO's, SparseLoCo's
  compressor; calibration times the dense codec only);
* ``connect``: a fresh HTTP connection to a peer against a kept-alive one (``GET
  /v1/status``);
* ``contention``: an exchange's round trip while the callee trains (its event loop also
  dispatches its steps; the model lock is held during its gradient and step) against an idle
  callee, and the exchanges refused ``409 busy`` meanwhile (the serving share);
* ``gc``: the garbage collector's pauses during a training run with exchanges, per step;
* ``round``: a round of a training client-only peer against one idle callee, split into its
  timed local step and the rest (its exchanges, the phases' dispatch);
* ``sleep``: how late an ``asyncio.sleep`` of ``(3 - 1) x`` a step returns (what a
  ``--slowdown 3`` peer waits beyond its factor).

Both peers run in this one process and event loop (a launched swarm runs them as
processes). Run (the table goes to docs/time-model.md)::

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python bench/time_terms.py
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import logging
import os
import statistics
import time
from typing import Any

import aiohttp
import torch
from cryptography.hazmat.primitives.poly1305 import Poly1305

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.protocol.codecs import DenseCodec, build_codec
from peer.protocol.wire import Envelope, ModelSpec, pack_envelope, unpack_envelope
from workloads import build_model, load_dataset
from workloads.batching import peer_batches

SECRET = b"gossipnet-time-terms-secret-0123"


def _median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


def _workload(dataset: str, model: str, batch: int) -> tuple[Any, Any]:
    data = load_dataset(dataset)
    return data, build_model(model, data.input_shape, data.num_classes, seed=0)


def _peer(peer_id: str, data: Any, model_spec: str, batch: int, **config: Any) -> Peer:
    model = build_model(model_spec, data.input_shape, data.num_classes, seed=0)
    batches = peer_batches(data, torch.arange(data.num_train), batch, seed=0)
    return Peer(
        model,
        lambda params: torch.optim.SGD(params, lr=0.01),
        torch.nn.functional.cross_entropy,
        batches,
        PeerConfig(peer_id=peer_id, secret=SECRET, request_timeout_s=30.0, **config),
    )


async def _handoff(repeats: int) -> float:
    """Median seconds of one ``asyncio.to_thread`` round trip of a no-op."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await asyncio.to_thread(lambda: None)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _codec_and_tag(numel: int, repeats: int) -> dict[str, float]:
    vector = torch.randn(numel)
    spec = ModelSpec.of(vector)
    encode, decode, tag = [], [], []
    for _ in range(repeats):
        started = time.perf_counter()
        body = pack_envelope(
            Envelope(sender="a", round=1, codec="none", payload=DenseCodec().encode(vector))
        )
        encode.append(time.perf_counter() - started)
        started = time.perf_counter()
        envelope = unpack_envelope(body, max_bytes=2 * len(body), codecs={"none"})
        DenseCodec().decode(envelope.payload, spec)
        decode.append(time.perf_counter() - started)
        started = time.perf_counter()
        Poly1305.generate_tag(os.urandom(32), body)
        tag.append(time.perf_counter() - started)
    topk = build_codec("topk:ratio=0.01")
    compress = []
    for _ in range(repeats):
        started = time.perf_counter()
        topk.encode(vector)
        compress.append(time.perf_counter() - started)
    return {
        "compress": statistics.median(compress),
        "body_bytes": len(body),
        "encode": statistics.median(encode),
        "decode": statistics.median(decode),
        "tag": statistics.median(tag),
    }


async def _connect(address: str, repeats: int) -> tuple[float, float]:
    """Median seconds of ``GET /v1/status`` on a fresh connection, and on a kept one."""
    fresh, kept = [], []
    for _ in range(repeats):
        async with aiohttp.ClientSession() as session:
            started = time.perf_counter()
            async with session.get(f"http://{address}/v1/status") as response:
                await response.read()
            fresh.append(time.perf_counter() - started)
    async with aiohttp.ClientSession() as session:
        for _ in range(repeats + 1):
            started = time.perf_counter()
            async with session.get(f"http://{address}/v1/status") as response:
                await response.read()
            kept.append(time.perf_counter() - started)
    return statistics.median(fresh), statistics.median(kept[1:])


async def _exchanges(caller: Peer, repeats: int) -> tuple[list[float], int]:
    times, refused = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        done = await caller.gossip()
        if done == 1:
            times.append(time.perf_counter() - started)
        else:
            refused += 1
        await asyncio.sleep(0.002)
    return times, refused


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    data, _ = _workload(args.dataset, args.model, args.batch_size)
    out: dict[str, Any] = {"handoff": await _handoff(args.repeats * 10)}
    callee = _peer("callee", data, args.model, args.batch_size)
    await callee.start()
    numel = callee.ctx.spec.numel
    out["numel"] = numel
    out.update(_codec_and_tag(numel, args.repeats * 10))
    try:
        caller = _peer(
            "caller", data, args.model, args.batch_size, client_only=True,
            join=(callee.address,), fetch_state=False,
        )  # fmt: skip
        await caller.start()
        await asyncio.sleep(0.002)
        try:
            assert callee.address is not None
            out["connect_fresh"], out["connect_kept"] = await _connect(callee.address, args.repeats)
            await _exchanges(caller, 2)  # warm up
            idle, _ = await _exchanges(caller, args.repeats * 4)
            out["exchange_idle"] = statistics.median(idle)
            training = asyncio.ensure_future(callee.run(10**9))
            await asyncio.sleep(0.5)
            busy, refused = await _exchanges(caller, args.repeats * 4)
            training.cancel()
            await asyncio.gather(training, return_exceptions=True)
            out["exchange_training"] = statistics.median(busy) if busy else float("nan")
            out["refused"], out["tried"] = refused, args.repeats * 4
            # GC pauses over a run of steps with exchanges (the caller trains and gossips)
            pauses: list[float] = []
            began: list[float] = []

            def on_gc(phase: str, info: dict[str, Any]) -> None:
                if phase == "start":
                    began.append(time.perf_counter())
                elif began:
                    pauses.append(time.perf_counter() - began.pop())

            gc.callbacks.append(on_gc)
            try:
                steps = args.steps
                started = time.perf_counter()
                await caller.run(steps)
                out["run_wall"] = time.perf_counter() - started
            finally:
                gc.callbacks.remove(on_gc)
            out["gc_total"], out["gc_count"], out["run_steps"] = sum(pauses), len(pauses), steps
            out["run_compute"] = caller.ctx.slowdown.compute_s
            out["fanout"] = caller.config.fanout
        finally:
            await caller.stop()
    finally:
        await callee.stop()
    # --slowdown's wait: how much longer than asked an asyncio.sleep of a step's length takes
    asked = max(1e-4, out["run_compute"] / out["run_steps"] * 2)  # (3 - 1) x a step
    late = []
    for _ in range(args.repeats * 10):
        started = time.perf_counter()
        await asyncio.sleep(asked)
        late.append(time.perf_counter() - started - asked)
    out["sleep_late"], out["sleep_asked"] = statistics.median(late), asked
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="mnist1d:num_samples=4000")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # the lone callee's "training alone" warnings
    out = asyncio.run(_measure(args))
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"# {args.model} on {args.dataset}, batch {args.batch_size}: {out['numel']} parameters, "
        f"body {out['body_bytes']} bytes; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
        f"UTC, {os.cpu_count()} CPUs, load average {load}"
    )
    rows = [
        ("thread handoff per local step (2 x to_thread)", 2 * out["handoff"]),
        ("envelope encode (DenseCodec + msgpack)", out["encode"]),
        ("envelope decode", out["decode"]),
        ("Poly1305 tag of the body", out["tag"]),
        ("topk:ratio=0.01 encode of the model (choco, sparseloco)", out["compress"]),
        ("GET /v1/status, fresh connection", out["connect_fresh"]),
        ("GET /v1/status, kept-alive connection", out["connect_kept"]),
        ("exchange round trip, callee idle", out["exchange_idle"]),
        ("exchange round trip, callee training", out["exchange_training"]),
        ("GC pauses per local step", out["gc_total"] / out["run_steps"]),
        ("a round of the caller (run wall / steps)", out["run_wall"] / out["run_steps"]),
        ("  of which its local step (timed in the thread)", out["run_compute"] / out["run_steps"]),
        (
            f"  of which its exchanges ({out['fanout']} a round) and the rest",
            (out["run_wall"] - out["run_compute"]) / out["run_steps"],
        ),
        (f"asyncio.sleep({1000 * out['sleep_asked']:.2f} ms) late by", out["sleep_late"]),
    ]  # fmt: skip
    print("| term | ms |\n|---|---:|")
    for name, seconds in rows:
        print(f"| {name} | {1000 * seconds:.3f} |")
    print(
        f"\nrefused 409 busy while the callee trained: {out['refused']} of {out['tried']}; "
        f"GC: {out['gc_count']} collections in {out['run_steps']} steps, "
        f"{1000 * out['gc_total']:.2f} ms in all"
    )


if __name__ == "__main__":
    main()
