"""Swarm authentication in one import: the names of the modules that each do one job of it.

* :mod:`peer.protocol.signatures`: request and response signatures (digest-signed and
  stream-signed requests, Poly1305 body tags, signed responses) and their verification
  (:class:`RequestVerifier`); the wire form of the headers is described there.
* :mod:`peer.protocol.replay_cache`: :class:`NonceCache`, the bounded memory of accepted nonces.
* :mod:`peer.protocol.swarm_secret`: :func:`load_secret` and the open-swarm warning.
* :mod:`peer.protocol.tls`: the TLS contexts of a listening and a calling peer.

Every name below is the same object as in the module that owns it; new code imports from
that module.
"""

from __future__ import annotations

from peer.protocol.replay_cache import NonceCache
from peer.protocol.signatures import (
    RESPONSE_SIGNATURE_HEADER,
    SCHEME,
    STREAM_SCHEME,
    TAG_BYTES,
    RequestVerifier,
    body_digest,
    body_key,
    is_streamed,
    now_ms,
    parse_authorization,
    request_nonce,
    sign_request,
    sign_response,
    sign_response_digest,
    sign_stream_request,
    verify_response,
)
from peer.protocol.swarm_secret import (
    MIN_SECRET_BYTES,
    SECRET_ENV,
    OpenSwarmWarning,
    load_secret,
    warn_open_swarm,
)
from peer.protocol.tls import client_ssl_context, server_ssl_context

__all__ = [
    "MIN_SECRET_BYTES",
    "RESPONSE_SIGNATURE_HEADER",
    "SCHEME",
    "SECRET_ENV",
    "STREAM_SCHEME",
    "TAG_BYTES",
    "NonceCache",
    "OpenSwarmWarning",
    "RequestVerifier",
    "body_digest",
    "body_key",
    "client_ssl_context",
    "is_streamed",
    "load_secret",
    "now_ms",
    "parse_authorization",
    "request_nonce",
    "server_ssl_context",
    "sign_request",
    "sign_response",
    "sign_response_digest",
    "sign_stream_request",
    "verify_response",
    "warn_open_swarm",
]
