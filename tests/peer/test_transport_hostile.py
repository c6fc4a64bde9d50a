"""Hostile input a real peer's server must refuse without a trace: content-encoded bodies,
forged requests over malformed bodies (authenticated before parsed), stalled bodies that
must not spend the serving share. Each test serves a real peer on 127.0.0.1 through
``peer.transport.server.make_runner`` and checks that refused input leaves the model and the
membership exactly as they were."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.protocol import auth
from peer.transport.admission import ServingShare
from peer.transport.body import poly1305_tag
from peer.transport.server import make_runner

from .conftest import SECRET, make_model, sgd
from .test_floods import answer_head, exchange_head, exchange_status, stalled
from .test_server import Served, envelope_body, error_of, good, post, served_peer, signed


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with served_peer("callee", seed=1) as s:
        yield s


NOT_GZIP = b"this is not gzip at all " * 8


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing logged at ERROR or with a traceback (aiohttp's "Unhandled exception")."""
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info is not None]
    assert not bad, [(r.name, r.getMessage()) for r in bad]


@pytest.mark.parametrize("path", ["/v1/exchange", "/v1/join"])
@pytest.mark.parametrize("signing", ["unsigned", "signed"])
async def test_a_content_encoded_body_gets_a_json_4xx_and_no_traceback(
    caplog: pytest.LogCaptureFixture, path: str, signing: str
) -> None:
    caplog.set_level(logging.DEBUG)
    async with served_peer("callee", seed=1) as served:
        before = served.digest()
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"}
        if signing == "signed":
            headers.update(signed(served, "POST", path, NOT_GZIP))
        status, data, _ = await post(served, NOT_GZIP, path=path, headers=headers)
        expected = (401, "unauthorized") if signing == "unsigned" else (400, "malformed_request")
        assert (status, error_of(status, data)) == expected, data
        await asyncio.sleep(0.3)  # aiohttp lingers over the unread body after answering
        no_traceback(caplog)
        assert served.digest() == before
        # the peer still serves a good exchange
        status, data, _ = await post(served, envelope_body(good(served.peer)))
        assert status == 200, data


def stream_headers(served: Served, body_length: int, nonce: str) -> dict[str, str]:
    return auth.sign_stream_request(
        SECRET, "POST", "/v1/exchange", body_length, receiver=served.peer.peer_id, nonce=nonce
    )


def tagged(body: bytes, nonce: str, secret: bytes = SECRET) -> bytes:
    return body + poly1305_tag(auth.body_key(secret, nonce, "request"), body)


MALFORMED = b"\xc1not msgpack at all"
FORGED = {
    # digest-signed, over a malformed body
    "digest: wrong secret": lambda s: (
        MALFORMED,
        auth.sign_request(
            b"not-the-swarm-secret!", "POST", "/v1/exchange", MALFORMED, receiver="callee"
        ),
    ),
    "digest: signed another body": lambda s: (
        MALFORMED,
        signed(s, "POST", "/v1/exchange", MALFORMED + b"x"),
    ),
    "digest: malformed, then trailing bytes": lambda s: (
        envelope_body(good(s.peer)) + b"\x00\x01",
        signed(s, "POST", "/v1/exchange", envelope_body(good(s.peer))),
    ),
}


def _stream_case(build: Any) -> Any:
    def case(s: Served) -> tuple[bytes, dict[str, str]]:
        nonce = secrets.token_hex(16)
        body = build(s, nonce)
        return body, stream_headers(s, len(body), nonce)

    return case


FORGED.update(
    {
        # stream-signed: an authentic header, a body whose tag does not verify
        "stream: malformed, tag of another secret": _stream_case(
            lambda s, n: tagged(MALFORMED, n, b"not-the-swarm-secret!")
        ),
        "stream: malformed, no tag": _stream_case(lambda s, n: MALFORMED + b"\x00" * 16),
        "stream: misplaced tag": _stream_case(
            lambda s, n: tagged(envelope_body(good(s.peer)), n) + b"\x00\x01"
        ),
        "stream: tag of another nonce": _stream_case(
            lambda s, n: tagged(envelope_body(good(s.peer)), secrets.token_hex(16))
        ),
    }
)


