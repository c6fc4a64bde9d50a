"""The peer's HTTP server (aiohttp): endpoints, admission, authentication, JSON errors.

Endpoints (protocol version 1, see docs/protocol.md and peer/openapi.yaml):

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
digest signature can be checked (JSON control bodies, digest-signed exchanges). Bodies
are read through their cap as they arrive (never read whole, then measured), each under
the body deadline (``408 body_timeout``), and whatever was taken is given back when the
request ends, however it ends. A model-sized answer is written while its slot is held,
under the same deadline, so slow readers cannot pile up answers.

**JSON errors everywhere.** Every refusal is a :class:`~peer.protocol.errors.ProtocolError`
answered as ``{"error": code, "detail": message}``: the endpoints' own, aiohttp's HTTP
errors (404, 405 with its ``Allow`` header, 417, 413) through :func:`http_error_response`,
and, with the runner of :func:`make_runner`, requests aiohttp cannot parse (request line,
headers, Content-Length: ``400 malformed_request``, ``431 headers_too_large``), logged as one
line each. An exception escaping a handler is a bug: ``500 internal_error``, traceback logged.

Responses to signed requests are signed in turn (bound to the request's nonce).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.http_parser import HttpRequestParser
from aiohttp.streams import StreamReader as HttpStream
from aiohttp.web_protocol import MAX_MSG_QUEUE_SIZE, RequestPayloadError
from aiohttp.web_request import BaseRequest

from peer.protocol.auth import (
    SCHEME,
    STREAM_SCHEME,
    RequestVerifier,
    body_key,
    is_streamed,
    sign_response,
    sign_response_digest,
)
from peer.protocol.codecs import Codec
from peer.protocol.errors import (
    BodyTooLarge,
    Busy,
    ExpectationFailed,
    HeadersTooLarge,
    InternalError,
    MalformedBody,
    MalformedRequest,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    ProtocolError,
    SlowBody,
    Unauthorized,
)
from peer.protocol.growing import ProducerFailed
from peer.protocol.strict_json import expect_object, loads
from peer.protocol.threads import in_thread
from peer.protocol.wire import (
    PROTOCOL_VERSION,
    Envelope,
    ModelSpec,
    check_envelope,
    envelope_object,
)
from peer.transport.admission import (
    DEFAULT_BODY_TIMEOUT_S,
    MAX_JSON_BYTES,
    ByteAccount,
    ByteBudget,
    ServerLimits,
    ServingShare,
    Slots,
)
from peer.transport.body import MSGPACK, ArenaPool, EnvelopeBody, read_envelope_object
from peer.transport.receive import can_take_over, take_over

__all__ = [
    "BODY_DEADLINE_S",
    "MAX_JSON_BYTES",
    "OPEN_PATHS",
    "SERVER_STATE",
    "Listening",
    "ServerState",
    "Service",
    "build_app",
    "error_response",
    "http_error_response",
    "listen",
    "make_runner",
]

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/v1/status", "/metrics"})
"""Read-only endpoints that carry no model and answer without a signature (not wrapped)."""
BODY_DEADLINE_S = DEFAULT_BODY_TIMEOUT_S
"""Default for the time a request body may take to arrive (``Service.body_timeout_s``)."""
LINGER_S = 10.0
"""After refusing a request whose body was not read, how long aiohttp reads and drops the
rest of it before it closes the connection (aiohttp's default): closing on a caller still
sending resets the connection, and its kernel may drop the refusal unread."""

HANDSHAKE_TIMEOUT_S = 60.0
"""asyncio's TLS handshake timeout: a connection still opening after it has failed."""

_HTTP_ERRORS: dict[int, type[ProtocolError]] = {
    400: MalformedRequest,
    404: NotFound,
    405: MethodNotAllowed,
    413: BodyTooLarge,
    417: ExpectationFailed,
    429: Overloaded,
    431: HeadersTooLarge,
}
"""aiohttp's own HTTP errors, as the protocol error each is answered with."""


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Histogram(Protocol):
    def observe(self, amount: float) -> None: ...


class ServerMetrics(Protocol):
    """The counters the server records (``peer.node.metrics.PeerMetrics`` has them): label
    functions, as prometheus-client's ``Counter(...).labels`` and ``Histogram(...).labels``
    (``bytes(direction=)``, ``exchanges(role=, outcome=)``, ``errors(code=)``,
    ``exchange_phase_seconds(role=, phase=)``)."""

    @property
    def bytes(self) -> Callable[..., _Counter]: ...

    @property
    def exchanges(self) -> Callable[..., _Counter]: ...

    @property
    def errors(self) -> Callable[..., _Counter]: ...

    @property
    def exchange_phase_seconds(self) -> Callable[..., _Histogram]: ...


class Service(Protocol):
    """What the server needs from a peer (``peer.node.peer.Peer`` implements it).

    Read where present (:meth:`peer.transport.admission.ServerLimits.of` and below):
    ``body_timeout_s``, ``max_connections``, ``max_unauthenticated_bytes``,
    ``idle_timeout_s``, ``retains_messages`` (received messages outlive their request:
    no reused receive buffers) and ``pin_buffers`` (page-locked receive buffers).
    """

    peer_id: str
    spec: ModelSpec
    message_spec: ModelSpec
    max_body_bytes: int
    max_concurrent_exchanges: int
    codecs: dict[str, Codec]
    verifier: RequestVerifier | None
    secret: bytes | None

    @property
    def metrics(self) -> ServerMetrics: ...

    async def on_exchange(self, envelope: Envelope, vector: torch.Tensor) -> Envelope: ...

    def on_join(self, peer_id: str, address: str | None) -> list[dict[str, Any]]: ...

    def peers_view(self) -> list[dict[str, Any]]: ...

    async def state_envelope(self) -> Envelope: ...

    def status(self) -> dict[str, Any]: ...

    def render_metrics(self) -> bytes: ...


@dataclass
class ServerState:
    """What one app's admission holds right now (``app[SERVER_STATE]``; tests and benches)."""

    limits: ServerLimits
    slots: Slots
    budget: ByteBudget


SERVER_STATE = web.AppKey("gossipnet_server_state", ServerState)
ANSWERED = web.RequestKey("gossipnet_answered", str)
"""``request[ANSWERED]``: how an envelope answer ended when it did not reach the caller whole
(``unanswered``: not taken in time or the connection broke; ``failed``: the answer's worker
failed), for the callee's ``gossipnet_exchanges_total`` outcome; absent when it was written."""
DIRECT_READ = web.RequestKey("gossipnet_direct_read", bool)
"""``request[DIRECT_READ]`` is true while a request's body read straight from its socket
(``peer.transport.receive``) left aiohttp's parser of the connection out of step: the answer then
closes the connection (``Connection: close``). A body read whole on a connection served by
:class:`JsonErrorRequestHandler` renews the parser instead, and the connection stays."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyHandler = Callable[[web.Request, bytes], Awaitable[web.Response]]
EnvelopeHandler = Callable[[web.Request, Any, Any], Awaitable[Envelope]]


def error_response(error: ProtocolError, headers: dict[str, str] | None = None) -> web.Response:
    """``{"error": code, "detail": message}`` with the error's status."""
    return web.json_response(error.to_json(), status=error.status, headers=headers)


def http_error_response(request: BaseRequest, error: web.HTTPException) -> web.StreamResponse:
    """aiohttp's HTTP error as the protocol's JSON error, keeping its headers (``Allow``)."""
    kind = _HTTP_ERRORS.get(error.status)
    detail = f"{request.method} {request.path}: {error.reason}"
    body = (
        kind(detail).to_json()
        if kind is not None
        else {"error": error.reason.lower().replace(" ", "_"), "detail": detail}
    )
    keep = {
        name: value
        for name, value in error.headers.items()
        if name.lower() not in ("content-type", "content-length")
    }
    return web.json_response(body, status=error.status, headers=keep)


def _digest_of(pieces: list[Any]) -> str:
    sha = hashlib.sha256()
    for piece in pieces:
        sha.update(piece)
    return sha.hexdigest()


def _share_busy(share: ServingShare) -> Busy:
    """The refusal of an exchange beyond the serving share (``peer.transport.admission.ServingShare``)."""
    return Busy(
        f"serving has taken {share.max_share:.0%} of this peer's time while it trains (the "
        "bound, max_serving_share); retry later"
    )


def _has_body(request: web.Request) -> bool:
    length = request.content_length
    return bool(length) or (length is None and request.body_exists)


async def _read_json_body(
    stream: HttpStream, *, length: int | None, cap: int, account: ByteAccount, deadline_s: float
) -> bytes:
    """A JSON control body, at most ``cap`` bytes, every chunk charged to ``account`` as it
    arrives (so a large or slow body holds no more than it sent, within the budget)."""
    body = bytearray()
    try:
        async with asyncio.timeout(deadline_s):
            while chunk := await stream.readany():
                if len(body) + len(chunk) > cap:
                    raise BodyTooLarge(f"body exceeds the cap of {cap} bytes")
                account.charge(len(chunk))
                body += chunk
    except TimeoutError:
        raise SlowBody(f"body not received within {deadline_s:g} s") from None
    except (ConnectionError, web.RequestPayloadError, HttpProcessingError) as error:
        raise MalformedBody(f"body broken off: {error}") from None
    if length is not None and len(body) != length:
        raise MalformedBody(f"body ended after {len(body)} of {length} bytes (Content-Length)")
    return bytes(body)


def build_app(service: Service, limits: ServerLimits | None = None) -> web.Application:
    """The aiohttp application serving ``service``'s endpoints within ``limits`` (default:
    :meth:`~peer.transport.admission.ServerLimits.of` the service). Serve it with :func:`make_runner`
    for the connection bound and JSON answers to unparseable requests."""
    limits = ServerLimits.of(service) if limits is None else limits
    deadline_s = limits.body_timeout_s
    slots = Slots(limits.max_concurrent_exchanges)
    budget = ByteBudget(limits.max_unauthenticated_bytes)
    arenas = ArenaPool(
        limits.max_concurrent_exchanges, pin=bool(getattr(service, "pin_buffers", False))
    )

    def _refused(request: web.Request, error: ProtocolError) -> web.Response:
        service.metrics.errors(code=error.code).inc()
        logger.info("%s %s refused: %s", request.method, request.path, error.detail)
        response = error_response(error)
        if request.get(DIRECT_READ):
            response.force_close()
        return response

    def _sign(response: web.Response, nonce: str | None) -> web.Response:
        body_out = response.body
        if isinstance(body_out, bytes | bytearray):
            service.metrics.bytes(direction="out").inc(len(body_out))
            if service.secret is not None and nonce is not None:
                response.headers.update(
                    sign_response(service.secret, response.status, nonce, bytes(body_out))
                )
        return response

    def _check_json_header(request: web.Request) -> None:
        if service.verifier is not None:
            service.verifier.check_form(request.headers)
            if is_streamed(request.headers):
                raise Unauthorized(
                    f"{request.path} takes digest-signed requests ({SCHEME}), not {STREAM_SCHEME}"
                )

    def protected(handler: BodyHandler, *, takes_body: bool) -> Handler:
        """The JSON control endpoints: header form and clock checked first; a body (join) is
        read through ``MAX_JSON_BYTES`` and the unauthenticated byte budget as it arrives,
        under the body deadline, then the digest signature is checked; the answer is
        signed. ``takes_body=False`` (a GET) refuses any body before reading it."""

        async def checked(request: web.Request) -> web.StreamResponse:
            nonce = None
            response: web.Response
            try:
                with budget.account() as account:
                    _check_json_header(request)
                    length = request.content_length
                    body = b""
                    if not takes_body:
                        if _has_body(request):
                            raise MalformedBody(f"{request.method} {request.path} takes no body")
                    elif length is not None and length > MAX_JSON_BYTES:
                        raise BodyTooLarge(f"body has {length} bytes, the cap is {MAX_JSON_BYTES}")
                    elif _has_body(request):
                        body = await _read_json_body(
                            request.content,
                            length=length,
                            cap=MAX_JSON_BYTES,
                            account=account,
                            deadline_s=deadline_s,
                        )
                    if service.verifier is not None:
                        nonce = service.verifier.verify(
                            request.method, request.path_qs, request.headers, body
                        )
                    service.metrics.bytes(direction="in").inc(len(body))
                    response = await handler(request, body)
            except ProtocolError as error:
                response = _refused(request, error)
            return _sign(response, nonce)

        return checked

    async def _read_envelope(
        request: web.Request, *, arena: torch.Tensor | None, tag_key: bytes | None, digest: bool
    ) -> tuple[Any, str | None]:
        """The request's envelope, read under the body deadline. A model-sized body is read
        straight into ``arena`` (``peer.transport.receive``: its connection then closes after the
        answer, ``request[DIRECT_READ]``); other bodies through aiohttp's stream."""
        length = request.content_length
        direct = None
        if length is not None and can_take_over(request.headers, length):
            # until the parser is renewed, the connection must close after the answer
            direct = take_over(request.transport, request.protocol, request.content, length=length)
            request[DIRECT_READ] = direct is not None
        read_whole = False
        try:
            async with asyncio.timeout(deadline_s):
                result = await read_envelope_object(
                    direct if direct is not None else request.content,
                    length=length,
                    cap=service.max_body_bytes,
                    arena=arena,
                    tag_key=tag_key,
                    digest=digest,
                )
            read_whole = True
            return result
        except TimeoutError:
            raise SlowBody(f"body not received within {deadline_s:g} s") from None
        except (ConnectionError, web.RequestPayloadError, HttpProcessingError) as error:
            raise MalformedBody(f"body broken off: {error}") from None
        finally:
            if direct is not None:
                # a body read to its last byte and then refused (a wrong tag, trailing
                # bytes) leaves the connection in step as a good one does
                if read_whole or (direct.remaining == 0 and not direct.ended):
                    handler = request.protocol
                    renewed = isinstance(handler, JsonErrorRequestHandler) and (
                        handler.renew_parser()
                    )
                    direct.finish(request.content, keep_alive=renewed)
                    request[DIRECT_READ] = not renewed
                else:
                    direct.abandon()

    def _busy() -> Busy:
        return Busy(f"{slots.in_use} exchanges in progress, the bound is {slots.size}; retry later")

    share = getattr(service, "serving_share", None)

    def _take_exchange_slot() -> float:
        """An exchange slot, if the serving share (``peer.transport.admission.ServingShare``) and
        the slot bound allow it; returns when serving started."""
        if share is not None and not share.admit():
            raise _share_busy(share)
        slots.take_now(_busy())
        return share.start() if share is not None else 0.0

    async def exchange_endpoint(request: web.Request) -> web.StreamResponse:
        """``POST /v1/exchange``: authenticate, admit (slot or budget), read as it streams
        (into a reused buffer where the service allows), answer within the slot."""
        nonce = None
        stream = False
        slot = False
        started = 0.0
        arena = None
        length = request.content_length
        entered = time.perf_counter()
        try:
            with budget.account() as account:
                verifier = service.verifier
                if verifier is not None:
                    stream = is_streamed(request.headers)
                    if stream:
                        nonce = verifier.verify_stream(
                            request.method, request.path_qs, request.headers, length or 0
                        )
                    else:
                        verifier.check_form(request.headers)
                if length is not None and length > service.max_body_bytes:
                    raise BodyTooLarge(
                        f"body has {length} bytes, the cap is {service.max_body_bytes}"
                    )
                if not _has_body(request):
                    raise MalformedBody("an exchange needs a body (the caller's envelope)")
                unverified = verifier is not None and not stream
                if unverified:
                    # read before its digest can be checked: held under the byte budget
                    need = length if length is not None else service.max_body_bytes
                    if need > budget.capacity:
                        raise BodyTooLarge(
                            f"a digest-signed body is read before its signature can be "
                            f"checked: at most {budget.capacity} bytes, got {need}; sign "
                            f"larger bodies with {STREAM_SCHEME}"
                        )
                    account.charge(need)
                else:
                    started = _take_exchange_slot()
                    slot = True
                    if length is not None and not getattr(service, "retains_messages", True):
                        arena = arenas.take(length)
                tag_key = None
                if stream and nonce is not None and verifier is not None:
                    tag_key = verifier.body_key(nonce, "request")
                obj, digest = await _read_envelope(
                    request, arena=arena, tag_key=tag_key, digest=unverified
                )
                service.metrics.bytes(direction="in").inc(length or 0)
                if unverified:
                    assert verifier is not None and digest is not None
                    nonce = verifier.verify_digest(
                        request.method, request.path_qs, request.headers, digest
                    )
                    started = _take_exchange_slot()
                    slot = True
                received = time.perf_counter()
                envelope, vector = await _decode_request(obj)
                checked = time.perf_counter()
                reply = await service.on_exchange(envelope, vector)
                response = await _send_envelope(request, reply, nonce, stream)
                # ok: averaged and answered whole; unanswered: averaged, but the caller did
                # not take the answer (it applies nothing: the pair's sum moved); failed:
                # the answer failed before it was whole (the model is unchanged)
                outcome = request.get(ANSWERED, "ok")
                service.metrics.exchanges(role="callee", outcome=outcome).inc()
                if outcome == "ok":
                    phase = service.metrics.exchange_phase_seconds
                    phase(role="callee", phase="receive").observe(received - entered)
                    phase(role="callee", phase="check").observe(checked - received)
                    phase(role="callee", phase="answer").observe(time.perf_counter() - checked)
                return response
        except ProtocolError as error:
            return _sign(_refused(request, error), nonce)
        finally:
            if slot:
                slots.give()
                if share is not None:
                    share.done(started)
            if arena is not None:
                arenas.give(arena)

    async def exchange_expect(request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` on ``POST /v1/exchange``: the checks that cost nothing
        (the signature header's form, receiver and clock window; the size cap; a free slot
        and the serving share) run on the headers alone, and a caller that would be refused
        gets its refusal *before* it sends its model (no model-sized body crosses the network
        to be dropped, no connection lingers to drain it). The full checks run again when the
        body comes (the slot may be gone by then: ``409 busy`` as without Expect)."""
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            return _refused(request, ExpectationFailed(f"unknown Expect: {expect[:64]!r}"))
        try:
            if service.verifier is not None:
                service.verifier.check_form(request.headers)
            length = request.content_length
            if length is not None and length > service.max_body_bytes:
                raise BodyTooLarge(f"body has {length} bytes, the cap is {service.max_body_bytes}")
            if slots.in_use >= slots.size:
                raise _busy()
            if share is not None and not share.admit():
                raise _share_busy(share)
        except ProtocolError as error:
            # answer and close now: the caller sends no body, and neither side may wait for
            # it (aiohttp's client keeps a connection whose 100 never came; its server would
            # linger for the unread body)
            response = _sign(_refused(request, error), None)
            response.force_close()
            await response.prepare(request)
            await response.write_eof()
            if request.transport is not None:
                request.transport.close()
            return response
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    async def _decode_request(obj: Any) -> tuple[Envelope, torch.Tensor]:
        """The request's envelope and its validated vector (a typed error refuses it)."""
        try:
            envelope = check_envelope(obj, codecs=service.codecs)
            if envelope.sender == service.peer_id:
                raise MalformedBody(f"sender {envelope.sender!r} is this peer's own id")
            codec = service.codecs[envelope.codec]
            vector = await in_thread(codec.decode, envelope.payload, service.message_spec)
        except ProtocolError:
            service.metrics.exchanges(role="callee", outcome="refused").inc()
            raise
        return envelope, vector

    async def state_endpoint(request: web.Request) -> web.StreamResponse:
        """``GET /v1/state``: verified whole before anything (it has no body), then it waits
        for a slot (a snapshot of the model is one model copy) up to the body deadline."""
        nonce = None
        stream = False
        slot = False
        try:
            verifier = service.verifier
            if verifier is not None:
                stream = is_streamed(request.headers)
                if stream:
                    nonce = verifier.verify_stream(
                        request.method, request.path_qs, request.headers, 0
                    )
                else:
                    verifier.check_form(request.headers)
            if _has_body(request):
                raise MalformedBody("GET /v1/state takes no body")
            if verifier is not None and not stream:
                empty = hashlib.sha256(b"").hexdigest()
                nonce = verifier.verify_digest(
                    request.method, request.path_qs, request.headers, empty
                )
            try:
                await slots.take(deadline_s)
            except TimeoutError:
                raise Busy(
                    f"no exchange slot freed within {deadline_s:g} s (the bound is "
                    f"{slots.size}); retry later"
                ) from None
            slot = True
            reply = await service.state_envelope()
            return await _send_envelope(request, reply, nonce, stream)
        except ProtocolError as error:
            return _sign(_refused(request, error), nonce)
        finally:
            if slot:
                slots.give()

    async def _send_envelope(
        request: web.Request, reply: Envelope, nonce: str | None, stream: bool
    ) -> web.StreamResponse:
        """Write ``reply`` now (the caller holds its slot until it is written), signed as the
        request was, under the body deadline; a reader too slow for it is cut off."""
        signing = service.secret is not None and nonce is not None
        tag_key = None
        if signing and stream:
            tag_key = body_key(service.secret, nonce, "response", 200)  # type: ignore[arg-type]
        body = EnvelopeBody(envelope_object(reply), tag_key=tag_key)
        try:
            return await _write_envelope(request, body, nonce, signing and not stream)
        finally:
            await body.settled()  # a worker still filling the answer keeps the slot
            body.release()  # the answer's memory goes with the slot

    async def _write_envelope(
        request: web.Request, body: EnvelopeBody, nonce: str | None, digest_signed: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = MSGPACK
        response.content_length = body.size
        if request.get(DIRECT_READ):
            response.force_close()
        if digest_signed:
            pieces = await body.written_pieces()
            digest = await asyncio.to_thread(_digest_of, pieces)
            response.headers.update(
                sign_response_digest(service.secret, 200, nonce, digest)  # type: ignore[arg-type]
            )
        service.metrics.bytes(direction="out").inc(body.size or 0)
        try:
            async with asyncio.timeout(deadline_s):
                writer: AbstractStreamWriter | None = await response.prepare(request)
                if writer is not None:
                    await body.write(writer)
                await response.write_eof()
        except (TimeoutError, ConnectionError) as error:
            logger.info(
                "%s %s: answer not taken within %g s (%s); connection closed",
                request.method,
                request.path,
                deadline_s,
                type(error).__name__,
            )
            request[ANSWERED] = "unanswered"
            if request.transport is not None:
                request.transport.abort()
        except ProducerFailed as error:
            # the answer's headers are out: the caller gets a cut body, and applies nothing
            # (our own model non-finite: training diverged; anything else is a bug, whose
            # traceback --log-level DEBUG shows)
            cause = error.__cause__
            logger.error(
                "%s %s: the answer failed mid-way (%s: %s); connection closed, model unchanged",
                request.method,
                request.path,
                type(cause).__name__,
                cause,
            )
            logger.debug("the answer's failure", exc_info=cause)
            request[ANSWERED] = "failed"
            if request.transport is not None:
                request.transport.abort()
        return response

    @web.middleware
    async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Unknown paths and methods (and any other HTTP error) answer in the JSON error
        shape; an unexpected exception is a bug: ``500 internal_error``, logged."""
        try:
            return await handler(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            return http_error_response(request, error)
        except Exception:
            logger.exception("%s %s: unexpected error (a bug)", request.method, request.path)
            return error_response(InternalError("unexpected error in the peer (logged)"))

    async def join(request: web.Request, body: bytes) -> web.Response:
        obj = loads(body, what="join body", max_bytes=MAX_JSON_BYTES)
        fields = expect_object(
            obj, what="join body", required={"id": str, "address": (str, type(None))}
        )
        view = service.on_join(fields["id"], fields["address"])
        return web.json_response({"v": PROTOCOL_VERSION, "id": service.peer_id, "peers": view})

    async def peers(request: web.Request, body: bytes) -> web.Response:
        return web.json_response(
            {"v": PROTOCOL_VERSION, "id": service.peer_id, "peers": service.peers_view()}
        )

    async def status(request: web.Request) -> web.StreamResponse:
        return web.json_response(service.status())

    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=service.render_metrics(), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    app = web.Application(middlewares=[json_errors], client_max_size=service.max_body_bytes)
    app[SERVER_STATE] = ServerState(limits=limits, slots=slots, budget=budget)
    app.add_routes(
        [
            web.post("/v1/exchange", exchange_endpoint, expect_handler=exchange_expect),
            web.post("/v1/join", protected(join, takes_body=True)),
            web.get("/v1/peers", protected(peers, takes_body=False), allow_head=False),
            web.get("/v1/state", state_endpoint, allow_head=False),
            web.get("/v1/status", status),
            web.get("/metrics", metrics),
        ]
    )
    return app


# ---------------------------------------------------------------------- the connection layer


def _parse_error(status: int, exc: BaseException | None, message: str | None) -> ProtocolError:
    """The protocol error for what aiohttp's ``RequestHandler.handle_error`` is handed."""
    if status >= 500:
        return InternalError("unexpected error in the peer (logged)")
    text = str(getattr(exc, "message", None) or message or exc or "unparseable request")
    text = " ".join(text.split())[:200]
    if isinstance(exc, LineTooLong) or status == 431 or "too many headers" in text.lower():
        return HeadersTooLarge(f"request line or headers too large: {text}")
    kind = _HTTP_ERRORS.get(status, MalformedRequest)
    return kind(f"HTTP request not understood: {text}")


class JsonErrorRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering what it cannot parse in JSON.

    aiohttp answers a request it cannot parse (request line, headers, framing) through
    ``RequestHandler.handle_error`` with a text body and a logged traceback; here it is
    the protocol's JSON error, logged as one line (a traceback only for a 5xx: a bug).
    """

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, **kwargs: Any):
        super().__init__(manager, loop=loop, **kwargs)
        self._parser_options = {
            "max_line_size": kwargs.get("max_line_size", 8190),
            "max_field_size": kwargs.get("max_field_size", 8190),
            "max_headers": kwargs.get("max_headers", 128),
            "auto_decompress": kwargs.get("auto_decompress", True),
        }
        self._parser_bufsize = kwargs.get("read_bufsize", 2**16)

    def renew_parser(self) -> bool:
        """Give the connection a fresh HTTP parser, configured as aiohttp made the first:
        after a request body was read straight from the socket (``peer.transport.receive``), the old
        parser still expects those bytes, and would take the next request for them. False
        (the connection must then be closed) where aiohttp's internals are not as expected."""
        if getattr(self, "_parser", None) is None or getattr(self, "_upgraded", True):
            return False
        try:
            parser = HttpRequestParser(
                self,
                self._loop,
                self._parser_bufsize,
                payload_exception=RequestPayloadError,
                max_msg_queue_size=MAX_MSG_QUEUE_SIZE,
                **self._parser_options,
            )
        except TypeError:
            return False
        self._parser = parser
        return True

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
            logger.debug("connection from %s lost: %s", request.remote, exc)
            lost = error_response(MalformedRequest("the connection was lost"))
            lost.force_close()
            return lost
        error = _parse_error(status, exc, message)
        if error.status >= 500:
            logger.error("request from %s failed (a bug)", request.remote, exc_info=exc)
        else:
            logger.info("refused a request from %s: %s", request.remote, error.detail)
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


def _refusal_bytes(error: ProtocolError) -> bytes:
    body = error_response(error).text or ""
    payload = body.encode()
    head = (
        f"HTTP/1.1 {error.status} Too Many Requests\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


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
        self._answer = _refusal_bytes(
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
    """An ``AppRunner`` whose server is a :class:`PeerServer` (see :func:`make_runner`)."""

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


def make_runner(service: Service, limits: ServerLimits | None = None) -> web.AppRunner:
    """The runner serving ``service`` (``await runner.setup()``, then a ``web.TCPSite``):
    :func:`build_app` within ``limits`` (default :meth:`ServerLimits.of` the service),
    served with the connection bound, the idle and header deadline, aiohttp's header
    parser bounds, and JSON answers to requests aiohttp cannot parse."""
    limits = ServerLimits.of(service) if limits is None else limits

    def refused() -> None:
        service.metrics.errors(code=Overloaded.code).inc()

    return PeerRunner(
        build_app(service, limits),
        max_connections=limits.max_connections,
        on_refused=refused,
        access_log=None,
        keepalive_timeout=limits.idle_timeout_s,
        lingering_time=LINGER_S,
        max_line_size=limits.max_field_bytes,
        max_field_size=limits.max_field_bytes,
        max_headers=limits.max_headers,
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
) -> Listening:
    """Serve ``service`` on ``host:port`` (port 0: an ephemeral one) through
    :func:`make_runner`; the bound port is :attr:`Listening.port`."""
    runner = make_runner(service, limits)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return Listening(runner, runner.addresses[0][1])
