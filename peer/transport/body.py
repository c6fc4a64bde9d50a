"""Envelope bodies on the HTTP stream: sent from the model's memory, read into one buffer.

Sending (:class:`EnvelopeBody`, an aiohttp payload): the envelope's msgpack pieces
(:func:`peer.protocol.msgpack_stream.segments`: a small header, then the tensor bytes as a view of
the flat buffer or codec output) are written to the socket in :data:`CHUNK_BYTES` slices,
with a Content-Length, and, for a stream-signed exchange, the Poly1305 tag of the bytes
written appended as the body's last 16 bytes (``peer.protocol.auth``): the MAC is computed as the
bytes go out, one pass, no copy of the body.

Receiving (:func:`read_envelope_object`): the body is parsed as it arrives
(:class:`peer.protocol.msgpack_stream.StreamReader`); its tensor bytes land in an *arena* (a byte
tensor: reused across exchanges where the caller can, see :class:`ArenaPool`), and the tag
or SHA-256 digest is computed chunk by chunk as they are read. Nothing is decoded or applied
before the whole body is read and authenticated.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator, Iterator
from typing import Any

import torch
from aiohttp import StreamReader as HttpStream
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from cryptography.hazmat.primitives.poly1305 import Poly1305

from peer.protocol.auth import TAG_BYTES
from peer.protocol.errors import MalformedBody, Unauthorized
from peer.protocol.growing import GrowingBuffer
from peer.protocol.msgpack_stream import (
    Segment,
    StreamReader,
    arena_bytes,
    segments,
    segments_length,
)
from peer.protocol.source import BodySource
from peer.transport.shaping import SHAPED_SLICE_BYTES, EmulatedLink

MSGPACK = "application/msgpack"
CHUNK_BYTES = 1 << 20
"""Bytes handed to the transport per write (then the writer drains): bounds what the event
loop copies or MACs at once, and what the transport buffers beyond the socket's."""


def _slices(piece: bytes | memoryview) -> Iterator[bytes | memoryview]:
    size = piece.nbytes if isinstance(piece, memoryview) else len(piece)
    if size <= CHUNK_BYTES:
        yield piece
        return
    view = memoryview(piece)
    for start in range(0, size, CHUNK_BYTES):
        yield view[start : start + CHUNK_BYTES]


async def _ready_slices(piece: Segment) -> AsyncIterator[bytes | memoryview]:
    """``piece`` in slices of at most :data:`CHUNK_BYTES`, each once it is written (a
    :class:`~peer.protocol.growing.GrowingBuffer` is sent as its worker fills it)."""
    if not isinstance(piece, GrowingBuffer):
        for part in _slices(piece):
            yield part
        return
    start = 0
    while start < piece.nbytes:
        await piece.ready(start + 1)  # whatever is written beyond start, up to a slice
        end = min(piece.written, start + CHUNK_BYTES)
        yield piece.view[start:end]
        start = end


class EnvelopeBody(Payload):
    """A msgpack object streamed as its :func:`segments`, optionally followed by a tag.

    ``tag_key``: the 32-byte one-time Poly1305 key (``peer.protocol.auth.body_key``); the body then
    ends with the tag of everything before it. The pieces are views of the sender's memory:
    it must not change them until the body is written (the peer's send buffers are its own).
    A piece that is a :class:`~peer.protocol.growing.GrowingBuffer` is sent slice by slice as its
    worker writes it; if the worker fails, :meth:`write` raises
    :class:`~peer.protocol.growing.ProducerFailed` before the body is complete (the reader then
    applies nothing). :meth:`settled` waits for such workers, whatever became of the body.

    ``link``: the sender's emulated uplink (``peer.transport.shaping``): the body waits
    ``delay`` seconds, then goes out paced by the link's token bucket. ``None`` (no
    shaping): written as fast as the socket takes it, the path unchanged.
    """

    def __init__(
        self,
        obj: Any,
        *,
        tag_key: bytes | None = None,
        link: EmulatedLink | None = None,
        delay: float = 0.0,
    ) -> None:
        self.pieces = segments(obj)
        self.tag_key = tag_key
        self.link = link
        self.delay = delay
        self._growing = [p for p in self.pieces if isinstance(p, GrowingBuffer)]
        super().__init__(self.pieces, content_type=MSGPACK)
        self._size = segments_length(self.pieces) + (TAG_BYTES if tag_key is not None else 0)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("an envelope body is binary msgpack")

    async def written_pieces(self) -> list[bytes | memoryview]:
        """The pieces, once every growing one is written whole (digest signing, tests)."""
        out: list[bytes | memoryview] = []
        for piece in self.pieces:
            if isinstance(piece, GrowingBuffer):
                await piece.ready(piece.nbytes)
                out.append(piece.view)
            else:
                out.append(piece)
        return out

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        """The whole body joined (tests and digest signing; the wire path streams instead)."""
        pieces = await self.written_pieces()
        data = b"".join(bytes(p) if isinstance(p, memoryview) else p for p in pieces)
        return data + (poly1305_tag(self.tag_key, data) if self.tag_key is not None else b"")

    async def write(self, writer: AbstractStreamWriter) -> None:
        if self.link is not None:
            await self._write_shaped(writer, self.link)
            return
        mac = Poly1305(self.tag_key) if self.tag_key is not None else None
        for piece in self.pieces:
            async for part in _ready_slices(piece):
                if mac is not None:
                    mac.update(part)
                await writer.write(part)
        if mac is not None:
            await writer.write(mac.finalize())
        # written: let go of the sender's memory now (the HTTP layer may keep this object
        # until the next request on the connection, and with it a model-sized buffer)
        self.pieces = []
        self._value = None

    async def _write_shaped(self, writer: AbstractStreamWriter, link: EmulatedLink) -> None:
        """:meth:`write` over the emulated link: the message's delay, then each slice of at
        most :data:`~peer.transport.shaping.SHAPED_SLICE_BYTES` once the bucket lets it (no
        bandwidth: the usual slices)."""
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        mac = Poly1305(self.tag_key) if self.tag_key is not None else None
        paced = SHAPED_SLICE_BYTES if link.settings.bandwidth is not None else CHUNK_BYTES
        for piece in self.pieces:
            async for part in _ready_slices(piece):
                view = memoryview(part)
                for start in range(0, view.nbytes, paced):
                    chunk = view[start : start + paced]
                    if mac is not None:
                        mac.update(chunk)
                    await link.pace(chunk.nbytes)
                    await writer.write(chunk)
        if mac is not None:
            tag = mac.finalize()
            await link.pace(len(tag))
            await writer.write(tag)
        self.pieces = []
        self._value = None

    async def settled(self) -> None:
        """Wait for the workers of growing pieces to return (see :meth:`write`)."""
        for piece in self._growing:
            await piece.settled()

    def release(self) -> None:
        """Drop every reference to the sender's memory (the body is done with); growing
        pieces are released to their owners (:meth:`~peer.protocol.growing.GrowingBuffer.release`)."""
        for piece in self._growing:
            piece.release()
        self.pieces = []
        self._growing = []
        self._value = None

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        if content_length is not None and content_length != self._size:
            raise ValueError(f"an envelope body is written whole ({self._size} bytes)")
        await self.write(writer)


