"""Body bytes straight from the socket into the reader's buffers (``recv_into``).

aiohttp hands a body over as ``bytes`` chunks: the kernel's bytes are copied into a fresh
``bytes`` per socket read, copied again by its parser, and a third time by the msgpack
reader into the arena. For a model-sized body that is three passes over the model where
one would do. This module reads the rest of such a body itself, once aiohttp has parsed
the head:

* :func:`take_over` switches the connection's transport to a :class:`DirectBody` (an
  :class:`asyncio.BufferedProtocol`; ``transport.set_protocol`` is public asyncio API, and
  asyncio's TLS transport supports buffered protocols too, decrypting straight into the
  buffer). What aiohttp's parser already fed to its stream is taken first.
* The reader (:class:`peer.protocol.msgpack_stream.StreamReader`) then asks for the next bytes
  (:meth:`DirectBody.read`: the msgpack header, from a small scratch buffer) or
  names where a large ``bin`` goes (:meth:`DirectBody.read_into`: the transport then calls
  ``recv_into`` on that slot of the arena: the kernel's copy is the only one). The MAC or
  digest of every chunk is computed as it lands, by the reader's callback.
* Exactly the body's remaining ``Content-Length`` bytes are read, never more: reading is
  paused at the body's end. :meth:`DirectBody.finish` then gives the connection back to
  aiohttp with its stream marked complete; :meth:`DirectBody.abandon` (a refused, short,
  slow or broken body) gives it back as it is, so aiohttp lingers over or closes what is
  left as it does for any refused body.

aiohttp's parser of the connection still expects the bytes read here. A connection stays
alive only where its owner gives it a fresh parser (``peer.transport.socket_reads.renew_parser``,
behind the one check of aiohttp's internals, :class:`peer.transport.socket_reads.DirectReads`;
a client's parser is made afresh for every response anyway); otherwise it
must be closed after its answer (``Connection: close``: the caller reconnects, about a
millisecond on loopback, a TLS handshake over TLS). Only bodies of at least
:data:`DIRECT_BODY_BYTES` are read this way.

The rules of every other body hold here too: size caps and Content-Length are checked
before a byte is read, the body deadline is the awaiting task's (a slow sender times out:
the waits here are cancellable and :meth:`DirectBody.abandon` undoes the switch). A body
without a Content-Length, chunked or content-encoded is read through aiohttp
(:class:`ChunkSource`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from peer.protocol.source import BodySource, ChunkSource, Landed

__all__ = [
    "DIRECT_BODY_BYTES",
    "STASH_BYTES",
    "BodySource",
    "ChunkSource",
    "DirectBody",
    "can_take_over",
    "take_over",
]

DIRECT_BODY_BYTES = 1 << 20
"""A body of at least this many bytes is read with ``recv_into`` (:func:`take_over`); smaller
ones through aiohttp, keeping their connection alive."""
STASH_BYTES = 1 << 16
"""Bytes read ahead while the reader names no buffer (the msgpack header's window); reading
pauses when this many wait unread."""


def can_take_over(headers: Mapping[str, str], length: int | None) -> bool:
    """Whether a body with these headers may be read directly: a ``Content-Length`` of at
    least :data:`DIRECT_BODY_BYTES`, and neither chunked nor content-encoded (whose bytes
    aiohttp's parser must transform)."""
    if length is None or length < DIRECT_BODY_BYTES:
        return False
    if "Transfer-Encoding" in headers:
        return False
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    return encoding in ("", "identity")


class DirectBody(asyncio.BufferedProtocol):
    """The rest of one body, ``remaining`` bytes after ``first``, read into named buffers.

    Installed on the transport by :func:`take_over`, which hands the connection back to
    ``protocol`` (aiohttp's) with :meth:`finish` or :meth:`abandon`. Flow control of the
    writing side is forwarded to ``protocol`` meanwhile, and a connection lost or ended
    while this protocol is installed is reported to it when it is handed back.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        protocol: asyncio.BaseProtocol,
        *,
        remaining: int,
        first: bytes,
    ) -> None:
        if remaining < 0:
            raise ValueError(f"remaining must be >= 0, got {remaining}")
        self._transport = transport
        self._protocol = protocol
        self.remaining = remaining
        """Body bytes not received from the transport yet."""
        self.overrun = 0
        """Bytes the transport delivered past the body's end (a sender that pipelines)."""
        self._stash = bytearray(first)
        self._scratch = memoryview(bytearray(STASH_BYTES))
        self._target: memoryview | None = None
        self._filled = 0
        self._landed: Landed | None = None
        self._landed_error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._lost = False
        self._lost_error: BaseException | None = None
        self._installed = False

    # ------------------------------------------------------------ the transport's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Not called: this protocol takes over a connection already made."""

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None and self._filled < len(self._target):
            return self._target[self._filled :]
        if self.remaining == 0:
            return self._scratch  # past the body: counted and dropped
        return self._scratch[: min(len(self._scratch), self.remaining)]

    def buffer_updated(self, nbytes: int) -> None:
        if self.remaining == 0:
            self.overrun += nbytes
            self._pause()
            return
        self.remaining -= nbytes
        target = self._target
        if target is not None and self._filled < len(target):
            part = target[self._filled : self._filled + nbytes]
            self._filled += nbytes
            if self._landed is not None and self._landed_error is None:
                try:
                    self._landed(part)
                except Exception as error:  # raised in the reader's task, not the transport
                    self._landed_error = error
            if self._filled == len(target) or self._landed_error is not None:
                self._pause()
                self._wake()
        else:
            self._stash += self._scratch[:nbytes]
            if len(self._stash) >= STASH_BYTES:
                self._pause()
            self._wake()
        if self.remaining == 0:
            self._pause()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # the transport closes; connection_lost follows (see _hand_back)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._lost_error = exc
        self._wake()

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()

    # ------------------------------------------------------------ the reader's side

    @property
    def ended(self) -> bool:
        """The connection ended (EOF or lost) while this protocol was installed."""
        return self._eof or self._lost

    async def read(self) -> bytes:
        """The next bytes of the body (the stash, or what arrives next); ``b""`` at the
        body's end or the connection's."""
        while not self._stash:
            if self.remaining == 0 or self.ended:
                return b""
            await self._wait()
        data = bytes(self._stash)
        self._stash.clear()
        return data

    async def read_into(self, view: memoryview, landed: Landed) -> int:
        """Fill ``view``: from the stash, then straight from the socket (``recv_into``),
        calling ``landed`` on every run as it lands. Returns the bytes filled, fewer than
        ``len(view)`` only when the body or the connection ended first."""
        if view.format != "B" or view.ndim != 1:
            raise ValueError("read_into needs a one-dimensional byte view")
        size = len(view)
        have = min(size, len(self._stash))
        if have:
            view[:have] = self._stash[:have]
            del self._stash[:have]
            landed(view[:have])
        if have == size or self.remaining == 0 or self.ended:
            return have
        self._target = view[have:]
        self._filled = 0
        self._landed = landed
        try:
            while self._filled < len(self._target) and self._landed_error is None:
                if self.ended or self.remaining == 0:
                    break
                await self._wait()
            if self._landed_error is not None:
                raise self._landed_error
            return have + self._filled
        finally:
            self._target = None
            self._landed = None
            self._pause()

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._resume()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _pause(self) -> None:
        if self._installed and not self._transport.is_closing():
            self._transport.pause_reading()

    def _resume(self) -> None:
        if self._installed and not self._transport.is_closing() and self.remaining > 0:
            self._transport.resume_reading()

    # ------------------------------------------------------------ handing back

    def install(self) -> None:
        """Switch the transport to this protocol (reading paused until the reader asks)."""
        self._transport.pause_reading()
        self._transport.set_protocol(self)
        self._installed = True

    def finish(self, stream: Any, *, keep_alive: bool) -> None:
        """The body was read whole: hand the connection back, ``stream`` (aiohttp's, which
        it parsed the body's first bytes into) marked complete. ``keep_alive``: the caller
        gave aiohttp's side of the connection a fresh parser (the old one still expects the
        bytes read here), so reading resumes for the next message; otherwise reading stays
        paused and the connection must be closed after its answer."""
        self._hand_back(resume=False)
        if not stream.is_eof() and stream.exception() is None:
            stream.feed_eof()
        if keep_alive and not self.ended and not self._transport.is_closing():
            resume = getattr(self._protocol, "resume_reading", None)
            if resume is not None:
                resume()  # aiohttp's flow-control flags, then the transport
            self._transport.resume_reading()

    def abandon(self) -> None:
        """The body was not read whole (refused, short, too slow, cut): hand the connection
        back as it is, reading resumed, for aiohttp to linger over or close."""
        self._hand_back(resume=True)

    def _hand_back(self, *, resume: bool) -> None:
        if not self._installed:
            return
        self._installed = False
        transport = self._transport
        if transport.get_protocol() is self:
            transport.set_protocol(self._protocol)  # type: ignore[arg-type]
        if self._lost:
            self._protocol.connection_lost(self._lost_error)  # type: ignore[arg-type]
            return
        if self._eof:
            keep = getattr(self._protocol, "eof_received", lambda: None)()
            if not keep:
                transport.close()
            return
        if resume and not transport.is_closing():
            transport.resume_reading()


def take_over(
    transport: asyncio.BaseTransport | None,
    protocol: asyncio.BaseProtocol | None,
    stream: Any,
    *,
    length: int,
) -> DirectBody | None:
    """Read the rest of a ``length``-byte body directly: ``None`` where this connection
    cannot be switched (no transport, closing, or the body already complete or broken in
    aiohttp's ``stream``); otherwise the installed :class:`DirectBody`, holding what
    ``stream`` had buffered. Call :meth:`DirectBody.finish` or :meth:`DirectBody.abandon`
    when done, in a ``finally``."""
    if not isinstance(transport, asyncio.Transport) or protocol is None:
        return None
    if transport.is_closing() or stream.exception() is not None or stream.is_eof():
        return None
    fed = int(stream.total_bytes)
    if fed >= length:
        return None
    first = stream.read_nowait(-1)
    if len(first) != fed:
        raise RuntimeError(f"aiohttp's stream held {len(first)} of {fed} bytes fed to it")
    direct = DirectBody(transport, protocol, remaining=length - fed, first=first)
    direct.install()
    return direct
