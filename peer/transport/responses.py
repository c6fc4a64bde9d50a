"""The server's refusals as the protocol's JSON errors: ``{"error": code, "detail": message}``
for its own errors, aiohttp's HTTP errors and requests aiohttp cannot parse."""

from __future__ import annotations

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_request import BaseRequest

from peer.protocol.errors import (
    BodyTooLarge,
    ExpectationFailed,
    HeadersTooLarge,
    InternalError,
    MalformedRequest,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    ProtocolError,
)

__all__ = ["HTTP_ERRORS", "error_response", "http_error_response", "parse_error", "refusal_bytes"]

HTTP_ERRORS: dict[int, type[ProtocolError]] = {
    400: MalformedRequest,
    404: NotFound,
    405: MethodNotAllowed,
    413: BodyTooLarge,
    417: ExpectationFailed,
    429: Overloaded,
    431: HeadersTooLarge,
}
"""aiohttp's own HTTP errors, as the protocol error each is answered with."""


def error_response(error: ProtocolError, headers: dict[str, str] | None = None) -> web.Response:
    """``{"error": code, "detail": message}`` with the error's status."""
    return web.json_response(error.to_json(), status=error.status, headers=headers)


def http_error_response(request: BaseRequest, error: web.HTTPException) -> web.StreamResponse:
    """aiohttp's HTTP error as the protocol's JSON error, keeping its headers (``Allow``)."""
    kind = HTTP_ERRORS.get(error.status)
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


def parse_error(status: int, exc: BaseException | None, message: str | None) -> ProtocolError:
    """The protocol error for what aiohttp's ``RequestHandler.handle_error`` is handed."""
    if status >= 500:
        return InternalError("unexpected error in the peer (logged)")
    text = str(getattr(exc, "message", None) or message or exc or "unparseable request")
    text = " ".join(text.split())[:200]
    if isinstance(exc, LineTooLong) or status == 431 or "too many headers" in text.lower():
        return HeadersTooLarge(f"request line or headers too large: {text}")
    kind = HTTP_ERRORS.get(status, MalformedRequest)
    return kind(f"HTTP request not understood: {text}")


def refusal_bytes(error: ProtocolError) -> bytes:
    """A whole ``429`` HTTP answer carrying ``error``, closing its connection (written on a
    connection refused before aiohttp parses anything)."""
    body = error_response(error).text or ""
    payload = body.encode()
    head = (
        f"HTTP/1.1 {error.status} Too Many Requests\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload
