"""msgpack without whole-body copies: an object as byte segments, and a streaming reader.

The wire is msgpack with raw tensor bytes (a ``bin`` is a 1-5 byte header and the bytes as
they are). Two halves of one format:

* :func:`segments` writes an object as a list of pieces whose concatenation is exactly
  ``msgpack.packb(obj, use_bin_type=True)``: small parts packed, every large ``bytes`` /
  ``memoryview`` value (at least :data:`SPLICE_BYTES`) left in place as a view of the
  caller's memory, so a model's bytes go from its buffer to the socket with no copy.
* :class:`StreamReader` reads one msgpack object from an async byte source, item by item,
  with a bounded depth, bounded container and string sizes and no extension types; each
  large ``bin`` is read straight into one preallocated *arena* (a byte tensor the caller can
  reuse), and appears in the result as a read-only view of it. Everything else is parsed
  from a small window. A malformed or hostile body raises :class:`~peer.protocol.errors.MalformedBody`
  or :class:`~peer.protocol.errors.BodyTooLarge` as soon as it is seen, before more is read.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import torch

from peer.protocol.errors import BodyTooLarge, MalformedBody
from peer.protocol.growing import GrowingBuffer
from peer.protocol.source import BodySource, ChunkSource

SPLICE_BYTES = 1 << 16
"""A ``bin`` at least this large travels as a view (sending) and lands in the arena (receiving)."""
MAX_DEPTH = 16
"""Deepest nesting of maps and arrays a reader accepts (an envelope needs 2)."""
MAX_STR_BYTES = 1 << 20
MAX_CONTAINER_ITEMS = 1 << 20
ALIGN = 64
"""Arena offsets of large bins are multiples of this (any tensor dtype may view them)."""

Segment = bytes | memoryview | GrowingBuffer
"""A piece of a body: packed bytes, a view of the sender's memory, or a view a worker is
still writing (:class:`peer.protocol.growing.GrowingBuffer`, sent as its bytes become ready)."""


def _bin_header(length: int) -> bytes:
    if length < 1 << 8:
        return b"\xc4" + length.to_bytes(1, "big")
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    if n < 1 << 16:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _byte_view(value: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(value)
    if not view.c_contiguous:
        raise ValueError("a bin value must be contiguous memory")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def segments(obj: Any, *, splice_bytes: int = SPLICE_BYTES) -> list[Segment]:
    """``obj`` as pieces whose ``b"".join`` is ``msgpack.packb(obj, use_bin_type=True)``.

    Maps, lists and tuples are walked; a ``bytes``, ``bytearray`` or ``memoryview`` of at
    least ``splice_bytes`` bytes becomes its own piece (a view, not a copy: keep it unchanged
    until the pieces are written), and so does a :class:`~peer.protocol.growing.GrowingBuffer` of any
    size (a ``bin`` of its final size; its bytes are joined only once written); everything
    else is packed by msgpack. Adjacent small pieces are merged.
    """
    out: list[Segment] = []
    small = bytearray()
    _walk(obj, out, small, splice_bytes)
    if small:
        out.append(bytes(small))
    return out


def _walk(value: Any, out: list[Segment], small: bytearray, splice_bytes: int) -> None:
    """Append ``value``'s msgpack bytes to ``small``, flushing it into ``out`` before each
    large bin (a module-level function: a recursive closure would be a reference cycle,
    and keep the pieces -- a model -- alive until a garbage collection)."""
    if isinstance(value, dict):
        small += _map_header(len(value))
        for key, item in value.items():
            small += msgpack.packb(key, use_bin_type=True)
            _walk(item, out, small, splice_bytes)
    elif isinstance(value, list | tuple):
        small += _array_header(len(value))
        for item in value:
            _walk(item, out, small, splice_bytes)
    elif isinstance(value, GrowingBuffer):
        small += _bin_header(value.nbytes)
        out.append(bytes(small))
        small.clear()
        out.append(value)
    elif isinstance(value, bytes | bytearray | memoryview):
        view = _byte_view(value)
        if view.nbytes >= splice_bytes:
            small += _bin_header(view.nbytes)
            out.append(bytes(small))
            small.clear()
            out.append(view)
        else:
            small += _bin_header(view.nbytes)
            small += view
    else:
        small += msgpack.packb(value, use_bin_type=True)


def segments_length(pieces: list[Segment]) -> int:
    """Total bytes of ``pieces``."""
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)


Source = Callable[[], Awaitable[bytes]]
"""An async function returning the next chunk of the body (``b""`` at its end)."""


class StreamReader:
    """Reads one msgpack object from ``source`` into a window and an arena.

    Args:
        source: returns the next body chunk, ``b""`` at the end (aiohttp's ``readany``), or
            a :class:`peer.protocol.source.BodySource`, which a large bin's slot is handed to so its
            bytes land there straight from the socket (:class:`peer.transport.receive.DirectBody`).
        length: the body's length if known (Content-Length), else ``None``; reading past it
            or the ``cap`` is refused.
        cap: the most bytes this body may have (the model-derived cap).
        arena: where large bins land: a 1-D ``torch.uint8`` tensor of at least
            :func:`arena_bytes` ``(length)`` bytes; ``None`` allocates one per body.
        on_bytes: called with every chunk read, in order (the MAC or digest of the body),
            once the reader has copied it; it may run for a while (a worker thread would be
            the caller's choice).
    """

    def __init__(
        self,
        source: Source | BodySource,
        *,
        length: int | None,
        cap: int,
        arena: torch.Tensor | None = None,
        on_bytes: Callable[[memoryview], None] | None = None,
    ) -> None:
        if length is not None and length > cap:
            raise BodyTooLarge(f"body has {length} bytes, the cap is {cap}")
        self._source: BodySource = source if isinstance(source, BodySource) else ChunkSource(source)
        self.length = length
        self.cap = cap
        self._window = bytearray()
        self._pos = 0  # read position in the window
        self.consumed = 0  # body bytes handed to the parser so far (window start + _pos)
        self._received = 0  # body bytes read from the source
        self._on_bytes = on_bytes
        self._arena = arena
        self._arena_view: memoryview | None = None
        self._arena_used = 0
        self._ended = False

    # -------------------------------------------------------------- raw reading

    async def _fill(self) -> bool:
        """Append the next chunk to the window; False at the end of the body."""
        if self._ended:
            return False
        chunk = await self._source.read()
        if not chunk:
            self._ended = True
            return False
        self._landed(memoryview(chunk))
        if self._pos:
            del self._window[: self._pos]
            self._pos = 0
        self._window += chunk
        return True

    async def _need(self, n: int) -> memoryview:
        while len(self._window) - self._pos < n:
            if n > MAX_STR_BYTES + 16:
                raise MalformedBody(f"an item of {n} bytes is larger than allowed")
            if not await self._fill():
                raise MalformedBody(
                    f"body ended after {self.consumed + len(self._window) - self._pos} bytes, "
                    "inside a msgpack item"
                )
        view = memoryview(self._window)[self._pos : self._pos + n]
        self._pos += n
        self.consumed += n
        return view

    async def _byte(self) -> int:
        return (await self._need(1))[0]

    async def _uint(self, size: int) -> int:
        return int.from_bytes(await self._need(size), "big")

    def _arena_slot(self, n: int) -> memoryview:
        if self._arena_view is None:
            if self._arena is None:
                self._arena = torch.empty(arena_bytes(self.length or self.cap), dtype=torch.uint8)
            self._arena_view = memoryview(self._arena.numpy()).cast("B")  # type: ignore[arg-type]
        start = -(-self._arena_used // ALIGN) * ALIGN
        if start + n > self._arena_view.nbytes:
            raise BodyTooLarge(f"a bin of {n} bytes does not fit the body's cap")
        self._arena_used = start + n
        return self._arena_view[start : start + n]

    def _landed(self, chunk: memoryview) -> None:
        """Count body bytes as they arrive (refusing more than the length or the cap) and
        hand them to ``on_bytes``."""
        self._received += len(chunk)
        limit = self.cap if self.length is None else self.length
        if self._received > limit:
            raise (
                BodyTooLarge(f"body exceeds the cap of {self.cap} bytes")
                if self.length is None
                else MalformedBody(f"body is longer than its Content-Length {self.length}")
            )
        if self._on_bytes is not None:
            self._on_bytes(chunk)

    async def _big_bin(self, n: int) -> memoryview:
        """Read ``n`` bytes into the arena: what the window holds, then straight from the
        source into the arena's slot (:meth:`peer.protocol.source.BodySource.read_into`)."""
        limit = self.cap if self.length is None else self.length
        if self.consumed + n > limit:
            raise MalformedBody(f"a bin of {n} bytes runs past the body's end ({limit} bytes)")
        slot = self._arena_slot(n)
        have = min(n, len(self._window) - self._pos)
        slot[:have] = memoryview(self._window)[self._pos : self._pos + have]
        self._pos += have
        if self._pos:
            del self._window[: self._pos]
            self._pos = 0
        filled = have
        if filled < n:
            filled += await self._source.read_into(slot[filled:], self._landed)
        if filled < n:
            raise MalformedBody(f"body ended inside a bin ({filled} of {n} bytes)")
        self.consumed += n
        return slot.toreadonly()

    # -------------------------------------------------------------- msgpack items

    async def read_object(self) -> Any:
        """The body's one msgpack object (containers at most :data:`MAX_DEPTH` deep)."""
        return await self._item(0)

    async def _str(self, n: int) -> str:
        if n > MAX_STR_BYTES:
            raise MalformedBody(f"a string of {n} bytes is longer than {MAX_STR_BYTES}")
        try:
            return bytes(await self._need(n)).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedBody("a msgpack string is not UTF-8") from None

    async def _bin(self, n: int) -> bytes | memoryview:
        if n >= SPLICE_BYTES:
            return await self._big_bin(n)
        return bytes(await self._need(n))

    async def _container(self, n: int, depth: int, *, is_map: bool) -> Any:
        if depth >= MAX_DEPTH:
            raise MalformedBody(f"msgpack nesting deeper than {MAX_DEPTH}")
        if n > MAX_CONTAINER_ITEMS:
            raise MalformedBody(f"a msgpack container of {n} items is larger than allowed")
        if not is_map:
            return [await self._item(depth + 1) for _ in range(n)]
        out: dict[Any, Any] = {}
        for _ in range(n):
            key = await self._item(depth + 1)
            if not isinstance(key, str | bytes):
                raise MalformedBody(f"msgpack map keys must be strings, got {type(key).__name__}")
            if key in out:
                raise MalformedBody(f"duplicate msgpack map key {key[:64]!r}")
            out[key] = await self._item(depth + 1)
        return out

    async def _item(self, depth: int) -> Any:
        code = await self._byte()
        if code <= 0x7F:
            return code
        if code >= 0xE0:
            return code - 0x100
        if 0x80 <= code <= 0x8F:
            return await self._container(code & 0x0F, depth, is_map=True)
        if 0x90 <= code <= 0x9F:
            return await self._container(code & 0x0F, depth, is_map=False)
        if 0xA0 <= code <= 0xBF:
            return await self._str(code & 0x1F)
        if code in _FIXED:
            return _FIXED[code]
        if code in _INTS:
            size, fmt = _INTS[code]
            return struct.unpack(fmt, await self._need(size))[0]
        if code in (0xC4, 0xC5, 0xC6):
            return await self._bin(await self._uint(1 << (code - 0xC4)))
        if code in (0xD9, 0xDA, 0xDB):
            return await self._str(await self._uint(1 << (code - 0xD9)))
        if code in (0xDC, 0xDD):
            return await self._container(await self._uint(2 << (code - 0xDC)), depth, is_map=False)
        if code in (0xDE, 0xDF):
            return await self._container(await self._uint(2 << (code - 0xDE)), depth, is_map=True)
        if code == 0xC1:
            raise MalformedBody("byte 0xc1 is never used in msgpack")
        raise MalformedBody(
            f"msgpack extension types are not part of the protocol (type byte 0x{code:02x})"
        )

    # -------------------------------------------------------------- the rest of the body

    async def read_rest(self, limit: int) -> bytes:
        """What follows the object (a trailer): at most ``limit`` bytes, else MalformedBody."""
        rest = bytes(memoryview(self._window)[self._pos :])
        while len(rest) <= limit and await self._fill():
            rest = bytes(memoryview(self._window)[self._pos :])
        if len(rest) > limit:
            raise MalformedBody(f"{len(rest)} bytes follow the msgpack object; at most {limit} may")
        self.consumed += len(rest)
        self._pos = len(self._window)
        return rest


_FIXED: dict[int, Any] = {0xC0: None, 0xC2: False, 0xC3: True}
_INTS: dict[int, tuple[int, str]] = {
    0xCA: (4, ">f"),
    0xCB: (8, ">d"),
    0xCC: (1, ">B"),
    0xCD: (2, ">H"),
    0xCE: (4, ">I"),
    0xCF: (8, ">Q"),
    0xD0: (1, ">b"),
    0xD1: (2, ">h"),
    0xD2: (4, ">i"),
    0xD3: (8, ">q"),
}


def arena_bytes(body_bytes: int) -> int:
    """Arena size that holds every large bin of a body of ``body_bytes`` bytes, aligned."""
    return body_bytes + ALIGN * (body_bytes // SPLICE_BYTES + 1)
