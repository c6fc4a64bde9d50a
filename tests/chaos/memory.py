"""A peer's resident memory over an attack: the start, the peak, and after the abuse.

:class:`MemorySampler` reads the process's RSS every ``interval_s`` while the attack runs;
:func:`settle_memory` waits (a bounded time) after the attack for the RSS to come back
within 10 % of the start, and returns the last reading either way.
"""

from __future__ import annotations

import asyncio
import contextlib

from .processes import PeerProcess

SETTLE_S = 15.0
"""How long a peer gets after the abuse stops to give its memory back."""


class MemorySampler:
    """Samples ``peer``'s RSS in the background; :attr:`peak` is the largest reading (MiB)."""

    def __init__(self, peer: PeerProcess, interval_s: float = 0.2) -> None:
        self.peer = peer
        self.interval_s = interval_s
        self.peak: float | None = None
        self._task: asyncio.Task[None] | None = None

    def _read(self) -> float | None:
        value = self.peer.rss_mib()
        if value is not None:
            self.peak = value if self.peak is None else max(self.peak, value)
        return value

    def start(self) -> float | None:
        """Start sampling; returns the first reading (the start)."""
        first = self._read()
        self._task = asyncio.ensure_future(self._run())
        return first

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._read()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._read()


async def settle_memory(
    peer: PeerProcess, start: float | None, *, within: float = 0.10, timeout_s: float = SETTLE_S
) -> float | None:
    """The peer's RSS once back within ``within`` of ``start``, or after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    value = peer.rss_mib()
    while value is not None and start and value > start * (1 + within):
        if loop.time() >= deadline:
            break
        await asyncio.sleep(0.5)
        value = peer.rss_mib()
    return value
