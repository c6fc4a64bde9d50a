"""HMAC request/response signatures, nonce cache, secrets and TLS contexts."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peer.protocol import auth, replay_cache, signatures, swarm_secret, tls
from peer.protocol.errors import Unauthorized, UnsupportedVersion
from peer.protocol.wire import PROTOCOL_VERSION

SECRET = b"0123456789abcdef-swarm"
NOW = 1_700_000_000_000
"""A fixed clock (Unix ms) for the verifiers below, well after their start."""


def verifier(peer_id: str = "b", **kwargs: int) -> signatures.RequestVerifier:
    kwargs.setdefault("started_ms", 0)
    return signatures.RequestVerifier(SECRET, peer_id=peer_id, **kwargs)


def signed(method: str = "POST", path: str = "/v1/exchange", body: bytes = b"body", **kw: Any):
    kw.setdefault("receiver", "b")
    kw.setdefault("timestamp", NOW)
    return signatures.sign_request(SECRET, method, path, body, **kw)


def test_signed_request_verifies_once_then_is_a_replay() -> None:
    v = verifier()
    headers = signed()
    nonce = v.verify("POST", "/v1/exchange", headers, b"body", now=NOW)
    assert nonce == signatures.request_nonce(headers)
    with pytest.raises(Unauthorized, match="replayed"):
        v.verify("POST", "/v1/exchange", headers, b"body", now=NOW)


def test_the_header_names_the_version_the_receiver_and_milliseconds() -> None:
    header = signatures.sign_request(SECRET, "GET", "/v1/peers", b"", receiver="peer-7")[
        "Authorization"
    ]
    assert header.startswith(f"{signatures.SCHEME} v={PROTOCOL_VERSION},to=peer-7,timestamp=")
    timestamp = int(header.split("timestamp=")[1].split(",")[0])
    assert abs(timestamp - time.time() * 1000) < 60_000  # milliseconds, not seconds


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/exchange", b"body"),
        ("POST", "/v1/join", b"body"),
        ("POST", "/v1/exchange", b"bodY"),
    ],
)
def test_any_altered_part_breaks_the_signature(method: str, path: str, body: bytes) -> None:
    with pytest.raises(Unauthorized, match="signature does not match"):
        verifier().verify(method, path, signed(), body, now=NOW)


@pytest.mark.parametrize("scheme", ["digest", "stream"])
def test_a_request_signed_for_one_peer_is_refused_by_another(scheme: str) -> None:
    """The signed text names the receiver: a captured request cannot be replayed elsewhere."""
    if scheme == "digest":
        headers = signed(receiver="a")
    else:
        headers = signatures.sign_stream_request(SECRET, "POST", "/v1/exchange", 4, receiver="a")
    with pytest.raises(Unauthorized, match=r"signed for another peer \('a'\).*\('b'\)"):
        verifier("b").check_form(headers, now=NOW)
    # rewriting the header's receiver does not help: the signature covers it
    forged = {"Authorization": headers["Authorization"].replace("to=a,", "to=b,")}
    with pytest.raises(Unauthorized, match="signature does not match"):
        if scheme == "digest":
            verifier("b").verify("POST", "/v1/exchange", forged, b"body", now=NOW)
        else:
            verifier("b").verify_stream("POST", "/v1/exchange", forged, 4)
    if scheme == "digest":  # and the peer it was signed for takes it
        verifier("a").verify("POST", "/v1/exchange", headers, b"body", now=NOW)
    else:
        verifier("a").verify_stream("POST", "/v1/exchange", headers, 4)


def _version_1_header(scheme: str = signatures.SCHEME) -> dict[str, str]:
    """A request signed as protocol version 1 signed it: seconds, no version, no receiver."""
    timestamp, nonce = NOW // 1000, "ab" * 16
    text = f"POST\n/v1/exchange\n{timestamp}\n{nonce}\n{signatures.body_digest(b'body')}".encode()
    signature = hmac.new(SECRET, text, hashlib.sha256).hexdigest()
    return {"Authorization": f"{scheme} timestamp={timestamp},nonce={nonce},signature={signature}"}


@pytest.mark.parametrize("scheme", [signatures.SCHEME, signatures.STREAM_SCHEME])
def test_other_protocol_versions_are_refused_as_unsupported(scheme: str) -> None:
    with pytest.raises(UnsupportedVersion, match="version 1"):
        verifier().check_form(_version_1_header(scheme), now=NOW)
    header = signed()["Authorization"].replace(f"v={PROTOCOL_VERSION},", "v=3,")
    with pytest.raises(UnsupportedVersion, match="version 3"):
        verifier().check_form({"Authorization": header}, now=NOW)


def test_wrong_secret_unsigned_and_malformed_are_refused() -> None:
    v = verifier()
    wrong = signatures.sign_request(b"another-secret-of-16", "POST", "/p", b"", receiver="b")
    with pytest.raises(Unauthorized, match="signature does not match"):
        v.verify("POST", "/p", wrong, b"")
    with pytest.raises(Unauthorized, match="not signed"):
        v.verify("POST", "/p", {}, b"")
    with pytest.raises(Unauthorized, match="must be"):
        v.verify("POST", "/p", {"Authorization": "Bearer abc"}, b"")
    with pytest.raises(ValueError, match="receiver"):
        signatures.sign_request(SECRET, "POST", "/p", b"", receiver="a,to=b")


@given(st.text(max_size=300))
def test_any_header_is_refused_with_a_typed_error(header: str) -> None:
    prefix = signed()["Authorization"][:40]
    for candidate in (header, prefix + header):
        with pytest.raises((Unauthorized, UnsupportedVersion)):
            verifier().check_form({"Authorization": candidate}, now=NOW)


def test_stale_and_future_timestamps_are_refused() -> None:
    v = verifier(clock_window_s=30)
    for skew in (-30_001, 30_001):
        headers = signed("GET", "/p", b"", timestamp=NOW + skew)
        with pytest.raises(Unauthorized, match="stale"):
            v.verify("GET", "/p", headers, b"", now=NOW)
    headers = signed("GET", "/p", b"", timestamp=NOW - 29_999)
    v.verify("GET", "/p", headers, b"", now=NOW)


def test_a_request_signed_before_the_verifier_started_is_refused() -> None:
    """A restarted peer has a new verifier: what was signed before it started (and perhaps
    accepted by the previous run) is refused, to the millisecond, inside the clock window."""
    v = verifier(started_ms=NOW)
    for timestamp in (NOW - 1, NOW):
        with pytest.raises(Unauthorized, match="before a restart"):
            v.verify("GET", "/p", signed("GET", "/p", b"", timestamp=timestamp), b"", now=NOW + 5)
    v.verify("GET", "/p", signed("GET", "/p", b"", timestamp=NOW + 1), b"", now=NOW + 5)
    assert (
        abs(signatures.RequestVerifier(SECRET, peer_id="b").started_ms - time.time() * 1000)
        < 60_000
    )


def test_nonce_cache_is_bounded_and_evicted_nonces_cannot_be_replayed() -> None:
    v = verifier(clock_window_s=60, nonce_capacity=4)
    now = 1_000_000_000
    requests = [signed("GET", "/p", b"", timestamp=now + i, nonce=f"{i:032x}") for i in range(6)]
    for headers in requests:
        v.verify("GET", "/p", headers, b"", now=now + 5)
    assert len(v.nonces) == 4
    # Nonces 0 and 1 were evicted while live: the floor refuses them as stale.
    for headers in requests[:2]:
        with pytest.raises(Unauthorized, match="stale"):
            v.verify("GET", "/p", headers, b"", now=now + 5)
    for headers in requests[2:]:
        with pytest.raises(Unauthorized, match="replayed"):
            v.verify("GET", "/p", headers, b"", now=now + 5)


def test_expired_nonces_leave_the_cache_without_raising_the_floor() -> None:
    cache = replay_cache.NonceCache(capacity=10)
    cache.add("a", 100, oldest_valid=0)
    cache.add("b", 200, oldest_valid=150)
    assert "a" not in cache and "b" in cache and cache.floor == -1


def test_response_signature_is_bound_to_status_nonce_and_body() -> None:
    headers = signatures.sign_response(SECRET, 200, "ab" * 16, b"payload")
    signatures.verify_response(SECRET, 200, "ab" * 16, b"payload", headers)
    for status, nonce, body in [
        (201, "ab" * 16, b"payload"),
        (200, "cd" * 16, b"payload"),
        (200, "ab" * 16, b"x"),
    ]:
        with pytest.raises(Unauthorized, match="response signature"):
            signatures.verify_response(SECRET, status, nonce, body, headers)
    with pytest.raises(Unauthorized):
        signatures.verify_response(SECRET, 200, "ab" * 16, b"payload", {})


def test_load_secret_from_file_env_or_none(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    assert swarm_secret.load_secret(path, environ={}) == SECRET
    assert swarm_secret.load_secret(None, environ={swarm_secret.SECRET_ENV: "x" * 20}) == b"x" * 20
    assert swarm_secret.load_secret(None, environ={}) is None
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        swarm_secret.load_secret(path, environ={})
    with pytest.raises(FileNotFoundError):
        swarm_secret.load_secret(tmp_path / "missing", environ={})


def test_open_swarm_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.warns(swarm_secret.OpenSwarmWarning, match="OPEN"):
        swarm_secret.warn_open_swarm("peer-a")
    assert "NO SWARM SECRET" in caplog.text


def test_verifier_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="secret"):
        signatures.RequestVerifier(b"short", peer_id="b")
    with pytest.raises(ValueError, match="clock_window_s"):
        signatures.RequestVerifier(SECRET, peer_id="b", clock_window_s=0)
    with pytest.raises(ValueError, match="peer_id"):
        signatures.RequestVerifier(SECRET, peer_id="not an id")
    with pytest.raises(ValueError, match="capacity"):
        replay_cache.NonceCache(0)


def test_auth_names_the_same_objects_as_the_modules_that_own_them() -> None:
    """``peer.protocol.auth`` names exactly the public names of the signature, replay-cache,
    secret and TLS modules, each the same object as in its module."""
    modules = (signatures, replay_cache, swarm_secret, tls)
    owned = [name for module in modules for name in module.__all__]
    assert sorted(auth.__all__) == sorted(owned)
    for module in modules:
        for name in module.__all__:
            assert getattr(auth, name) is getattr(module, name), name
