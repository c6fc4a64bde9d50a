"""Floods against a real peer's server: stalled bodies, junk signatures, too many
connections, memory pinned by unauthenticated bodies (``peer.transport.admission``, ``peer.transport.server``).

Each test serves a real peer on 127.0.0.1 through ``peer.transport.server.make_runner`` and checks
that what it refuses leaves the model's bytes and the membership exactly as they were.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import aiohttp
import pytest
import torch

from peer.protocol import auth
from peer.transport.admission import ServerLimits, fixed_memory_bytes
from peer.transport.body import MSGPACK, poly1305_tag
from peer.transport.server import SERVER_STATE

from .conftest import SECRET
from .test_server import Served, envelope_body, parse_answer, served_peer

ROOT = Path(__file__).resolve().parents[2]
STALLED = 8
ENVELOPE_START = envelope_body(torch.ones(10))[:40]


def stream_signed_exchange(served: Served) -> tuple[bytes, dict[str, str]]:
    """An exchange body with its tag and headers, as a stream-signing peer sends it."""
    body = envelope_body(torch.full((served.peer.spec.numel,), 3.0))
    nonce = secrets.token_hex(16)
    tagged = body + poly1305_tag(auth.body_key(SECRET, nonce, "request"), body)
    headers = auth.sign_stream_request(
        SECRET, "POST", "/v1/exchange", len(tagged), receiver=served.peer.peer_id, nonce=nonce
    )
    return tagged, headers


async def exchange_status(served: Served, *, signed: bool) -> tuple[int, str]:
    """Status and error code (``""`` on success) of one exchange sent to ``served``."""
    if signed:
        body, headers = stream_signed_exchange(served)
    else:
        body, headers = envelope_body(torch.full((served.peer.spec.numel,), 3.0)), {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://{served.address}/v1/exchange", data=body, headers=headers
        ) as response,
    ):
        data = await response.read()
        return response.status, (json.loads(data)["error"] if response.status >= 400 else "")


@asynccontextmanager
async def stalled(
    address: str, heads: list[bytes], *, body: bytes = ENVELOPE_START
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """Connections that each send a request head and the start of its body (by default, of
    a valid envelope), then stall."""
    host, port = address.split(":")
    connections = []
    try:
        for head in heads:
            reader, writer = await asyncio.open_connection(host, int(port))
            connections.append((reader, writer))
            writer.write(head + body)
            with suppress(ConnectionError):  # refused and closed already: fine
                await writer.drain()
        yield connections
    finally:
        for _, writer in connections:
            writer.close()


async def answer_head(reader: asyncio.StreamReader, timeout_s: float) -> tuple[int, str]:
    """The status and error code a stalled connection was answered with."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    status, headers, _ = parse_answer(head)
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout_s)
    return status, json.loads(body)["error"]


