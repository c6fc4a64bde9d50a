"""The streamed data path of a live peer: stream-signed bodies (header checked before the
body, Poly1305 tag at its end), hostile variants refused with the model untouched, and the
event loop free while a large message is decoded."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
import torch

from peer.node.metrics import EXCHANGE_PHASES
from peer.node.peer import Peer
from peer.protocol import auth
from peer.protocol.wire import ModelSpec, pack_envelope
from peer.transport.body import poly1305_tag

from .conftest import SECRET, model_bytes, started_peer
from .test_server import envelope_body


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    async with started_peer("callee", seed=1) as p:
        yield p


def stream_signed(
    body: bytes, *, secret: bytes = SECRET, path: str = "/v1/exchange", method: str = "POST"
) -> tuple[bytes, dict[str, str]]:
    """A body with its tag, and the headers, as a stream-signing client sends them."""
    nonce = "ab" * 16
    signed = body + poly1305_tag(auth.body_key(secret, nonce, "request"), body)
    headers = auth.sign_stream_request(
        secret, method, path, len(signed), nonce=nonce, receiver="callee"
    )
    return signed, headers


async def send(
    peer: Peer, body: bytes, headers: Mapping[str, str], *, path: str = "/v1/exchange"
) -> tuple[int, bytes, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{peer.address}{path}", data=body, headers=dict(headers)) as response,
    ):
        return response.status, await response.read(), dict(response.headers)


async def test_a_stream_signed_exchange_is_averaged_and_answered_with_a_tag(peer: Peer) -> None:
    other = torch.full((peer.spec.numel,), 3.0)
    expected = (peer.flat.vector + other) / 2
    body, headers = stream_signed(envelope_body(other))
    status, data, _ = await send(peer, body, headers)
    assert status == 200, data
    nonce = auth.request_nonce(headers)
    answer, tag = data[:-16], data[-16:]
    assert poly1305_tag(auth.body_key(SECRET, nonce, "response", 200), answer) == tag
    torch.testing.assert_close(peer.flat.vector, expected)


def _flip(body: bytes, index: int) -> bytes:
    return body[:index] + bytes([body[index] ^ 1]) + body[index + 1 :]


HOSTILE: dict[str, Any] = {
    "a flipped tensor byte": lambda body, headers: (_flip(body, len(body) - 40), headers),
    "a flipped tag byte": lambda body, headers: (_flip(body, len(body) - 1), headers),
    "no tag": lambda body, headers: (
        body[:-16],
        auth.sign_stream_request(SECRET, "POST", "/v1/exchange", len(body) - 16, receiver="callee"),
    ),
    "the length signed is not the body's": lambda body, headers: (
        body,
        auth.sign_stream_request(SECRET, "POST", "/v1/exchange", len(body) + 1, receiver="callee"),
    ),
    "another secret": lambda body, headers: stream_signed(
        body[:-16], secret=b"not-the-swarm-secret!"
    ),
    "signed for another path": lambda body, headers: (
        body,
        auth.sign_stream_request(
            SECRET,
            "POST",
            "/v1/state",
            len(body),
            nonce=auth.request_nonce(headers),
            receiver="callee",
        ),
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_hostile_stream_signed_bodies_get_401_and_leave_the_model(
    peer: Peer, case: str
) -> None:
    body, headers = stream_signed(envelope_body(torch.full((peer.spec.numel,), 3.0)))
    body, headers = HOSTILE[case](body, headers)
    before = model_bytes(peer)
    status, data, _ = await send(peer, body, headers)
    assert status == 401, (status, data)
    assert json.loads(data)["error"] == "unauthorized"
    assert model_bytes(peer) == before


async def test_a_replayed_stream_signed_request_is_refused_before_its_body(peer: Peer) -> None:
    body, headers = stream_signed(envelope_body(torch.full((peer.spec.numel,), 3.0)))
    assert (await send(peer, body, headers))[0] == 200
    before = model_bytes(peer)
    status, data, _ = await send(peer, body, headers)
    assert status == 401 and "replayed" in json.loads(data)["detail"]
    assert model_bytes(peer) == before


async def test_json_endpoints_take_only_digest_signatures(peer: Peer) -> None:
    body = json.dumps({"id": "x", "address": None}).encode()
    signed, headers = stream_signed(body, path="/v1/join")
    status, data, _ = await send(peer, signed, headers, path="/v1/join")
    assert status == 401 and "digest-signed" in json.loads(data)["detail"]
    assert "x" not in {m.id for m in peer.membership.members()}


class _GatedDecode:
    """The ``none`` codec, whose decode waits for a gate (so a test can hold it mid-way)."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        self.name = codec.name
        self.started = threading.Event()
        self.gate = threading.Event()

    def encode(self, vector: torch.Tensor) -> dict[str, Any]:
        return dict(self.codec.encode(vector))

    def decode(self, payload: Mapping[str, Any], spec: ModelSpec) -> torch.Tensor:
        self.started.set()
        if not self.gate.wait(timeout=30):
            raise RuntimeError("the test never opened the gate")
        return self.codec.decode(payload, spec)


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_status_is_answered_while_an_exchange_is_being_decoded() -> None:
    """Ordering, not timing: the decode is held mid-way, /v1/status must still answer, and
    only then is the decode let go and the exchange finished."""
    async with started_peer("callee", seed=1, secret=None) as callee:
        gated = _GatedDecode(callee.codecs["none"])
        callee.codecs["none"] = gated  # type: ignore[assignment]
        other = torch.full((callee.spec.numel,), 5.0)
        body = pack_envelope_of(other)
        async with aiohttp.ClientSession() as session:
            exchange = asyncio.create_task(
                session.post(f"http://{callee.address}/v1/exchange", data=body)
            )
            assert await asyncio.to_thread(gated.started.wait, 30)
            async with session.get(f"http://{callee.address}/v1/status") as status:
                assert status.status == 200
                assert (await status.json())["id"] == "callee"
            assert not exchange.done()  # still held in the decode
            gated.gate.set()
            response = await exchange
            assert response.status == 200
            response.release()


