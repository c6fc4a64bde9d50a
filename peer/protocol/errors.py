"""Typed protocol errors, each mapped to one HTTP status and a JSON error body.

Every check a peer makes on a request (wire format, authentication, membership, the
server's admission bounds, the HTTP framing itself) raises a subclass of
:class:`ProtocolError`. The server turns it into ``{"error": code, "detail": message}``
with the class's ``status``; nothing of the request has touched the model by then. The
same classes are raised on the client side when a neighbour's *response* fails
validation. :data:`ERROR_CLASSES` lists every one; docs/protocol.md ("Errors") and
peer/openapi.yaml list the same codes and statuses (``tests/peer/test_protocol_doc.py``).
"""

from __future__ import annotations

from typing import ClassVar


class ProtocolError(Exception):
    """A request or response that violates the gossipnet protocol.

    ``status`` is the HTTP status the server answers with and ``code`` the stable,
    machine-readable ``error`` field of the JSON body (listed in docs/protocol.md).
    """

    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def to_json(self) -> dict[str, str]:
        return {"error": self.code, "detail": self.detail}


class MalformedBody(ProtocolError):
    """The body is not msgpack, or not the envelope's structure."""

    code = "malformed_body"


class UnsupportedVersion(ProtocolError):
    """The envelope's protocol version is not one this peer speaks."""

    code = "unsupported_version"


class UnknownCodec(ProtocolError):
    """The envelope names a codec this peer does not know."""

    code = "unknown_codec"


class InvalidSender(ProtocolError):
    """The sender id is empty, too long, or has characters outside [A-Za-z0-9._:-]."""

    code = "invalid_sender"


class InvalidRound(ProtocolError):
    """The round number is not an integer in [0, 2**53)."""

    code = "invalid_round"


class BodyTooLarge(ProtocolError):
    """The body exceeds the cap derived from the model's byte size."""

    status = 413
    code = "body_too_large"


class ShapeMismatch(ProtocolError):
    """A tensor's shape or element count does not match the local model."""

    status = 422
    code = "shape_mismatch"


class DTypeMismatch(ProtocolError):
    """A tensor's dtype is unknown or not the one the codec/local model needs."""

    status = 422
    code = "dtype_mismatch"


class NonFiniteValues(ProtocolError):
    """A tensor carries NaN or infinity."""

    status = 422
    code = "non_finite"


class Unauthorized(ProtocolError):
    """Missing, malformed, wrong, stale or replayed HMAC signature."""

    status = 401
    code = "unauthorized"


class UnknownPeer(ProtocolError):
    """The request needs a member the peer does not know (e.g. a wrong swarm)."""

    status = 409
    code = "unknown_peer"


class Busy(ProtocolError):
    """Both peers of a pair called each other at once (the smaller id declines its side), or
    the peer serves ``max_concurrent_exchanges`` exchanges already (answered before the
    body is read)."""

    status = 409
    code = "busy"


class NotReady(ProtocolError):
    """The peer cannot serve this request yet (e.g. sync round not reached before the deadline)."""

    status = 503
    code = "not_ready"


class SlowBody(ProtocolError):
    """The request body did not arrive within the peer's body deadline (the slot is freed)."""

    status = 408
    code = "body_timeout"


class Overloaded(ProtocolError):
    """The peer holds its bound of open connections or of unauthenticated body bytes
    (``peer.transport.admission``): nothing of the request was kept; retry later."""

    status = 429
    code = "overloaded"


class MalformedRequest(ProtocolError):
    """The HTTP request itself cannot be parsed: request line, header syntax,
    Content-Length or chunked framing (answered, then the connection is closed)."""

    code = "malformed_request"


class HeadersTooLarge(ProtocolError):
    """The request line or a header field is too long, or there are too many fields."""

    status = 431
    code = "headers_too_large"


class NotFound(ProtocolError):
    """No endpoint at this path."""

    status = 404
    code = "not_found"


class MethodNotAllowed(ProtocolError):
    """The path exists but not with this method (the answer's ``Allow`` header lists those
    it takes)."""

    status = 405
    code = "method_not_allowed"


class ExpectationFailed(ProtocolError):
    """An ``Expect`` header other than ``100-continue``."""

    status = 417
    code = "expectation_failed"


class InternalError(ProtocolError):
    """A bug in the peer, never the input's doing (the request changed nothing it was
    refused for; the traceback is logged): please report it."""

    status = 500
    code = "internal_error"


ERROR_CLASSES: tuple[type[ProtocolError], ...] = (
    MalformedBody,
    UnsupportedVersion,
    UnknownCodec,
    InvalidSender,
    InvalidRound,
    BodyTooLarge,
    ShapeMismatch,
    DTypeMismatch,
    NonFiniteValues,
    Unauthorized,
    UnknownPeer,
    Busy,
    NotReady,
    SlowBody,
    Overloaded,
    MalformedRequest,
    HeadersTooLarge,
    NotFound,
    MethodNotAllowed,
    ExpectationFailed,
    InternalError,
)
"""Every error a peer answers with; docs/protocol.md and openapi.yaml list the same codes."""


ALIVE_REFUSALS = frozenset({Busy.code, Overloaded.code})
"""Refusals that say the neighbour is alive and merely full (``409 busy``: its exchange
slots or serving share; ``429 overloaded``: its connection bound): a caller counts them as
busy, not as a failed call, and does not suspect the neighbour for them."""