def exchange_head(length: int, authorization: str | None) -> bytes:
    auth_line = f"Authorization: {authorization}\r\n" if authorization else ""
    return (
        f"POST /v1/exchange HTTP/1.1\r\nHost: x\r\n{auth_line}"
        f"Content-Type: application/msgpack\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def test_stalled_junk_signatures_get_401_before_any_slot() -> None:
    """With a secret, 8 stalled bodies with a junk Authorization are refused at once, before
    a slot is taken; 8 more with a well-formed forged digest header are held under the
    byte budget, not in slots: signed exchanges meanwhile are never busy."""
    async with served_peer("callee", request_timeout_s=30.0) as served:
        state = served.runner.app[SERVER_STATE]  # type: ignore[attr-defined]
        length = served.peer.max_body_bytes
        before = served.digest()
        junk = [exchange_head(length, "gossipnet-hmac-sha256 junk")] * STALLED
        forged = auth.sign_request(
            b"not-the-swarm-secret!", "POST", "/v1/exchange", b"", receiver="callee"
        )["Authorization"]
        async with (
            stalled(served.address, junk) as junk_connections,
            stalled(served.address, [exchange_head(length, forged)] * STALLED),
        ):
            for reader, _ in junk_connections:
                assert await answer_head(reader, 5) == (401, "unauthorized")
            await asyncio.sleep(0.2)
            assert state.slots.in_use == 0
            assert state.budget.held == STALLED * length
            assert served.digest() == before
            for _ in range(STALLED + 2):
                assert await exchange_status(served, signed=True) == (200, "")
        # the forged ones' bytes return to the budget when they end
        for _ in range(50):
            if state.budget.held == 0:
                break
            await asyncio.sleep(0.05)
        assert state.budget.held == 0


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_stalled_bodies_in_an_open_swarm_hold_slots_only_until_the_deadline() -> None:
    """Without a secret nothing can be authenticated: 8 stalled bodies take the 8 slots
    (an exchange meanwhile is 409 busy), each until the body deadline (408), and then
    every slot is free again and exchanges are served."""
    deadline_s = 1.5
    # refused connections linger 1 s (not aiohttp's 10 s): the server's cleanup waits on them
    async with served_peer(
        "callee", secret=None, request_timeout_s=deadline_s, linger_s=1.0
    ) as served:
        state = served.runner.app[SERVER_STATE]  # type: ignore[attr-defined]
        heads = [exchange_head(served.peer.max_body_bytes, None)] * STALLED
        before = served.digest()
        started = time.monotonic()
        async with stalled(served.address, heads) as connections:
            for _ in range(100):
                if state.slots.in_use == STALLED:
                    break
                await asyncio.sleep(0.01)
            assert state.slots.in_use == STALLED
            assert await exchange_status(served, signed=False) == (409, "busy")
            for reader, _ in connections:
                assert await answer_head(reader, 5 * deadline_s) == (408, "body_timeout")
            waited = time.monotonic() - started
            assert deadline_s * 0.9 <= waited < deadline_s + 5
            assert state.slots.in_use == 0
            assert served.digest() == before
            assert await exchange_status(served, signed=False) == (200, "")


async def test_connections_beyond_the_bound_get_429_then_the_bound_frees() -> None:
    limits = ServerLimits(max_concurrent_exchanges=2, max_connections=6, idle_timeout_s=1.0)
    async with served_peer("callee", limits=limits) as served:
        before = served.digest()
        host, port = served.address.split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(6)]
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection(host, int(port))
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        status, headers, body = parse_answer(answer)
        assert status == 429 and json.loads(body)["error"] == "overloaded"
        assert headers["content-type"].startswith("application/json")
        refused = served.peer.metrics.registry.get_sample_value(
            "gossipnet_request_errors_total", {"code": "overloaded"}
        )
        assert refused is not None and refused >= 1
        # idle connections (no request, or headers never finished) close after idle_timeout_s
        held[0][1].write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")  # never finished
        for held_reader, _ in held:
            assert await asyncio.wait_for(held_reader.read(), 5) == b""
        for _, held_writer in held:
            held_writer.close()
        await asyncio.sleep(0.1)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{served.address}/v1/status") as response,
        ):
            assert response.status == 200
        assert served.digest() == before