def poly1305_tag(key: bytes, data: bytes | memoryview) -> bytes:
    """Poly1305 of ``data`` under a one-time ``key``."""
    mac = Poly1305(key)
    mac.update(data)
    return mac.finalize()


class _BodyCheck:
    """Chunk-by-chunk authentication of a body: a Poly1305 tag trailer, or a SHA-256 digest."""

    def __init__(self, *, tag_key: bytes | None, digest: bool, length: int | None) -> None:
        if tag_key is not None and length is None:
            raise MalformedBody("a stream-signed body needs a Content-Length")
        self.mac = Poly1305(tag_key) if tag_key is not None else None
        self.sha = hashlib.sha256() if digest else None
        self.macced_until = (length - TAG_BYTES) if length is not None and tag_key else None
        self.offset = 0

    def update(self, chunk: memoryview) -> None:
        if self.sha is not None:
            self.sha.update(chunk)
        if self.mac is not None and self.macced_until is not None:
            take = max(0, min(len(chunk), self.macced_until - self.offset))
            if take:
                self.mac.update(chunk[:take] if take < len(chunk) else chunk)
        self.offset += len(chunk)


async def read_envelope_object(
    stream: HttpStream | BodySource,
    *,
    length: int | None,
    cap: int,
    arena: torch.Tensor | None = None,
    tag_key: bytes | None = None,
    digest: bool = False,
) -> tuple[Any, str | None]:
    """Read one msgpack body from an aiohttp stream: ``(object, sha256 hex or None)``.

    ``stream`` is aiohttp's body stream, or a :class:`peer.protocol.source.BodySource` (a
    :class:`~peer.transport.receive.DirectBody` reads large bins straight from the socket). Large bins
    of the object are read-only views of ``arena`` (allocated when ``None``).
    With ``tag_key`` the body must end with the Poly1305 tag of the rest (else
    :class:`~peer.protocol.errors.Unauthorized`); with ``digest`` its SHA-256 is returned for the
    caller to check against a digest signature. Any other trailing byte is
    :class:`~peer.protocol.errors.MalformedBody`.
    """
    check = _BodyCheck(tag_key=tag_key, digest=digest, length=length)
    source = stream if isinstance(stream, BodySource) else stream.readany
    reader = StreamReader(source, length=length, cap=cap, arena=arena, on_bytes=check.update)
    obj = await reader.read_object()
    trailer = await reader.read_rest(TAG_BYTES if tag_key is not None else 0)
    if length is not None and reader.consumed != length:
        raise MalformedBody(
            f"body ended after {reader.consumed} of {length} bytes (Content-Length)"
        )
    if check.mac is not None:
        if len(trailer) != TAG_BYTES:
            raise Unauthorized("stream-signed body has no tag")
        if not hmac.compare_digest(check.mac.finalize(), trailer):
            raise Unauthorized("body tag does not match (wrong swarm secret or altered body)")
    return obj, (check.sha.hexdigest() if check.sha is not None else None)


class ArenaPool:
    """Receive buffers kept for reuse: an exchange's tensor bytes land in memory already
    mapped (a fresh 400 MB buffer costs ~100k page faults before the first byte lands).

    ``take(body_bytes)`` returns a buffer of at least :func:`arena_bytes` ``(body_bytes)``;
    ``give(buffer)`` returns it once nothing views it any more. At most ``keep`` buffers are
    kept; ``pin`` allocates page-locked memory (a model on a GPU copies from it directly).
    """

    def __init__(self, keep: int, *, pin: bool = False) -> None:
        self.keep = keep
        self.pin = pin
        self._free: list[torch.Tensor] = []

    def take(self, body_bytes: int) -> torch.Tensor:
        need = arena_bytes(body_bytes)
        for i, buffer in enumerate(self._free):
            if buffer.numel() >= need:
                return self._free.pop(i)
        return torch.empty(need, dtype=torch.uint8, pin_memory=self.pin)

    def give(self, buffer: torch.Tensor) -> None:
        if len(self._free) < self.keep:
            self._free.append(buffer)