@pytest.mark.parametrize("case", list(FORGED))
async def test_a_forged_exchange_is_401_whatever_its_body(served: Served, case: str) -> None:
    """Authenticated before parsed: a body whose digest signature or tag does not verify is
    ``401``, not the ``400`` its form would earn."""
    body, headers = FORGED[case](served)
    before = served.digest()
    status, data, _ = await post(served, body, headers=headers)
    assert (status, error_of(status, data)) == (401, "unauthorized"), data
    assert served.digest() == before
    status, data, _ = await post(served, envelope_body(good(served.peer)))
    assert status == 200, data


@pytest.mark.parametrize(
    "body",
    [MALFORMED, b"\x80", envelope_body(torch.ones(3))[:-8]],
    ids=["not msgpack", "an empty map", "cut inside a bin"],
)
async def test_an_authentic_stream_signed_malformed_body_is_400(
    served: Served, body: bytes
) -> None:
    nonce = secrets.token_hex(16)
    sent = tagged(body, nonce)
    before = served.digest()
    status, data, _ = await post(served, sent, headers=stream_headers(served, len(sent), nonce))
    assert status == 400, data
    assert error_of(status, data) in ("malformed_body", "unsupported_version")
    assert served.digest() == before


@pytest.fixture
def served_peer_with_share() -> Any:
    @asynccontextmanager
    async def serve(share: ServingShare, **overrides: Any) -> AsyncIterator[Served]:
        overrides.setdefault("secret", SECRET)
        config = PeerConfig(peer_id="callee", **overrides)
        peer = Peer(make_model(1), sgd, torch.nn.functional.cross_entropy, [], config)
        await peer.start()
        await asyncio.sleep(0.002)
        peer.serving_share = share  # the server reads it when its app is built
        runner = make_runner(peer)
        try:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            yield Served(peer, f"127.0.0.1:{runner.addresses[0][1]}", runner)
        finally:
            await runner.cleanup()
            await peer.stop()

    return serve


STALLED = 8


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
@pytest.mark.parametrize("swarm", ["open", "stream-signed"])
async def test_stalled_bodies_do_not_spend_the_serving_share(
    served_peer_with_share: Any, swarm: str
) -> None:
    """Eight bodies stalled until the body deadline (each holding a slot: an open swarm's,
    or one whose stream-signed header is authentic) spend none of a training peer's
    serving share: once they are refused, the next exchange is served at once."""
    deadline_s = 1.0
    share = ServingShare(0.5, lambda: True, window_s=0.5)  # always training
    secret = None if swarm == "open" else SECRET
    async with served_peer_with_share(share, secret=secret, request_timeout_s=deadline_s) as served:
        length = served.peer.max_body_bytes
        heads = [
            exchange_head(
                length,
                None
                if secret is None
                else stream_headers(served, length, secrets.token_hex(16))["Authorization"],
            )
            for _ in range(STALLED)
        ]
        before = served.digest()
        async with stalled(served.address, heads) as connections:
            for reader, _ in connections:
                assert await answer_head(reader, 5 * deadline_s) == (408, "body_timeout")
        assert share.share() == 0.0
        assert served.digest() == before
        assert await exchange_status(served, signed=secret is not None) == (200, "")
        assert share.refused == 0


async def test_a_content_encoded_exchange_asking_first_is_refused_on_its_headers(
    served: Served,
) -> None:
    """``Expect: 100-continue`` with a Content-Encoding: refused before the body is sent."""
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(4):
            sent += 1 << 16
            yield b"\0" * (1 << 16)

    nonce = secrets.token_hex(16)
    headers = stream_headers(served, 4 << 16, nonce)
    headers.update({"Content-Encoding": "gzip", "Content-Length": str(4 << 16)})
    before = served.digest()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://{served.address}/v1/exchange", data=body(), headers=headers, expect100=True
        ) as answer,
    ):
        error = await answer.json()
    assert (answer.status, error["error"]) == (400, "malformed_request")
    assert sent == 0
    assert served.digest() == before
