"""TLS between peers, with a self-signed certificate made by the openssl CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from peer.transport.client import PeerClient, PeerUnavailable

from .conftest import SECRET, started_peer

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl CLI to make a test certificate"
)


def make_certificate(directory: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


async def test_peers_exchange_over_mutual_tls(certificate: tuple[str, str]) -> None:
    cert, key = certificate
    tls = {"tls_cert": cert, "tls_key": key, "tls_ca": cert}
    async with (
        started_peer("a", seed=0, **tls) as a,
        started_peer("b", seed=1, join=(a.address,), fetch_state=False, **tls) as b,
    ):
        average = (a.flat.vector + b.flat.vector) / 2
        assert await b.gossip() == 1
        torch.testing.assert_close(a.flat.vector, average)
        plain = PeerClient(secret=SECRET, timeout_s=2.0, max_body_bytes=1 << 20)
        async with plain:  # plain HTTP to a TLS port fails, and is reported as unavailable
            with pytest.raises(PeerUnavailable):
                await plain.peers(a.address)


async def test_untrusted_certificate_is_refused(
    certificate: tuple[str, str], tmp_path: Path
) -> None:
    cert, key = certificate
    other_ca, _ = make_certificate(tmp_path)
    async with started_peer("a", tls_cert=cert, tls_key=key) as a:
        # an unverifiable certificate fails every join attempt alike: a short join_timeout_s
        # ends the retries soon (the default, 60 s, would only wait longer for the same error)
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            async with started_peer(
                "b", client_only=True, join=(a.address,), tls_ca=other_ca, join_timeout_s=0.5
            ):
                pass
        assert "b" not in a.membership
