"""The HTTP server against hostile and wrong requests: right 4xx, JSON body, model untouched."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import msgpack
import pytest
import torch

from peer import auth, wire
from peer.codecs import DenseCodec
from peer.node import Peer

from .conftest import SECRET, model_bytes, started_peer


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    async with started_peer("callee", seed=1) as p:
        yield p


def envelope_body(vector: torch.Tensor, **overrides: object) -> bytes:
    obj: dict[str, object] = {
        "v": 1,
        "sender": "caller",
        "round": 0,
        "step": 0,
        "codec": "none",
        "payload": DenseCodec().encode(vector),
    }
    obj.update(overrides)
    return msgpack.packb(obj, use_bin_type=True)


async def post(
    peer: Peer,
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
        else (auth.sign_request(secret, method, path, body) if secret is not None else {})
    )
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://{peer.address}{path}", data=body, headers=sent
        ) as response,
    ):
        return response.status, await response.read(), dict(response.headers)


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
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_exchange_is_refused_and_model_is_untouched(peer: Peer, case: str) -> None:
    build, status, code = CASES[case]
    before = model_bytes(peer)
    got_status, body, _ = await post(peer, build(peer))
    assert got_status == status, body
    error = json.loads(body)
    assert error["error"] == code and error["detail"]
    assert model_bytes(peer) == before


async def test_oversized_body_gets_413_before_reading(peer: Peer) -> None:
    before = model_bytes(peer)
    body = b"\x00" * (peer.max_body_bytes + 1)
    status, data, _ = await post(peer, body)
    assert status == 413 and json.loads(data)["error"] == "body_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: capped while reading
        for _ in range(3):
            yield b"\x00" * peer.max_body_bytes

    async with aiohttp.ClientSession() as session:
        headers = auth.sign_request(SECRET, "POST", "/v1/exchange", b"")
        async with session.post(
            f"http://{peer.address}/v1/exchange", data=chunks(), headers=headers
        ) as response:
            assert response.status == 413
            assert (await response.json())["error"] == "body_too_large"
    assert model_bytes(peer) == before


async def test_body_cap_is_derived_from_model_size(peer: Peer) -> None:
    assert peer.max_body_bytes == 2 * peer.spec.num_bytes + wire.HEADER_ROOM


AUTH_CASES = {
    "unsigned": lambda body: {},
    "wrong secret": lambda body: auth.sign_request(
        b"not-the-swarm-secret!", "POST", "/v1/exchange", body
    ),
    "signed for another path": lambda body: auth.sign_request(SECRET, "POST", "/v1/join", body),
    "signed another body": lambda body: auth.sign_request(
        SECRET, "POST", "/v1/exchange", body + b"x"
    ),
    "stale": lambda body: auth.sign_request(
        SECRET, "POST", "/v1/exchange", body, timestamp=int(time.time()) - 3600
    ),
    "garbage header": lambda body: {"Authorization": "gossipnet-hmac-sha256 nope"},
}


@pytest.mark.parametrize("case", list(AUTH_CASES))
async def test_unauthenticated_requests_get_401(peer: Peer, case: str) -> None:
    body = envelope_body(good(peer))
    before = model_bytes(peer)
    status, data, _ = await post(peer, body, headers=AUTH_CASES[case](body))
    assert status == 401, data
    assert json.loads(data)["error"] == "unauthorized"
    assert model_bytes(peer) == before


async def test_replayed_request_gets_401(peer: Peer) -> None:
    body = envelope_body(good(peer))
    headers = auth.sign_request(SECRET, "POST", "/v1/exchange", body)
    status, data, response_headers = await post(peer, body, headers=headers)
    assert status == 200
    auth.verify_response(SECRET, 200, auth.request_nonce(headers), data, response_headers)
    before = model_bytes(peer)
    status, data, _ = await post(peer, body, headers=headers)
    assert status == 401 and "replayed" in json.loads(data)["detail"]
    assert model_bytes(peer) == before


async def test_valid_exchange_averages_and_answers_the_average(peer: Peer) -> None:
    own = peer.flat.vector.clone()
    other = torch.full_like(own, 3.0)
    status, data, _ = await post(peer, envelope_body(other, sender="caller"))
    assert status == 200
    reply = wire.unpack_envelope(data, max_bytes=peer.max_body_bytes, codecs={"none"})
    assert reply.sender == "callee"
    got = DenseCodec().decode(reply.payload, peer.spec)
    torch.testing.assert_close(got, (own + other) / 2)
    torch.testing.assert_close(peer.flat.vector, (own + other) / 2)
    assert "caller" in peer.membership


async def test_open_endpoints_and_signed_reads(peer: Peer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{peer.address}/v1/status") as response:
            status = await response.json()
        assert status["id"] == "callee" and status["round"] == 0 and status["parameters"] == 10
        assert status["authenticated"] is True
        async with session.get(f"http://{peer.address}/metrics") as response:
            text = await response.text()
        assert "gossipnet_bytes_total" in text and 'peer="callee"' in text
        async with session.get(f"http://{peer.address}/v1/peers") as response:
            assert response.status == 401
        async with session.get(f"http://{peer.address}/v1/nowhere") as response:
            assert response.status == 404
            assert (await response.json())["error"] == "not_found"
        async with session.put(f"http://{peer.address}/v1/exchange") as response:
            assert response.status == 405
            assert (await response.json())["error"] == "method_not_allowed"
    status_code, data, _headers = await post(peer, b"", path="/v1/state", method="GET")
    assert status_code == 200
    env = wire.unpack_envelope(data, max_bytes=peer.max_body_bytes, codecs={"none"})
    state = DenseCodec().decode(env.payload, peer.spec)
    assert torch.equal(state, peer.flat.vector)
    status_code, data, _ = await post(peer, b"", path="/v1/nowhere", method="GET")
    assert status_code == 404 and json.loads(data)["error"] == "not_found"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{", "malformed_body"),
        (b'{"id": "x"}', "malformed_body"),
        (b'{"id": "a b", "address": null}', "invalid_sender"),
        (b'{"id": 5, "address": null}', "invalid_sender"),
        (b'{"id": "newcomer", "address": "no-port"}', "malformed_body"),
        (b'{"id": "callee", "address": null}', "unknown_peer"),
    ],
)
async def test_bad_join_is_refused(peer: Peer, body: bytes, code: str) -> None:
    status, data, _ = await post(peer, body, path="/v1/join")
    assert 400 <= status < 500 and json.loads(data)["error"] == code
    assert len(peer.membership) == 0


async def test_join_admits_and_answers_the_view(peer: Peer) -> None:
    body = b'{"id": "newcomer", "address": "127.0.0.1:9"}'
    status, data, _ = await post(peer, body, path="/v1/join")
    assert status == 200
    view = json.loads(data)
    assert view["id"] == "callee"
    assert {"id": "newcomer", "address": "127.0.0.1:9", "status": "alive"} in view["peers"]


async def test_open_swarm_warns_and_accepts_unsigned() -> None:
    with pytest.warns(auth.OpenSwarmWarning):
        async with started_peer("open", secret=None) as p:
            status, _, _ = await post(p, envelope_body(torch.zeros(p.spec.numel)), secret=None)
            assert status == 200


async def test_truncated_body_is_malformed_and_model_untouched() -> None:
    with pytest.warns(auth.OpenSwarmWarning):
        async with started_peer("open", secret=None) as p:
            before = model_bytes(p)
            host, port = p.address.split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                + b"\x00" * 10
            )
            await writer.drain()
            writer.write_eof()
            try:  # aiohttp either answers 400 or drops the connection: never 200
                response = await asyncio.wait_for(reader.read(), timeout=10)
            except ConnectionResetError:
                response = b""
            writer.close()
            assert not response.startswith(b"HTTP/1.1 200")
            assert model_bytes(p) == before
            assert p.metrics.registry.get_sample_value(
                "gossipnet_exchanges_total", {"role": "callee", "outcome": "ok"}
            ) in (None, 0.0)
