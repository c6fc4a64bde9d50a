"""HMAC request/response signatures, nonce cache, secrets and TLS contexts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from peer import auth
from peer.errors import Unauthorized

SECRET = b"0123456789abcdef-swarm"


def verifier(**kwargs: int) -> auth.RequestVerifier:
    return auth.RequestVerifier(SECRET, **kwargs)


def test_signed_request_verifies_once_then_is_a_replay() -> None:
    v = verifier()
    headers = auth.sign_request(SECRET, "POST", "/v1/exchange", b"body")
    nonce = v.verify("POST", "/v1/exchange", headers, b"body")
    assert nonce == auth.request_nonce(headers)
    with pytest.raises(Unauthorized, match="replayed"):
        v.verify("POST", "/v1/exchange", headers, b"body")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/exchange", b"body"),
        ("POST", "/v1/join", b"body"),
        ("POST", "/v1/exchange", b"bodY"),
    ],
)
def test_any_altered_part_breaks_the_signature(method: str, path: str, body: bytes) -> None:
    headers = auth.sign_request(SECRET, "POST", "/v1/exchange", b"body")
    with pytest.raises(Unauthorized, match="signature does not match"):
        verifier().verify(method, path, headers, body)


def test_wrong_secret_unsigned_and_malformed_are_refused() -> None:
    v = verifier()
    wrong = auth.sign_request(b"another-secret-of-16", "POST", "/p", b"")
    with pytest.raises(Unauthorized, match="signature does not match"):
        v.verify("POST", "/p", wrong, b"")
    with pytest.raises(Unauthorized, match="not signed"):
        v.verify("POST", "/p", {}, b"")
    with pytest.raises(Unauthorized, match="must be"):
        v.verify("POST", "/p", {"Authorization": "Bearer abc"}, b"")


def test_stale_and_future_timestamps_are_refused() -> None:
    v = verifier(clock_window_s=30)
    now = int(time.time())
    for skew in (-31, 31):
        headers = auth.sign_request(SECRET, "GET", "/p", b"", timestamp=now + skew)
        with pytest.raises(Unauthorized, match="stale"):
            v.verify("GET", "/p", headers, b"", now=now)
    headers = auth.sign_request(SECRET, "GET", "/p", b"", timestamp=now - 29)
    v.verify("GET", "/p", headers, b"", now=now)


def test_nonce_cache_is_bounded_and_evicted_nonces_cannot_be_replayed() -> None:
    v = verifier(clock_window_s=60, nonce_capacity=4)
    now = 1_000_000
    signed = [
        auth.sign_request(SECRET, "GET", "/p", b"", timestamp=now + i, nonce=f"{i:032x}")
        for i in range(6)
    ]
    for headers in signed:
        v.verify("GET", "/p", headers, b"", now=now + 5)
    assert len(v.nonces) == 4
    # Nonces 0 and 1 were evicted while live: the floor refuses them as stale.
    for headers in signed[:2]:
        with pytest.raises(Unauthorized, match="stale"):
            v.verify("GET", "/p", headers, b"", now=now + 5)
    for headers in signed[2:]:
        with pytest.raises(Unauthorized, match="replayed"):
            v.verify("GET", "/p", headers, b"", now=now + 5)


def test_expired_nonces_leave_the_cache_without_raising_the_floor() -> None:
    cache = auth.NonceCache(capacity=10)
    cache.add("a", 100, oldest_valid=0)
    cache.add("b", 200, oldest_valid=150)
    assert "a" not in cache and "b" in cache and cache.floor == -1


def test_response_signature_is_bound_to_status_nonce_and_body() -> None:
    headers = auth.sign_response(SECRET, 200, "ab" * 16, b"payload")
    auth.verify_response(SECRET, 200, "ab" * 16, b"payload", headers)
    for status, nonce, body in [
        (201, "ab" * 16, b"payload"),
        (200, "cd" * 16, b"payload"),
        (200, "ab" * 16, b"x"),
    ]:
        with pytest.raises(Unauthorized, match="response signature"):
            auth.verify_response(SECRET, status, nonce, body, headers)
    with pytest.raises(Unauthorized):
        auth.verify_response(SECRET, 200, "ab" * 16, b"payload", {})


def test_load_secret_from_file_env_or_none(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    assert auth.load_secret(path, environ={}) == SECRET
    assert auth.load_secret(None, environ={auth.SECRET_ENV: "x" * 20}) == b"x" * 20
    assert auth.load_secret(None, environ={}) is None
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        auth.load_secret(path, environ={})
    with pytest.raises(FileNotFoundError):
        auth.load_secret(tmp_path / "missing", environ={})


def test_open_swarm_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.warns(auth.OpenSwarmWarning, match="OPEN"):
        auth.warn_open_swarm("peer-a")
    assert "NO SWARM SECRET" in caplog.text


def test_verifier_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="secret"):
        auth.RequestVerifier(b"short")
    with pytest.raises(ValueError, match="clock_window_s"):
        auth.RequestVerifier(SECRET, clock_window_s=0)
    with pytest.raises(ValueError, match="capacity"):
        auth.NonceCache(0)
