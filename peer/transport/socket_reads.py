"""The one door to aiohttp's internals: bodies read straight from the socket.

A model-sized body is read by :mod:`peer.transport.receive` with ``recv_into`` once aiohttp
has parsed its head (:func:`~peer.transport.receive.take_over`), and the connection then gets
a fresh HTTP parser (the old one still expects the bytes read past it). Both lean on parts
of aiohttp that are not its public API: the connection handler's parser, its upgrade flag
and loop, the parser's constructor, and the body stream's byte count. :class:`DirectReads`
checks, once when an app is built, that they are there with the types expected; where
they are not (or where the caller asks for it, ``direct=False`` or :data:`DIRECT_READS`) every
body is read through aiohttp's public stream instead, the same bytes a little slower, and
one line says so at debug level.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import http_parser, web, web_protocol
from aiohttp.streams import StreamReader as HttpStream

from peer.protocol.source import BodySource
from peer.transport.receive import DirectBody, can_take_over, take_over
from peer.transport.service import DIRECT_READ, server_log

__all__ = ["DIRECT_READS", "BodyRead", "DirectReads"]

DIRECT_READS = True
"""Whether apps and clients (``peer.transport.client.PeerClient``) made from now on read
model-sized bodies straight from the socket (where aiohttp's internals allow); ``False``
chooses the plain fallback, aiohttp's stream, for every new one."""

_HANDLER_SLOTS = ("_parser", "_upgraded", "_loop")
_STREAM_SLOTS = ("total_bytes",)


def _slots(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())}


def missing_internals() -> str | None:
    """What of aiohttp's internals a direct read needs is not as expected (``None``: all is)."""
    handler_slots = _slots(web.RequestHandler)
    for name in _HANDLER_SLOTS:
        if name not in handler_slots:
            return f"aiohttp's RequestHandler has no {name}"
    stream_slots = _slots(HttpStream)
    for name in _STREAM_SLOTS:
        if name not in stream_slots:
            return f"aiohttp's StreamReader has no {name}"
    for name in ("read_nowait", "feed_eof", "is_eof", "exception"):
        if not callable(getattr(HttpStream, name, None)):
            return f"aiohttp's StreamReader has no {name}()"
    if not isinstance(getattr(http_parser, "HttpRequestParser", None), type):
        return "aiohttp has no HttpRequestParser class"
    if not isinstance(getattr(web_protocol, "MAX_MSG_QUEUE_SIZE", None), int):
        return "aiohttp has no MAX_MSG_QUEUE_SIZE"
    if not isinstance(getattr(web_protocol, "RequestPayloadError", None), type):
        return "aiohttp has no RequestPayloadError"
    return None


def renew_parser(protocol: Any) -> bool:
    """Give a connection a fresh HTTP parser, configured as aiohttp made the first (from the
    handler's ``parser_options`` and ``read_bufsize``, which
    :class:`peer.transport.connection.JsonErrorRequestHandler` keeps). False (the connection
    must then be closed) where the handler or its parser is not as expected."""
    options = getattr(protocol, "parser_options", None)
    bufsize = getattr(protocol, "read_bufsize", None)
    parser_type = http_parser.HttpRequestParser
    if not isinstance(options, dict) or not isinstance(bufsize, int):
        return False
    if not isinstance(getattr(protocol, "_parser", None), parser_type):
        return False
    if getattr(protocol, "_upgraded", None) is not False:
        return False
    loop = getattr(protocol, "_loop", None)
    if not isinstance(loop, asyncio.AbstractEventLoop):
        return False
    try:
        parser = parser_type(
            protocol,
            loop,
            bufsize,
            payload_exception=web_protocol.RequestPayloadError,
            max_msg_queue_size=web_protocol.MAX_MSG_QUEUE_SIZE,
            **options,
        )
    except TypeError:
        return False
    protocol._parser = parser
    return True


class BodyRead:
    """Where one request body's bytes come from (:attr:`source`): the socket (a
    :class:`~peer.transport.receive.DirectBody`) or aiohttp's stream. Call :meth:`end` when
    the read is over, in a ``finally``."""

    def __init__(self, request: web.Request, direct: DirectBody | None) -> None:
        self.request = request
        self.direct = direct
        self.source: HttpStream | BodySource = direct if direct is not None else request.content

    def end(self, *, whole: bool) -> None:
        """Hand the connection back to aiohttp. A body read to its last byte (``whole``, or
        refused after its last byte arrived: a wrong tag, trailing bytes) leaves the
        connection in step as a good one does: its parser is renewed, or, where it cannot
        be, the answer closes the connection (``request[DIRECT_READ]``)."""
        direct = self.direct
        if direct is None:
            return
        self.direct = None
        if whole or (direct.remaining == 0 and not direct.ended):
            renewed = renew_parser(self.request.protocol)
            direct.finish(self.request.content, keep_alive=renewed)
            self.request[DIRECT_READ] = not renewed
        else:
            direct.abandon()


class DirectReads:
    """How an app reads request bodies: straight from the socket where the body is large
    and aiohttp's internals are as expected (:func:`missing_internals`, checked once here),
    else through aiohttp's public stream. ``direct=None`` follows :data:`DIRECT_READS`."""

    def __init__(self, *, direct: bool | None = None) -> None:
        wanted = DIRECT_READS if direct is None else direct
        missing = missing_internals() if wanted else "not asked for"
        self.enabled = missing is None
        if missing is not None:
            server_log.debug(
                "direct body reads off (%s): bodies are read through aiohttp's stream", missing
            )

    def open(self, request: web.Request, length: int | None) -> BodyRead:
        """The body's :class:`BodyRead`: from the socket for a large plain body (its
        connection closes after the answer unless :meth:`BodyRead.end` renews its parser)."""
        direct = None
        if self.enabled and length is not None and can_take_over(request.headers, length):
            direct = take_over(request.transport, request.protocol, request.content, length=length)
            request[DIRECT_READ] = direct is not None
        return BodyRead(request, direct)
