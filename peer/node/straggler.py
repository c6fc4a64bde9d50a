"""An emulated straggler: each local step of the peer takes ``slowdown`` times its compute.

The real counterpart of the simulator's ``[network] stragglers = {peer = k}``
(:class:`sim.network.ComputeModel`: peer i's step time is ``step_time · k``). After a
gradient or optimizer step that took ``d`` seconds in its worker thread, the peer waits
``(k − 1)·d`` more on its event loop (``asyncio.sleep``, late returns taken off the next
wait, :meth:`Slowdown.stretch`): the step costs ``k·d`` in all,
whatever the model, the machine or the load, and the peer keeps serving its neighbours
meanwhile with the model lock free, as the simulator's neighbours never wait for a
straggler's compute. ``k = 1``: no wait, no cost. ``GET /v1/status`` reports the factor, the
compute measured and the time waited (:meth:`Slowdown.to_json`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class Slowdown:
    """Stretches each local step of one peer by ``factor`` (>= 1, checked by ``PeerConfig``)."""

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = float(factor)
        self.compute_s = 0.0
        """Seconds the timed steps took (their own compute, measured in the worker thread)."""
        self.waited_s = 0.0
        """Seconds waited on top of them (slept, measured): ``(factor − 1) · compute_s`` to
        within one sleep's lateness."""
        self.owed = 0.0
        """Seconds still to wait (negative: a sleep ran late, taken off the next wait)."""

    def timed(self, work: Callable[..., Any], *args: Any) -> float:
        """Run ``work(*args)`` (in the caller's thread: a worker thread) and return the
        seconds it took; they count in :attr:`compute_s`."""
        start = time.perf_counter()
        work(*args)
        took = time.perf_counter() - start
        self.compute_s += took
        return took

    async def stretch(self, took: float) -> None:
        """Owe ``(factor − 1) · took`` more seconds and wait what is owed, without blocking
        the event loop. The time really slept is paid off, so a sleep that returns late (the
        loop's timer granularity: about 1 ms on a loaded machine) makes the next one
        shorter, and over a run the waits add up to ``(factor − 1) · compute_s`` to within
        one sleep's lateness."""
        if self.factor == 1.0:
            return
        self.owed += (self.factor - 1.0) * took
        if self.owed > 0:
            start = time.perf_counter()
            await asyncio.sleep(self.owed)
            slept = time.perf_counter() - start
            self.owed -= slept
            self.waited_s += slept

    def to_json(self) -> dict[str, float]:
        """The status fields: ``slowdown``, ``compute_s`` and ``slowdown_waited_s``."""
        return {
            "slowdown": self.factor,
            "compute_s": round(self.compute_s, 6),
            "slowdown_waited_s": round(self.waited_s, 6),
        }
