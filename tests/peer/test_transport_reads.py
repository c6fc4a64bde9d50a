"""The plain fallback of direct body reads (``peer.transport.socket_reads``): a server that
reads every body through aiohttp's public stream answers an exchange with the same bits
as one that reads large bodies straight from the socket. Real peers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
import torch
from aiohttp import web

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.protocol import auth
from peer.transport.body import MSGPACK, poly1305_tag
from peer.transport.receive import DIRECT_BODY_BYTES
from peer.transport.server import SERVER_STATE, make_runner
from peer.transport.socket_reads import DirectReads, missing_internals

from .conftest import SECRET, make_model, model_bytes, sgd
from .test_server import envelope_body

WIDTH = 200_000
"""A ``Linear(WIDTH, 2)`` model: an exchange body of 1.6 MB, read directly where allowed."""


@asynccontextmanager
async def served(direct_reads: bool | None) -> AsyncIterator[tuple[Peer, str, web.AppRunner]]:
    config = PeerConfig(peer_id="callee", secret=SECRET, request_timeout_s=5.0)
    peer = Peer(make_model(1, WIDTH), sgd, torch.nn.functional.cross_entropy, [], config)
    await peer.start()
    await asyncio.sleep(0.002)  # requests signed after the millisecond it started
    runner = make_runner(peer, direct_reads=direct_reads)
    try:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield peer, f"127.0.0.1:{runner.addresses[0][1]}", runner
    finally:
        await runner.cleanup()
        await peer.stop()


def stream_exchange(vector: torch.Tensor) -> tuple[bytes, dict[str, str]]:
    body = envelope_body(vector)
    nonce = secrets.token_hex(16)
    tagged = body + poly1305_tag(auth.body_key(SECRET, nonce, "request"), body)
    headers = auth.sign_stream_request(
        SECRET, "POST", "/v1/exchange", len(tagged), receiver="callee", nonce=nonce
    )
    headers["Content-Type"] = MSGPACK
    return tagged, headers


def test_aiohttp_internals_are_as_expected_here() -> None:
    """The pinned aiohttp has what a direct read needs (else every test here reads through
    the fallback twice and shows nothing)."""
    assert missing_internals() is None
    assert DirectReads().enabled


def test_choosing_the_fallback_logs_one_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="peer.transport.server")
    assert not DirectReads(direct=False).enabled
    lines = [r for r in caplog.records if "direct body reads off" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.DEBUG


async def test_the_fallback_answers_an_exchange_with_the_same_bits() -> None:
    """The same stream-signed exchanges (same nonces) sent to two identical peers, one
    reading directly and one through the fallback: the same answers byte for byte, the
    same models after, on a kept-alive connection."""
    vectors = [
        torch.randn(2 * WIDTH + 2, generator=torch.Generator().manual_seed(seed)) for seed in (7, 8)
    ]
    async with served(None) as direct, served(False) as plain:
        requests = [stream_exchange(v) for v in vectors]  # signed after both peers started
        assert all(len(body) >= DIRECT_BODY_BYTES for body, _ in requests)
        results = []
        for peer, address, runner in (direct, plain):
            answers = []
            async with aiohttp.ClientSession() as session:
                for body, headers in requests:
                    async with session.post(
                        f"http://{address}/v1/exchange", data=body, headers=headers
                    ) as response:
                        answers.append((response.status, await response.read()))
            results.append((runner.app[SERVER_STATE].direct_reads, answers, model_bytes(peer)))  # type: ignore[union-attr]
    (direct_on, direct_answers, direct_model), (plain_on, plain_answers, plain_model) = results
    assert (direct_on, plain_on) == (True, False)
    assert [status for status, _ in direct_answers] == [200, 200]
    assert direct_answers == plain_answers
    assert direct_model == plain_model
