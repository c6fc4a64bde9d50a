"""The HTTP server against hostile and wrong requests: right 4xx, JSON body, model untouched.

Every test runs a real peer served by ``peer.transport.server.make_runner`` on 127.0.0.1 (the
connection layer included: JSON answers to unparseable HTTP, header bounds) and checks that
refused input leaves the model's bytes and the membership exactly as they were.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack
import pytest
import torch
from aiohttp import web

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.protocol import auth, wire
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import ERROR_CLASSES
from peer.transport.admission import ServerLimits
from peer.transport.server import make_runner

from .conftest import SECRET, make_model, model_bytes, sgd

CODES = {cls.code: cls.status for cls in ERROR_CLASSES}


@dataclass
class Served:
    """A started peer and the address its ``make_runner`` server listens on."""

    peer: Peer
    address: str
    runner: web.AppRunner

    def digest(self) -> str:
        """The model's bytes and the membership, hashed: what refused input must not change."""
        members = sorted((m.id, m.address or "") for m in self.peer.membership.members())
        return hashlib.sha256(model_bytes(self.peer) + repr(members).encode()).hexdigest()


@asynccontextmanager
async def served_peer(
    peer_id: str,
    seed: int = 0,
    *,
    width: int = 4,
    limits: ServerLimits | None = None,
    linger_s: float | None = None,
    **overrides: Any,
) -> AsyncIterator[Served]:
    """A started peer with a ``Linear(width, 2)`` model (``2 width + 2`` parameters), also
    served through ``make_runner`` (within ``limits``, default the peer's; ``linger_s``, if
    given, replaces theirs) on its own port."""
    overrides.setdefault("secret", SECRET)
    overrides.setdefault("request_timeout_s", 5.0)
    config = PeerConfig(peer_id=peer_id, **overrides)
    peer = Peer(make_model(seed, width), sgd, torch.nn.functional.cross_entropy, [], config)
    await peer.start()
    # a peer refuses requests signed at or before the millisecond it started (replays
    # across a restart): let that millisecond pass before a test signs its first request
    await asyncio.sleep(0.002)
    try:
        if linger_s is not None:
            limits = dataclasses.replace(limits or ServerLimits.of(peer), linger_s=linger_s)
        runner = make_runner(peer, limits)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield Served(peer, f"127.0.0.1:{runner.addresses[0][1]}", runner)
        finally:
            await runner.cleanup()
    finally:
        await peer.stop()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with served_peer("callee", seed=1) as s:
        yield s


def envelope_body(vector: torch.Tensor, **overrides: object) -> bytes:
    obj: dict[str, object] = {
        "v": wire.PROTOCOL_VERSION,
        "sender": "caller",
        "round": 0,
        "step": 0,
        "codec": "none",
        "payload": DenseCodec().encode(vector),
    }
    obj.update(overrides)
    return msgpack.packb(obj, use_bin_type=True)


def signed(served: Served, method: str, path: str, body: bytes, **kw: Any) -> dict[str, str]:
    return auth.sign_request(SECRET, method, path, body, receiver=served.peer.peer_id, **kw)


async def post(
    served: Served,
    body: bytes,
    *,
    path: str = "/v1/exchange",
    method: str = "POST",
    secret: bytes | None = SECRET,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    sent = (
        dict(headers)
        if headers is not None
        else (signed(served, method, path, body) if secret is not None else {})
    )
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://{served.address}{path}", data=body, headers=sent
        ) as response,
    ):
        return response.status, await response.read(), dict(response.headers)


def error_of(status: int, data: bytes) -> str:
    """The ``error`` code of a documented JSON error body (and its status agrees)."""
    error = json.loads(data)
    assert set(error) == {"error", "detail"} and error["detail"], error
    assert CODES[error["error"]] == status, (status, error)
    return str(error["error"])


def good(peer: Peer) -> torch.Tensor:
    return torch.ones(peer.spec.numel)


