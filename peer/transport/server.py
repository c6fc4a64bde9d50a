"""The peer's HTTP server (aiohttp): :func:`build_app` routes the endpoints, :func:`make_runner`
and :func:`listen` serve them.

Endpoints (see docs/protocol.md and peer/openapi.yaml):

==========================  ==========  ======================================================
``POST /v1/exchange``       msgpack     push-pull: caller's parameters in, ours out, one round trip
``POST /v1/join``           JSON        announce ``{id, address}``; answer with our membership view
``GET  /v1/peers``          JSON        our membership view
``GET  /v1/state``          msgpack     the full model (dense codec) for a newcomer
``GET  /v1/status``         JSON        id, round, step, loss, neighbours, bytes in/out (open)
``GET  /metrics``           text        Prometheus exposition of this peer's registry (open)
==========================  ==========  ======================================================

**Authenticate before you spend.** On every signed endpoint the ``Authorization`` header's
form and timestamp window are checked before anything is reserved or a body byte read;
a stream-signed header (``/v1/exchange``, ``/v1/state``) is verified whole at that point.
Then, in this order and before the body is read: the body cap (``413``), and the bound of
what the request would hold (:mod:`peer.transport.admission`): an exchange slot (``409 busy``) for
a model-sized body whose header is authentic or in an open swarm, or a share of the
unauthenticated byte budget (``429 overloaded``) for a body that must be read before its
digest signature can be checked (JSON control bodies, digest-signed exchanges). A body
with a Content-Encoding is refused unread (``400 malformed_request``; the server never
decodes one). Bodies are read through their cap as they arrive (never read whole, then
measured), each under the body deadline (``408 body_timeout``), and authenticated before
they are parsed (:mod:`peer.transport.reading`: a forged request is ``401`` whatever its
body); whatever was taken is given back when the request ends, however it ends. A model-sized answer is written while its slot is held,
under the same deadline, so slow readers cannot pile up answers.

**JSON errors everywhere.** Every refusal is a :class:`~peer.protocol.errors.ProtocolError`
answered as ``{"error": code, "detail": message}``: the endpoints' own, aiohttp's HTTP
errors (404, 405 with its ``Allow`` header, 417, 413) through :func:`http_error_response`,
and, with the runner of :func:`make_runner`, requests aiohttp cannot parse (request line,
headers, Content-Length: ``400 malformed_request``, ``431 headers_too_large``), logged as one
line each. An exception escaping a handler is a bug: ``500 internal_error``, traceback logged.

Responses to signed requests are signed in turn (bound to the request's nonce).

The server's modules, one job each: :mod:`~peer.transport.service` (what it serves),
:mod:`~peer.transport.context` (what its endpoints share), :mod:`~peer.transport.exchange`
(the exchange pipeline), :mod:`~peer.transport.answer` (model-sized answers, ``/v1/state``),
:mod:`~peer.transport.control` (the JSON endpoints), :mod:`~peer.transport.reading`
(authenticated body reads), :mod:`~peer.transport.socket_reads` (direct socket reads and
their fallback), :mod:`~peer.transport.responses` (JSON errors),
:mod:`~peer.transport.connection` (connections and the runner).
"""

from __future__ import annotations

import ssl
from functools import partial

from aiohttp import web

from peer.protocol.errors import Overloaded
from peer.transport.admission import MAX_JSON_BYTES, ServerLimits
from peer.transport.answer import state_endpoint
from peer.transport.connection import PeerRunner
from peer.transport.context import ServerContext
from peer.transport.control import json_errors, json_routes
from peer.transport.exchange import Exchange, exchange_expect
from peer.transport.responses import error_response, http_error_response
from peer.transport.service import (
    BODY_DEADLINE_S,
    OPEN_PATHS,
    SERVER_STATE,
    ServerMetrics,
    ServerState,
    Service,
)
from peer.transport.shaping import EmulatedLink

__all__ = [
    "BODY_DEADLINE_S",
    "MAX_JSON_BYTES",
    "OPEN_PATHS",
    "SERVER_STATE",
    "Listening",
    "ServerMetrics",
    "ServerState",
    "Service",
    "build_app",
    "error_response",
    "http_error_response",
    "listen",
    "make_runner",
]


def build_app(
    service: Service,
    limits: ServerLimits | None = None,
    *,
    direct_reads: bool | None = None,
    link: EmulatedLink | None = None,
) -> web.Application:
    """The aiohttp application serving ``service``'s endpoints within ``limits`` (default:
    :meth:`~peer.transport.admission.ServerLimits.of` the service). Serve it with :func:`make_runner`
    for the connection bound and JSON answers to unparseable requests. ``direct_reads``:
    ``False`` reads every body through aiohttp's public stream
    (:class:`~peer.transport.socket_reads.DirectReads`; ``None``: directly where it can).
    ``link``: the peer's emulated uplink its envelope answers go out on
    (:mod:`peer.transport.shaping`; ``None``: not shaped)."""
    limits = ServerLimits.of(service) if limits is None else limits
    ctx = ServerContext.of(service, limits, direct_reads=direct_reads, link=link)

    async def exchange_endpoint(request: web.Request) -> web.StreamResponse:
        return await Exchange(ctx, request).run()

    app = web.Application(middlewares=[json_errors], client_max_size=service.max_body_bytes)
    app[SERVER_STATE] = ctx.state()
    app.add_routes(
        [
            web.post(
                "/v1/exchange", exchange_endpoint, expect_handler=partial(exchange_expect, ctx)
            ),
            web.get("/v1/state", partial(state_endpoint, ctx), allow_head=False),
            *json_routes(ctx),
        ]
    )
    return app


def make_runner(
    service: Service,
    limits: ServerLimits | None = None,
    *,
    direct_reads: bool | None = None,
    link: EmulatedLink | None = None,
) -> web.AppRunner:
    """The runner serving ``service`` (``await runner.setup()``, then a ``web.TCPSite``):
    :func:`build_app` within ``limits`` (default :meth:`ServerLimits.of` the service) and
    ``direct_reads`` (and ``link``), served with the connection bound, the idle and header deadline,
    aiohttp's header parser bounds, no decoding of content-encoded bodies (they are
    refused unread), and JSON answers to requests aiohttp cannot parse."""
    limits = ServerLimits.of(service) if limits is None else limits

    def refused() -> None:
        service.metrics.errors(code=Overloaded.code).inc()

    return PeerRunner(
        build_app(service, limits, direct_reads=direct_reads, link=link),
        max_connections=limits.max_connections,
        on_refused=refused,
        access_log=None,
        keepalive_timeout=limits.idle_timeout_s,
        lingering_time=limits.linger_s,
        max_line_size=limits.max_field_bytes,
        max_field_size=limits.max_field_bytes,
        max_headers=limits.max_headers,
        auto_decompress=False,
    )


class Listening:
    """A served :class:`Service`: its bound ``port``; :meth:`close` stops serving."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.port = port

    @property
    def connections(self) -> int:
        """Connections open right now."""
        server = self.runner.server
        return 0 if server is None else len(server.connections)

    async def close(self) -> None:
        await self.runner.cleanup()


async def listen(
    service: Service,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    limits: ServerLimits | None = None,
    link: EmulatedLink | None = None,
) -> Listening:
    """Serve ``service`` on ``host:port`` (port 0: an ephemeral one) through
    :func:`make_runner`, answers on ``link`` (the peer's emulated uplink, ``None``: not
    shaped); the bound port is :attr:`Listening.port`."""
    runner = make_runner(service, limits, link=link)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return Listening(runner, runner.addresses[0][1])