def pack_envelope_of(vector: torch.Tensor) -> bytes:
    from peer.protocol.codecs import DenseCodec
    from peer.protocol.wire import Envelope

    return pack_envelope(
        Envelope(sender="caller", round=0, codec="none", payload=DenseCodec().encode(vector))
    )


def _callee_exchanges(peer: Peer, outcome: str) -> float:
    pattern = rf'gossipnet_exchanges_total\{{outcome="{outcome}",role="callee"\}} ([0-9.e+]+)'
    found = re.search(pattern, peer.render_metrics().decode())
    return float(found.group(1)) if found else 0.0


async def _counted(peer: Peer, outcome: str) -> float:
    """The callee's count of ``outcome`` once it is non-zero (the server counts an exchange
    after its answer is written, which the caller may have read already), or 0 after 10 s."""
    for _ in range(200):
        if _callee_exchanges(peer, outcome):
            break
        await asyncio.sleep(0.05)
    return _callee_exchanges(peer, outcome)


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_an_answer_the_caller_left_before_is_counted_unanswered_not_ok() -> None:
    """The caller hangs up while its request is decoded: the callee still averages (it
    commits before it answers) but counts the exchange ``unanswered``, not ``ok``."""
    async with started_peer("callee", seed=1, secret=None) as callee:
        gated = _GatedDecode(callee.codecs["none"])
        callee.codecs["none"] = gated  # type: ignore[assignment]
        before = model_bytes(callee)
        body = pack_envelope_of(torch.full((callee.spec.numel,), 5.0))
        host, port = callee.address.rsplit(":", 1)
        _reader, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"POST /v1/exchange HTTP/1.1\r\nHost: {callee.address}\r\n"
            f"Content-Type: application/msgpack\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        assert await asyncio.to_thread(gated.started.wait, 30)
        writer.close()  # gone before the answer
        await writer.wait_closed()
        gated.gate.set()
        assert await _counted(callee, "unanswered") == 1
        assert _callee_exchanges(callee, "ok") == 0
        assert model_bytes(callee) != before  # averaged: the pair's sum moved


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_an_answer_taken_whole_is_counted_ok() -> None:
    async with started_peer("callee", seed=1, secret=None) as callee:
        body = pack_envelope_of(torch.full((callee.spec.numel,), 5.0))
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://{callee.address}/v1/exchange", data=body) as response,
        ):
            assert response.status == 200
            await response.read()
        assert await _counted(callee, "ok") == 1
        assert _callee_exchanges(callee, "unanswered") == 0


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_each_phase_of_an_exchange_is_timed_on_its_side_and_refusals_in_none() -> None:
    """One successful exchange adds one observation to each of the caller's phases on the
    caller and each of the callee's on the callee (``gossipnet_exchange_phase_seconds``);
    a request the callee refuses adds none."""
    async with (
        started_peer("callee", seed=1, secret=None) as callee,
        started_peer(
            "caller", seed=2, secret=None, join=(callee.address,), fetch_state=False
        ) as caller,
    ):
        assert await caller.gossip() == 1
        assert await _counted(callee, "ok") == 1
        totals = {"caller": caller.metrics.phase_totals(), "callee": callee.metrics.phase_totals()}
        for role, phase in EXCHANGE_PHASES:
            seconds, count = totals[role][role, phase]
            assert count == 1 and seconds > 0, (role, phase)
            other = "callee" if role == "caller" else "caller"
            assert totals[other][role, phase] == (0.0, 0), (role, phase)
        rendered = callee.render_metrics().decode()
        assert 'gossipnet_exchange_phase_seconds_count{phase="check",role="callee"} 1.0' in rendered

        body = pack_envelope_of(torch.full((callee.spec.numel,), float("nan")))
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://{callee.address}/v1/exchange", data=body) as response,
        ):
            assert response.status == 422
            assert (await response.json())["error"] == "non_finite"
        assert callee.metrics.phase_totals() == totals["callee"]