CASES = {
    "malformed msgpack": (lambda p: b"\xc1not msgpack", 400, "malformed_body"),
    "wrong shape": (lambda p: envelope_body(torch.ones(p.spec.numel + 1)), 422, "shape_mismatch"),
    "wrong dtype": (
        lambda p: envelope_body(torch.ones(p.spec.numel, dtype=torch.float64)),
        422,
        "dtype_mismatch",
    ),
    "nan": (
        lambda p: envelope_body(
            torch.cat([torch.ones(p.spec.numel - 1), torch.tensor([float("nan")])])
        ),
        422,
        "non_finite",
    ),
    "unknown codec": (lambda p: envelope_body(good(p), codec="zstd"), 400, "unknown_codec"),
    "unknown version": (lambda p: envelope_body(good(p), v=99), 400, "unsupported_version"),
    "version as a list": (lambda p: envelope_body(good(p), v=[1]), 400, None),
    "version as a map": (lambda p: envelope_body(good(p), v={"a": 1}), 400, None),
    "version as a float": (lambda p: envelope_body(good(p), v=1.0), 400, None),
    "bad sender": (lambda p: envelope_body(good(p), sender="a b"), 400, "invalid_sender"),
    "own id as sender": (lambda p: envelope_body(good(p), sender="callee"), 400, "malformed_body"),
    "negative round": (lambda p: envelope_body(good(p), round=-3), 400, "invalid_round"),
    "fp16 payload lies about size": (
        lambda p: envelope_body(
            good(p), codec="fp16", payload={"codec": "fp16", "dtype": "<f2", "data": b"\x00" * 6}
        ),
        422,
        "shape_mismatch",
    ),
    "empty body": (lambda p: b"", 400, "malformed_body"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_exchange_is_refused_and_model_is_untouched(served: Served, case: str) -> None:
    build, status, code = CASES[case]
    before = served.digest()
    got_status, body, _ = await post(served, build(served.peer))
    assert got_status == status, body
    got = error_of(got_status, body)
    assert code is None or got == code
    assert served.digest() == before


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_oversized_body_gets_413_before_reading(served: Served) -> None:
    peer = served.peer
    before = served.digest()
    body = b"\x00" * (peer.max_body_bytes + 1)
    status, data, _ = await post(served, body)
    assert status == 413 and error_of(status, data) == "body_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: capped while reading
        for _ in range(3):
            yield b"\x00" * peer.max_body_bytes

    async with aiohttp.ClientSession() as session:
        # an open swarm reads a chunked exchange into a slot: it is cut off at the cap
        async with (
            served_peer("open", secret=None) as open_peer,
            session.post(f"http://{open_peer.address}/v1/exchange", data=chunks()) as response,
        ):
            assert response.status == 413
            assert (await response.json())["error"] == "body_too_large"
        # a digest-signed chunked body would be read unauthenticated: refused unread
        headers = signed(served, "POST", "/v1/exchange", b"")
        async with session.post(
            f"http://{served.address}/v1/exchange", data=chunks(), headers=headers
        ) as response:
            assert response.status in (401, 413)
            assert (await response.json())["error"] in ("unauthorized", "body_too_large")
    assert served.digest() == before


async def test_body_cap_is_derived_from_model_size(served: Served) -> None:
    peer = served.peer
    assert peer.max_body_bytes == 2 * peer.spec.num_bytes + wire.HEADER_ROOM


AUTH_CASES = {
    "unsigned": lambda s, body: {},
    "wrong secret": lambda s, body: auth.sign_request(
        b"not-the-swarm-secret!", "POST", "/v1/exchange", body, receiver="callee"
    ),
    "signed for another path": lambda s, body: signed(s, "POST", "/v1/join", body),
    "signed another body": lambda s, body: signed(s, "POST", "/v1/exchange", body + b"x"),
    "signed for another peer": lambda s, body: auth.sign_request(
        SECRET, "POST", "/v1/exchange", body, receiver="someone-else"
    ),
    "stale": lambda s, body: signed(
        s, "POST", "/v1/exchange", body, timestamp=auth.now_ms() - 3_600_000
    ),
    "garbage header": lambda s, body: {"Authorization": "gossipnet-hmac-sha256 nope"},
    "non-ascii header": lambda s, body: {"Authorization": "gossipnet-hmac-sha256 é"},
}


@pytest.mark.parametrize("case", list(AUTH_CASES))
async def test_unauthenticated_requests_get_401(served: Served, case: str) -> None:
    body = envelope_body(good(served.peer))
    before = served.digest()
    status, data, _ = await post(served, body, headers=AUTH_CASES[case](served, body))
    assert status == 401, data
    assert error_of(status, data) == "unauthorized"
    assert served.digest() == before


async def test_replayed_request_gets_401(served: Served) -> None:
    body = envelope_body(good(served.peer))
    headers = signed(served, "POST", "/v1/exchange", body)
    status, data, response_headers = await post(served, body, headers=headers)
    assert status == 200
    auth.verify_response(SECRET, 200, auth.request_nonce(headers), data, response_headers)
    before = served.digest()
    status, data, _ = await post(served, body, headers=headers)
    assert status == 401 and "replayed" in json.loads(data)["detail"]
    assert served.digest() == before


async def test_valid_exchange_averages_and_answers_the_average(served: Served) -> None:
    peer = served.peer
    own = peer.flat.vector.clone()
    other = torch.full_like(own, 3.0)
    status, data, _ = await post(served, envelope_body(other, sender="caller"))
    assert status == 200
    reply = wire.unpack_envelope(data, max_bytes=peer.max_body_bytes, codecs={"none"})
    assert reply.sender == "callee"
    got = DenseCodec().decode(reply.payload, peer.spec)
    torch.testing.assert_close(got, (own + other) / 2)
    torch.testing.assert_close(peer.flat.vector, (own + other) / 2)
    assert "caller" in peer.membership


async def test_open_endpoints_signed_reads_and_http_errors_in_json(served: Served) -> None:
    base = f"http://{served.address}"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/v1/status") as response:
            status = await response.json()
        assert status["id"] == "callee" and status["round"] == 0 and status["parameters"] == 10
        assert status["authenticated"] is True
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
        assert "gossipnet_bytes_total" in text and 'peer="callee"' in text
        async with session.get(f"{base}/v1/peers") as response:
            assert response.status == 401
            assert error_of(401, await response.read()) == "unauthorized"
        async with session.get(f"{base}/v1/nowhere") as response:
            assert response.status == 404
            assert error_of(404, await response.read()) == "not_found"
        for method, path, allow in [
            ("PUT", "/v1/exchange", {"POST"}),
            ("DELETE", "/v1/join", {"POST"}),
            ("POST", "/v1/status", {"GET", "HEAD"}),
            ("HEAD", "/v1/state", {"GET"}),
        ]:
            async with session.request(method, f"{base}{path}") as response:
                assert response.status == 405, (method, path)
                assert set(response.headers["Allow"].split(",")) == allow
                if method != "HEAD":
                    assert error_of(405, await response.read()) == "method_not_allowed"
        async with session.post(
            f"{base}/v1/exchange", data=b"x", headers={"Expect": "something-else"}
        ) as response:
            assert response.status == 417
            assert error_of(417, await response.read()) == "expectation_failed"
    status_code, data, _ = await post(served, b"", path="/v1/state", method="GET")
    assert status_code == 200
    env = wire.unpack_envelope(data, max_bytes=served.peer.max_body_bytes, codecs={"none"})
    state = DenseCodec().decode(env.payload, served.peer.spec)
    assert torch.equal(state, served.peer.flat.vector)


@pytest.mark.parametrize("path", ["/v1/peers", "/v1/state"])
async def test_a_get_with_a_body_is_refused_before_reading_it(served: Served, path: str) -> None:
    before = served.digest()
    body = b'{"id": "x", "address": null}'
    status, data, _ = await post(served, body, path=path, method="GET")
    assert status == 400 and error_of(status, data) == "malformed_body"
    assert "takes no body" in json.loads(data)["detail"]
    assert served.digest() == before


JOIN_CASES = [
    (b"{", "malformed_body"),
    (b'{"id": "x"}', "malformed_body"),
    (b'{"id": "x", "address": null, "extra": 1}', "malformed_body"),
    (b'{"id": "x", "id": "y", "address": null}', "malformed_body"),
    (b'{"id": "a b", "address": null}', "invalid_sender"),
    (b'{"id": 5, "address": null}', "malformed_body"),
    (b'{"id": ["x"], "address": null}', "malformed_body"),
    (b'{"id": "x", "address": 7000}', "malformed_body"),
    (b'{"id": "x", "address": NaN}', "malformed_body"),
    (b'{"id": "newcomer", "address": "no-port"}', "malformed_body"),
    (b'{"id": "newcomer", "address": "host:99999"}', "malformed_body"),
    (b'{"id": "callee", "address": null}', "unknown_peer"),
    (b"[" * 100_000 + b"]" * 100_000, "malformed_body"),
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "malformed_body"),
    (b'{"id": "x", "address": null}\xff', "malformed_body"),
    (b"\xff\xfe", "malformed_body"),
    (b"", "malformed_body"),
]


@pytest.mark.parametrize(("body", "code"), JOIN_CASES, ids=[c[1] for c in JOIN_CASES])
async def test_bad_join_is_refused(served: Served, body: bytes, code: str) -> None:
    before = served.digest()
    status, data, _ = await post(served, body, path="/v1/join")
    assert 400 <= status < 500 and error_of(status, data) == code
    assert len(served.peer.membership) == 0
    assert served.digest() == before


async def test_an_oversized_join_is_413_while_reading(served: Served) -> None:
    body = b'{"id": "x", "address": "' + b"a" * (1 << 20) + b'"}'
    status, data, _ = await post(served, body, path="/v1/join")
    assert status == 413 and error_of(status, data) == "body_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: cut off while reading
        yield b'{"id": "x", "address": "'
        for _ in range(3):
            yield b"a" * (1 << 19)

    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://{served.address}/v1/join",
            data=chunks(),
            headers=signed(served, "POST", "/v1/join", b""),
        ) as response,
    ):
        assert response.status == 413
        assert error_of(413, await response.read()) == "body_too_large"
    assert len(served.peer.membership) == 0


