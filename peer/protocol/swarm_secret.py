"""The swarm secret: loading it (a file or ``GOSSIPNET_SECRET``), and the loud warning
when a peer runs without one (an open swarm).

Every peer of a swarm shares one secret, at least :data:`MIN_SECRET_BYTES` long; the
signatures of :mod:`peer.protocol.signatures` are keyed with it. Without a secret the swarm
is open: :func:`load_secret` returns ``None`` and the peer warns (:func:`warn_open_swarm`).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

__all__ = ["MIN_SECRET_BYTES", "SECRET_ENV", "OpenSwarmWarning", "load_secret", "warn_open_swarm"]

SECRET_ENV = "GOSSIPNET_SECRET"
"""The environment variable that holds the swarm secret when no secret file is given."""
MIN_SECRET_BYTES = 16
"""The shortest swarm secret accepted, in bytes."""

logger = logging.getLogger(__name__)


class OpenSwarmWarning(UserWarning):
    """Issued when a peer runs without a swarm secret: anyone can join and send updates."""


def load_secret(
    secret_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> bytes | None:
    """The swarm secret from ``secret_file`` or else the ``GOSSIPNET_SECRET`` variable.

    A file's content is used verbatim except for one trailing newline. Returns
    ``None`` when neither is set. Raises ``ValueError`` (naming the source) for a
    secret shorter than 16 bytes, and ``FileNotFoundError`` for a missing file.
    """
    env = os.environ if environ is None else environ
    if secret_file is not None:
        raw = Path(secret_file).read_bytes()
        secret = raw[:-1] if raw.endswith(b"\n") else raw
        secret = secret[:-1] if secret.endswith(b"\r") else secret
        source = f"secret file {secret_file}"
    elif env.get(SECRET_ENV):
        secret = env[SECRET_ENV].encode()
        source = f"environment variable {SECRET_ENV}"
    else:
        return None
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{source}: the swarm secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}"
        )
    return secret


def warn_open_swarm(peer_id: str) -> None:
    """Warn, through both ``warnings`` and ``logging``, that a peer runs unauthenticated."""
    message = (
        f"peer {peer_id}: NO SWARM SECRET — the swarm is OPEN: anyone who can reach this "
        f"port can read the model and push updates into it. Set --secret-file FILE or "
        f"{SECRET_ENV} on every peer."
    )
    logger.warning(message)
    warnings.warn(message, OpenSwarmWarning, stacklevel=2)
