"""The connection layer: aiohttp's server with a bound on open connections, JSON answers to
requests aiohttp cannot parse, and the runner that serves an app through it.

A connection opened while ``max_connections`` are open (counting those still in their TLS
handshake) is answered ``429 overloaded`` and closed before anything is parsed. Requests
aiohttp cannot parse (request line, headers, Content-Length) get ``400 malformed_request``
or ``431 headers_too_large``, logged as one line each.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_request import BaseRequest

from peer.protocol.errors import MalformedRequest, Overloaded
from peer.transport.responses import (
    error_response,
    http_error_response,
    parse_error,
    refusal_bytes,
)
from peer.transport.service import server_log

__all__ = [
    "HANDSHAKE_TIMEOUT_S",
    "JsonErrorRequestHandler",
    "PeerRunner",
    "PeerServer",
]


HANDSHAKE_TIMEOUT_S = 60.0
"""asyncio's TLS handshake timeout: a connection still opening after it has failed."""


class JsonErrorRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering what it cannot parse in JSON.

    aiohttp answers a request it cannot parse (request line, headers, framing) through
    ``RequestHandler.handle_error`` with a text body and a logged traceback; here it is
    the protocol's JSON error, logged as one line (a traceback only for a 5xx: a bug).
    """

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, **kwargs: Any):
        super().__init__(manager, loop=loop, **kwargs)
        self.parser_options: dict[str, Any] = {
            "max_line_size": kwargs.get("max_line_size", 8190),
            "max_field_size": kwargs.get("max_field_size", 8190),
            "max_headers": kwargs.get("max_headers", 128),
            "auto_decompress": kwargs.get("auto_decompress", True),
        }
        """How aiohttp configured this connection's parser (a renewed one is configured
        alike: :func:`peer.transport.socket_reads.renew_parser`)."""
        self.read_bufsize: int = kwargs.get("read_bufsize", 2**16)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, ConnectionError):
            # the caller went away (e.g. while we wrote ``100 Continue``): not a bug, and
            # nothing can be answered; aiohttp's finish_response drops the write quietly
            server_log.debug("connection from %s lost: %s", request.remote, exc)
            lost = error_response(MalformedRequest("the connection was lost"))
            lost.force_close()
            return lost
        error = parse_error(status, exc, message)
        if error.status >= 500:
            server_log.error("request from %s failed (a bug)", request.remote, exc_info=exc)
        else:
            server_log.info("refused a request from %s: %s", request.remote, error.detail)
        if request.writer.output_size > 0:  # an answer was under way: the connection is lost
            raise ConnectionError("the answer was already started")
        response = error_response(error)
        response.force_close()
        return response


class _RefusedConnection(asyncio.Protocol):
    """A connection over the bound: answered ``429 overloaded`` at once, then closed."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self.answer)
        transport.close()


class PeerServer(web.Server):
    """aiohttp's low-level server with a bound on open connections and JSON parse errors.

    A connection opened while ``max_connections`` are open (counting those still in their
    TLS handshake) is answered ``429 overloaded`` and closed before anything is parsed;
    the others get a :class:`JsonErrorRequestHandler`.
    """

    def __init__(
        self,
        handler: Any,
        *,
        max_connections: int,
        on_refused: Callable[[], None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections
        self.on_refused = on_refused
        self.refused = 0
        self._handler_options = {
            k: v for k, v in kwargs.items() if k not in ("request_factory", "loop")
        }
        self._handler_options.pop("handler_cancellation", None)
        # handlers made but not connected yet (a TLS handshake), with when they were made
        self._opening: weakref.WeakKeyDictionary[web.RequestHandler, float] = (
            weakref.WeakKeyDictionary()
        )
        self._answer = refusal_bytes(
            Overloaded(f"this peer has {max_connections} connections open, the bound; retry later")
        )

    @property
    def open_connections(self) -> int:
        """Connections open or opening (a TLS handshake in progress, for at most asyncio's
        handshake timeout: one that failed is forgotten then, if not collected before)."""
        oldest = time.monotonic() - HANDSHAKE_TIMEOUT_S
        for handler, made in list(self._opening.items()):
            if made < oldest:
                self._opening.pop(handler, None)
        return len(self.connections) + len(self._opening)

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        self._opening.pop(handler, None)
        super().connection_made(handler, transport)

    def __call__(self) -> Any:  # asyncio's protocol factory
        if self.open_connections >= self.max_connections:
            self.refused += 1
            self.on_refused()
            return _RefusedConnection(self._answer)
        handler = JsonErrorRequestHandler(
            self, loop=asyncio.get_running_loop(), **self._handler_options
        )
        self._opening[handler] = time.monotonic()
        return handler


class PeerRunner(web.AppRunner):
    """An ``AppRunner`` whose server is a :class:`PeerServer` (``peer.transport.server.make_runner``)."""

    def __init__(
        self,
        app: web.Application,
        *,
        max_connections: int,
        on_refused: Callable[[], None] = lambda: None,
        **handler_options: Any,
    ) -> None:
        super().__init__(app, **handler_options)
        self._max_connections = max_connections
        self._on_refused = on_refused
        self._handler_options = handler_options

    async def _make_server(self) -> web.Server:
        # aiohttp's own: runs the app's startup hooks and freezes it; its handler and
        # request factory are then served by a PeerServer instead
        plain = await super()._make_server()
        inner = plain.request_handler

        async def handle(request: BaseRequest) -> web.StreamResponse:
            try:
                return await inner(request)
            except web.HTTPException as error:  # raised before the middlewares (Expect)
                if error.status < 400:
                    raise
                return http_error_response(request, error)

        return PeerServer(
            handle,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            max_connections=self._max_connections,
            on_refused=self._on_refused,
            **self._handler_options,
        )
