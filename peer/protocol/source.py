"""Where a strict msgpack reader gets a body's bytes: :class:`BodySource` (the interface)
and :class:`ChunkSource` (over any function returning chunks, such as aiohttp's
``readany``). The socket-level source (``peer.transport.receive.DirectBody``) lives with
the transport."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

__all__ = ["BodySource", "ChunkSource", "Landed"]

Landed = Callable[[memoryview], None]
"""Called with each run of bytes as it lands in a named buffer (the body's MAC or digest)."""


@runtime_checkable
class BodySource(Protocol):
    """Where :class:`peer.protocol.msgpack_stream.StreamReader` gets a body's bytes."""

    async def read(self) -> bytes:
        """The next bytes of the body, ``b""`` at its end."""
        ...

    async def read_into(self, view: memoryview, landed: Landed) -> int:
        """Fill ``view`` with the body's next bytes, calling ``landed`` on each run as it
        lands; returns how many were filled (fewer than ``len(view)`` only at the body's
        end)."""
        ...


class ChunkSource:
    """A :class:`BodySource` over a function returning chunks (aiohttp's ``readany``): a
    chunk that runs past the named buffer keeps its rest for the next :meth:`read`."""

    def __init__(self, read: Callable[[], Awaitable[bytes]]) -> None:
        self._read = read
        self._rest = b""

    async def read(self) -> bytes:
        if self._rest:
            rest, self._rest = self._rest, b""
            return rest
        return await self._read()

    async def read_into(self, view: memoryview, landed: Landed) -> int:
        filled = 0
        while filled < len(view):
            chunk = await self.read()
            if not chunk:
                break
            take = min(len(view) - filled, len(chunk))
            if take < len(chunk):
                self._rest = chunk[take:]
            part = memoryview(chunk)[:take]
            view[filled : filled + take] = part
            landed(view[filled : filled + take])
            filled += take
        return filled
