"""What a real peer costs on this machine, for the simulator's time model
(``gossipnet sim calibrate``, :mod:`gossipnet.calibrate`, writes it as ``[network]`` keys).

* :func:`time_local_steps`: one local step as a peer takes it (``Trainer.gradient`` then
  ``optimizer_step`` under the model lock, one torch thread as ``gossipnet peer`` runs), in
  seconds per step: the simulator's ``step_time``.
* :func:`time_exchanges`: one exchange between two real peers on 127.0.0.1 (aiohttp, msgpack,
  Poly1305-signed bodies, the callee's averaging, the caller's adoption), for a model of each
  body size: its round trip carries two messages of M bytes, so
  ``t(M) = 2 (σ + M/S)``, with σ the stack's time per message and S its throughput.
* :func:`fit_stack`: σ and S from the timings by least squares (``stack_latency`` and
  ``stack_bandwidth``, in series with the wire's ``latency`` and ``bandwidth``).

Both peers share one event loop here (a swarm on one machine runs them as processes): the
round trip is sequential either way, so the loop's sharing costs little; docs/calibration.md
gives the numbers.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.node.trainer import Batch, LossFunction, OptimizerFactory, Trainer

__all__ = ["ExchangeTiming", "StackFit", "fit_stack", "time_exchanges", "time_local_steps"]

CALIBRATION_SECRET = b"gossipnet-calibration-secret-0123"
"""The two calibration peers' swarm secret: their bodies are signed as a real swarm's."""


def time_local_steps(
    model: torch.nn.Module,
    optimizer: OptimizerFactory,
    loss: LossFunction,
    batches: Iterable[Batch],
    *,
    steps: int,
    warmup: int = 2,
    device: str = "cpu",
) -> list[float]:
    """Seconds of each of ``steps`` local steps (after ``warmup`` untimed ones), taken as a
    peer takes them: gradient, then the optimizer step under the lock, one torch thread."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps: must be >= 1 (and warmup >= 0), got {steps}, {warmup}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as gossipnet peer runs (peer.app.run.build_peer)
    try:
        trainer = Trainer(model, optimizer, loss, batches, torch.device(device), seed=0)
        times = []
        for step in range(warmup + steps):
            started = time.perf_counter()
            trainer.gradient()
            with trainer.lock:
                trainer.optimizer_step()
            if trainer.device.type == "cuda":
                torch.cuda.synchronize(trainer.device)  # the step's kernels are done
            if step >= warmup:
                times.append(time.perf_counter() - started)
        return times
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class ExchangeTiming:
    """The round trips of one exchange size: ``body_bytes`` each way, ``seconds`` each."""

    body_bytes: int
    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


class _Flat(torch.nn.Module):
    """A model that is ``numel`` float32 parameters and nothing else."""

    def __init__(self, numel: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(numel, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.sum()


def _peer(peer_id: str, numel: int, **config: Any) -> Peer:
    seed = int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "little")
    return Peer(
        _Flat(numel, seed),
        lambda params: torch.optim.SGD(params, lr=0.0),
        torch.nn.functional.mse_loss,
        [],
        PeerConfig(
            peer_id=peer_id,
            secret=CALIBRATION_SECRET,
            request_timeout_s=120.0,
            evict_after=1_000_000,
            **config,
        ),
    )


async def _exchange_times(
    numel: int, repeats: int, link: Mapping[str, Any]
) -> tuple[int, list[float]]:
    callee = _peer("callee", numel, **link)
    await callee.start()
    try:
        caller = _peer(
            "caller", numel, client_only=True, join=(callee.address,), fetch_state=False, **link
        )
        await caller.start()
        await asyncio.sleep(0.002)  # signed after the callee's start millisecond
        try:
            sent: list[int] = []
            assert caller.client is not None
            caller.client.on_bytes = lambda way, n: sent.append(n) if way == "out" else None
            times = []
            for attempt in range(repeats + 1):  # the first warms the connection up
                started = time.perf_counter()
                if await caller.gossip() != 1:
                    raise RuntimeError(f"calibration exchange of {numel * 4} bytes failed")
                if attempt:
                    times.append(time.perf_counter() - started)
            return sent[-1], times
        finally:
            await caller.stop()
    finally:
        await callee.stop()


def time_exchanges(
    model_bytes: Sequence[int], *, repeats: int, link: Mapping[str, Any] | None = None
) -> list[ExchangeTiming]:
    """For each model size (bytes of float32 parameters), ``repeats`` timed exchanges between
    two real peers on 127.0.0.1 (signed, async mode: the caller's model there, the callee's
    back), after one untimed; ``body_bytes`` is what the caller's body really was. ``link``:
    both peers' emulated uplink (``PeerConfig`` fields ``latency``, ``bandwidth``,
    ``jitter``, ``message_loss``; none: loopback as it is)."""
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    link = dict(link or {})
    asyncio.run(_exchange_times(1, 1, {}))  # untimed: the first peers of a process warm it up
    timings = []
    for size in model_bytes:
        numel = max(1, int(size) // 4)
        body, times = asyncio.run(_exchange_times(numel, repeats, link))
        timings.append(ExchangeTiming(body, tuple(times)))
    return timings


@dataclass(frozen=True)
class StackFit:
    """``t(M) = 2 (stack_latency + M / stack_bandwidth)`` fitted to round trips."""

    stack_latency: float
    """Seconds per message (σ >= 0)."""
    stack_bandwidth: float | None
    """Bytes per second (S); ``None`` where the times did not grow with the size."""
    residual: float
    """Root mean square of the fit's error over the sizes' medians, seconds."""


def fit_stack(timings: Sequence[ExchangeTiming]) -> StackFit:
    """σ and S by least squares over each size's median round trip (``numpy.linalg.lstsq``
    on ``[1, M] · [a, b] = t``; σ = a/2 clipped at 0, S = 2/b), at least two sizes. Medians:
    on a loaded machine one slow exchange must not tilt the line."""
    sizes = {timing.body_bytes for timing in timings}
    if len(sizes) < 2:
        raise ValueError(f"sizes: needs at least two different sizes to fit, got {sorted(sizes)}")
    m = np.array([t.body_bytes for t in timings], dtype=np.float64)
    seconds = np.array([t.median for t in timings], dtype=np.float64)
    design = np.stack([np.ones_like(m), m], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    residual = float(np.sqrt(np.mean((design @ np.array([a, b]) - seconds) ** 2)))
    return StackFit(
        stack_latency=max(0.0, float(a) / 2),
        stack_bandwidth=2.0 / float(b) if b > 0 else None,
        residual=residual,
    )


def model_sizes(text: str) -> list[int]:
    """``"4kB,256kB,4MB"`` -> bytes; a bare number is bytes."""
    units = {"": 1, "B": 1, "kB": 1000, "KB": 1000, "MB": 10**6, "GB": 10**9}
    sizes = []
    for item in text.split(","):
        number = item.strip().rstrip("BkKMG") or "x"
        unit = item.strip()[len(number) :]
        try:
            value = float(number) * units[unit]
        except (ValueError, KeyError):
            raise ValueError(
                f"got {item.strip()!r}; allowed: comma-separated sizes in bytes, or with "
                "kB, MB, GB (4kB,256kB,4MB)"
            ) from None
        if not value >= 4:
            raise ValueError(f"got {item.strip()!r}; allowed: sizes of at least 4 bytes")
        sizes.append(int(value))
    return sizes