async def test_join_admits_and_answers_the_view(served: Served) -> None:
    body = b'{"id": "newcomer", "address": "127.0.0.1:9"}'
    status, data, _ = await post(served, body, path="/v1/join")
    assert status == 200
    view = json.loads(data)
    assert view["id"] == "callee"
    assert {"id": "newcomer", "address": "127.0.0.1:9", "status": "alive"} in view["peers"]


async def test_open_swarm_warns_and_accepts_unsigned() -> None:
    with pytest.warns(auth.OpenSwarmWarning):
        async with served_peer("open", secret=None) as s:
            status, _, _ = await post(s, envelope_body(torch.zeros(s.peer.spec.numel)), secret=None)
            assert status == 200


async def raw(
    address: str, request: bytes, *, half_close: bool = False, timeout_s: float = 10.0
) -> bytes:
    """Send raw bytes (then half-close if asked), return all the server answers until it
    closes the connection."""
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        if half_close:
            writer.write_eof()
        try:
            return await asyncio.wait_for(reader.read(), timeout=timeout_s)
        except ConnectionResetError:
            return b""
    finally:
        writer.close()


def parse_answer(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


BROKEN_HTTP = {
    "garbage": (b"\x16\x03\x01\x02\x00hello\r\n\r\n", 400, "malformed_request"),
    "bad request line": (b"GET\r\n\r\n", 400, "malformed_request"),
    "bad version": (b"GET /v1/status HTTP/9.9\r\nHost: x\r\n\r\n", 400, "malformed_request"),
    "header without colon": (
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n",
        400,
        "malformed_request",
    ),
    "oversized header": (
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        431,
        "headers_too_large",
    ),
    "oversized request line": (
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        431,
        "headers_too_large",
    ),
    "too many headers": (
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
        + b"\r\n",
        431,
        "headers_too_large",
    ),
    "bad content-length": (
        b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        400,
        "malformed_request",
    ),
    "negative content-length": (
        b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        400,
        "malformed_request",
    ),
    "two content-lengths": (
        b"POST /v1/join HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        400,
        "malformed_request",
    ),
    "content-length and chunked": (
        b"POST /v1/join HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "malformed_request",
    ),
    "bad chunk size": (
        b"POST /v1/join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
        400,
        None,
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_HTTP))
async def test_broken_http_gets_a_json_error_and_one_log_line(
    served: Served, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    request, status, code = BROKEN_HTTP[case]
    before = served.digest()
    with caplog.at_level(logging.INFO):
        answer = await raw(served.address, request)
    got, headers, body = parse_answer(answer)
    assert got == status, answer[:300]
    assert headers["content-type"].startswith("application/json")
    error = error_of(got, body)
    assert code is None or error == code
    assert served.digest() == before
    # one line, no traceback, however large the request
    logged = [r for r in caplog.records if r.name.startswith(("peer.transport.server", "aiohttp"))]
    assert all(r.exc_info is None for r in logged)
    assert sum(len(r.getMessage()) for r in logged) < 1000


async def test_truncated_body_is_malformed_and_model_untouched() -> None:
    with pytest.warns(auth.OpenSwarmWarning):
        async with served_peer("open", secret=None) as s:
            before = s.digest()
            answer = await raw(
                s.address,
                b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                + b"\x00" * 10,
                half_close=True,
            )
            assert not answer.startswith(b"HTTP/1.1 200")
            assert s.digest() == before
            assert s.peer.metrics.registry.get_sample_value(
                "gossipnet_exchanges_total", {"role": "callee", "outcome": "ok"}
            ) in (None, 0.0)
            # the slot was given back: a whole exchange is served
            status, _, _ = await post(s, envelope_body(good(s.peer)), secret=None)
            assert status == 200
