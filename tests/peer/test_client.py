"""The client trusts no answer (unsigned or replayed responses are refused before use), and
signs each request for the peer it calls (``tests/peer/test_hostile_neighbour.py`` throws
every kind of garbage at it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import torch
from aiohttp import web

from peer.protocol import auth, wire
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import BodyTooLarge, Unauthorized, UnknownPeer
from peer.transport.client import PeerClient, RemoteRefused

from .conftest import SECRET, started_peer

REPLY = wire.pack_envelope(
    wire.Envelope(
        sender="impostor",
        round=0,
        codec="none",
        payload=DenseCodec().encode(torch.ones(3)),
    )
)


async def serve(handler: web.Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/exchange", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def envelope() -> wire.Envelope:
    return wire.Envelope(
        sender="me", round=0, codec="none", payload=DenseCodec().encode(torch.zeros(3))
    )


@pytest.fixture
async def unsigned_server() -> AsyncIterator[str]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=REPLY, content_type="application/msgpack")

    async for address in serve(handler):
        yield address


@pytest.fixture
async def replaying_server() -> AsyncIterator[str]:
    """Answers with a response genuinely signed, but for another request's nonce."""

    async def handler(request: web.Request) -> web.Response:
        headers = auth.sign_response(SECRET, 200, "0" * 32, REPLY)
        return web.Response(body=REPLY, content_type="application/msgpack", headers=headers)

    async for address in serve(handler):
        yield address


async def test_unsigned_response_is_refused(unsigned_server: str) -> None:
    async with PeerClient(secret=SECRET, timeout_s=5.0, max_body_bytes=1 << 20) as client:
        with pytest.raises(Unauthorized, match="response signature"):
            await client.exchange(unsigned_server, envelope(), receiver="impostor", codecs={"none"})
    async with PeerClient(secret=None, timeout_s=5.0, max_body_bytes=1 << 20) as open_client:
        reply = await open_client.exchange(unsigned_server, envelope(), codecs={"none"})
        assert reply.sender == "impostor"  # an open swarm trusts anyone: hence the warning


async def test_replayed_response_is_refused(replaying_server: str) -> None:
    async with PeerClient(secret=SECRET, timeout_s=5.0, max_body_bytes=1 << 20) as client:
        with pytest.raises(Unauthorized):
            await client.exchange(
                replaying_server, envelope(), receiver="impostor", codecs={"none"}
            )


async def test_response_over_the_cap_is_refused(unsigned_server: str) -> None:
    async with PeerClient(secret=None, timeout_s=5.0, max_body_bytes=len(REPLY) - 1) as client:
        with pytest.raises(BodyTooLarge):
            await client.exchange(unsigned_server, envelope(), codecs={"none"})


async def test_an_answer_from_another_peer_than_the_one_called_is_refused(
    unsigned_server: str,
) -> None:
    async with PeerClient(secret=None, timeout_s=5.0, max_body_bytes=1 << 20) as client:
        with pytest.raises(UnknownPeer, match="answered as 'impostor', not 'b'"):
            await client.exchange(unsigned_server, envelope(), receiver="b", codecs={"none"})


async def test_a_bare_address_is_asked_who_listens_and_the_request_signed_for_it() -> None:
    async with (
        started_peer("a") as a,
        PeerClient(secret=SECRET, timeout_s=5.0, max_body_bytes=1 << 20) as client,
    ):
        assert await client.peer_id(a.address) == "a"
        view = await client.peers(a.address)  # no receiver: GET /v1/status first
        assert view["id"] == "a" and view["v"] == wire.PROTOCOL_VERSION
        with pytest.raises(RemoteRefused) as refused:  # as if a status had lied: refused
            await client.peers(a.address, receiver="b")
        assert refused.value.status == 401 and "signed for another peer" in refused.value.detail


def test_client_validates_timeout() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        PeerClient(secret=None, timeout_s=0, max_body_bytes=1)
