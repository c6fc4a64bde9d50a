"""A signed request captured on its way to one peer is accepted once, by that peer only: never
by another peer of the same swarm, never twice, never after its receiver restarts; and a
request signed by a peer of the previous protocol version is refused as such (real servers).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web

from peer.node.peer import Peer
from peer.protocol import auth
from peer.protocol.codecs import DenseCodec
from peer.protocol.wire import Envelope
from peer.transport.client import PeerClient, PeerUnavailable

from .conftest import SECRET, model_bytes, started_peer


@dataclass(frozen=True)
class Captured:
    """A request as it went over the wire."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@asynccontextmanager
async def wiretap() -> AsyncIterator[tuple[str, list[Captured]]]:
    """A server that records every request it gets (headers and body bytes) and answers 503,
    as an eavesdropper on the path to a peer would see them."""
    captured: list[Captured] = []

    async def record(request: web.Request) -> web.Response:
        headers = {
            name: request.headers[name]
            for name in ("Authorization", "Content-Type")
            if name in request.headers
        }
        captured.append(Captured(request.method, request.path, headers, await request.read()))
        return web.Response(status=503)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", captured
    finally:
        await runner.cleanup()


async def capture_for(receiver: str) -> list[Captured]:
    """A stream-signed exchange and a digest-signed join, both signed by the client for
    ``receiver``, captured on their way."""
    async with (
        wiretap() as (address, captured),
        PeerClient(secret=SECRET, timeout_s=5.0, max_body_bytes=1 << 20) as client,
    ):
        payload = DenseCodec().encode(torch.full((10,), 3.0))
        envelope = Envelope(sender="z-intruder", round=0, codec="none", payload=payload)
        with pytest.raises(PeerUnavailable):
            await client.exchange(address, envelope, receiver=receiver, codecs={"none"})
        with pytest.raises(PeerUnavailable):
            await client.join(address, "z-intruder", None, receiver=receiver)
    assert [(c.method, c.path) for c in captured] == [
        ("POST", "/v1/exchange"),
        ("POST", "/v1/join"),
    ]
    assert captured[0].headers["Authorization"].startswith(auth.STREAM_SCHEME)
    assert captured[1].headers["Authorization"].startswith(auth.SCHEME)
    return captured


async def send(peer: Peer, request: Captured) -> tuple[int, dict[str, Any] | None]:
    """Replay ``request`` byte for byte to ``peer``: its status, and its JSON body if any."""
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            request.method,
            f"http://{peer.address}{request.path}",
            data=request.body,
            headers=request.headers,
        ) as response,
    ):
        data = await response.read()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, None


def state(peer: Peer) -> tuple[str, list[dict[str, Any]]]:
    """The peer's model digest and membership view."""
    return hashlib.sha256(model_bytes(peer)).hexdigest(), peer.membership.view()


async def test_a_captured_request_is_accepted_once_by_its_receiver_only() -> None:
    async with started_peer("a", seed=0) as a, started_peer("b", seed=1) as b:
        a_before, b_before = state(a), state(b)
        captured = await capture_for("a")  # signed after a started: a request a accepts
        for request in captured:  # the receiver accepts each once
            status, _ = await send(a, request)
            assert status == 200, request.path
        a_after = state(a)
        assert a_after[0] != a_before[0]  # averaged with the exchange's model
        assert "z-intruder" in a.membership  # admitted by the join
        for request in captured:  # another peer of the same swarm refuses them
            status, error = await send(b, request)
            assert status == 401 and error is not None, request.path
            assert error["error"] == "unauthorized"
            assert "signed for another peer ('a')" in error["detail"]
        assert state(b) == b_before
        for request in captured:  # the receiver refuses them a second time
            status, error = await send(a, request)
            assert status == 401 and error is not None and "replayed" in error["detail"]
        assert state(a) == a_after
    async with started_peer("a", seed=0) as restarted:  # a restart, inside the clock window
        before = state(restarted)
        for request in captured:
            status, error = await send(restarted, request)
            assert status == 401 and error is not None, request.path
            assert "before a restart" in error["detail"]
        assert state(restarted) == before
        assert "z-intruder" not in restarted.membership


def version_1_headers(path: str, body: bytes) -> dict[str, str]:
    """What a peer of protocol version 1 sent: seconds, a signature naming no receiver."""
    timestamp, nonce = int(auth.now_ms() // 1000), "cd" * 16
    text = f"POST\n{path}\n{timestamp}\n{nonce}\n{auth.body_digest(body)}".encode()
    signature = hmac.new(SECRET, text, hashlib.sha256).hexdigest()
    return {
        "Authorization": f"{auth.SCHEME} timestamp={timestamp},nonce={nonce},signature={signature}",
        "Content-Type": "application/json",
    }


async def test_a_version_1_request_is_refused_as_an_unsupported_version() -> None:
    body = json.dumps({"id": "old-peer", "address": None}).encode()
    async with started_peer("a") as a:
        before = state(a)
        old = Captured("POST", "/v1/join", version_1_headers("/v1/join", body), body)
        status, error = await send(a, old)
        assert status == 400 and error is not None
        assert error["error"] == "unsupported_version" and "version 1" in error["detail"]
        assert state(a) == before and "old-peer" not in a.membership
