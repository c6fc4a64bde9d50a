"""TLS contexts for a listening peer and for calling peers (TLS 1.2 or later)."""

from __future__ import annotations

import os
import ssl

__all__ = ["client_ssl_context", "server_ssl_context"]


def server_ssl_context(
    certfile: str | os.PathLike[str],
    keyfile: str | os.PathLike[str],
    *,
    cafile: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """TLS context for a listening peer; with ``cafile`` clients must present a cert it signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if cafile is not None:
        context.load_verify_locations(cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(
    *,
    cafile: str | os.PathLike[str] | None = None,
    certfile: str | os.PathLike[str] | None = None,
    keyfile: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """TLS context for calling peers: verify them against ``cafile`` (default: system CAs)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    elif keyfile is not None:
        raise ValueError("keyfile needs certfile (the client certificate)")
    return context