def join_head(length: int, receiver: str) -> bytes:
    authorization = auth.sign_request(SECRET, "POST", "/v1/join", b"", receiver=receiver)
    return (
        f"POST /v1/join HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization['Authorization']}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def test_stalled_join_bodies_are_held_within_the_byte_budget() -> None:
    limits = ServerLimits(max_unauthenticated_bytes=4 << 20)
    async with served_peer("callee", limits=limits, request_timeout_s=30.0) as served:
        state = served.runner.app[SERVER_STATE]  # type: ignore[attr-defined]
        before = served.digest()
        part = b'{"id": "x", "address": "' + b"a" * ((1 << 20) - 100)
        heads = [join_head(1 << 20, "callee")] * 10
        async with stalled(served.address, heads, body=part) as connections:

            async def answer(reader: asyncio.StreamReader) -> tuple[int, str]:
                try:
                    return await answer_head(reader, 1.0)
                except TimeoutError:
                    return (0, "stalled")  # still being read, within the budget

            # every connection's answer awaited at once: the stalled ones time out together
            answers = await asyncio.gather(*(answer(reader) for reader, _ in connections))
            assert answers.count((0, "stalled")) == 4  # 4 MiB: four bodies of ~1 MiB
            assert answers.count((429, "overloaded")) == 6
            assert state.budget.held <= limits.max_unauthenticated_bytes
            assert served.digest() == before
        for _ in range(100):
            if state.budget.held == 0:
                break
            await asyncio.sleep(0.05)
        assert state.budget.held == 0
        assert len(served.peer.membership) == 0


CHILD = """
import asyncio, dataclasses, json, sys, torch
from aiohttp import web
from peer.transport.admission import ServerLimits, fixed_memory_bytes
from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.transport.server import make_runner

async def main():
    config = PeerConfig(peer_id="callee", secret=sys.argv[1].encode(), request_timeout_s=30.0)
    # 2 MiB of parameters: bodies of a few MiB are within the model's body cap
    peer = Peer(torch.nn.Linear(1 << 18, 2), lambda p: torch.optim.SGD(p, lr=0.1),
                torch.nn.functional.cross_entropy, [], config)
    await peer.start()
    # refused connections linger 1 s (not aiohttp's 10 s) before they close
    runner = make_runner(peer, dataclasses.replace(ServerLimits.of(peer), linger_s=1.0))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(json.dumps({"address": f"127.0.0.1:{runner.addresses[0][1]}"}), flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await runner.cleanup()
    await peer.stop()

asyncio.run(main())
"""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
async def test_fifty_stalled_json_bodies_cannot_pin_memory_and_it_returns() -> None:
    """Rounds of 50 stalled bodies against a peer process (a 2 MiB model, so bodies of a few
    MiB are within its model-sized cap): ``/v1/join`` bodies of 1 MiB (read, within the
    byte budget), of 3 MiB (over the JSON cap: refused unread) and ``/v1/peers`` with bodies
    (refused unread). Its RSS grows by at most the server's fixed memory bound (connection
    buffers and the byte budget) and is back within 10 % once the abuse stops."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, SECRET.decode()],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        address = json.loads(line)["address"]
        part = b'{"id": "x", "address": "' + b"a" * ((1 << 20) - 100)
        abuse = [
            ([join_head(1 << 20, "callee")] * 50, part),
            ([join_head(3 << 20, "callee")] * 50, part * 2),
            ([b"GET /v1/peers HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"] * 50, part),
        ]
        for _ in range(2):  # warm up: allocations that stay whatever happens
            async with stalled(address, [join_head(1 << 20, "callee")] * 4, body=part):
                await asyncio.sleep(0.5)
        await asyncio.sleep(3)
        start = rss_mib(child.pid)
        peak = start
        for heads, body in abuse + abuse:  # rounds of abuse, as in the issue
            async with stalled(address, heads, body=body):
                await asyncio.sleep(1.0)
                peak = max(peak, rss_mib(child.pid))
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0 + 1)  # refused connections linger (linger_s=1.0 above)
        end = rss_mib(child.pid)
        bound = fixed_memory_bytes(ServerLimits()) / 2**20
        print(f"RSS MiB: start {start:.1f}, peak {peak:.1f}, after {end:.1f}; bound +{bound:.1f}")
        assert peak - start < bound
        assert end - start < 0.1 * start
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


async def test_a_refusal_on_expect_100_continue_comes_before_the_body_and_closes() -> None:
    """A caller that asks first (``Expect: 100-continue``, as PeerClient does for large
    bodies) is refused on its headers: it never sends the body, gets the JSON error, and
    the connection is closed at once (neither side waits for a body that will not come)."""
    from .conftest import model_bytes, started_peer

    async with started_peer("callee") as peer, aiohttp.ClientSession() as session:
        before = model_bytes(peer)
        url = f"http://{peer.address}/v1/exchange"
        junk = {"Authorization": "gossipnet-stream-poly1305 junk", "Content-Type": MSGPACK}
        sent = 0

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            for _ in range(64):
                sent += 1 << 16
                yield b"\0" * (1 << 16)

        for _ in range(5):
            started = time.monotonic()
            async with session.post(url, data=body(), headers=junk, expect100=True) as answer:
                error = await answer.json()
            assert answer.status == 401 and error["error"] == "unauthorized"
            assert time.monotonic() - started < 2.0
        await asyncio.sleep(0.2)
        assert sent == 0
        assert peer.listening is not None and peer.listening.connections == 0
        assert model_bytes(peer) == before
