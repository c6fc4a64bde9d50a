"""The direct receive path (``peer.transport.receive``, issue 16) against real peers and raw sockets.

A body of at least :data:`peer.transport.receive.DIRECT_BODY_BYTES` is read by a
:class:`~peer.transport.receive.DirectBody` once aiohttp parsed its head: straight from the socket
into the arena (``recv_into``), exactly ``Content-Length`` bytes, then the connection is
handed back to aiohttp. Every test serves a real peer on 127.0.0.1 (``make_runner``, as a
peer serves itself) and writes its requests through a raw socket where the byte layout
matters: the TCP segments a body arrives in, a body cut short, one glued to the next
request, one trickling past the body deadline, several on one keep-alive connection.
Whatever is refused leaves the callee's model and membership bit for bit as they were and
gives its exchange slot back.

The models are ``Linear(WIDTH, 2)``: 400 002 float32 parameters, a 1.6 MB body.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader as HttpStream

from peer.protocol import auth
from peer.protocol.auth import client_ssl_context
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import ProtocolError, Unauthorized
from peer.protocol.wire import Envelope, ModelSpec
from peer.transport.admission import ServerLimits
from peer.transport.body import poly1305_tag, read_envelope_object
from peer.transport.client import PeerClient, PeerUnavailable
from peer.transport.receive import DIRECT_BODY_BYTES, DirectBody, can_take_over, take_over
from peer.transport.server import SERVER_STATE

from .conftest import SECRET, model_bytes
from .test_server import Served, envelope_body, parse_answer, served_peer
from .test_tls import make_certificate

WIDTH = 200_000
"""``Linear(WIDTH, 2)`` has 400 002 parameters: a dense exchange body of 1.6 MB."""
TAG = 16
"""Bytes of the Poly1305 tag that ends a stream-signed body."""
BIN32_HEADER = 5
"""A msgpack ``bin 32``: the marker ``0xc6`` and a 4-byte big-endian length."""


# ---------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    """A stream-signed exchange as a peer sends it: the head and the tagged body."""

    head: bytes
    body: bytes
    nonce: str

    @property
    def data_at(self) -> int:
        """Offset of the tensor bytes in the body (right after the ``bin``'s header)."""
        return self.bin_at + BIN32_HEADER

    @property
    def bin_at(self) -> int:
        """Offset of the large ``bin``'s marker (where the msgpack header ends)."""
        at = self.body.find(b"\xc6")
        declared = int.from_bytes(self.body[at + 1 : at + BIN32_HEADER], "big")
        assert at > 0 and declared == len(self.body) - at - BIN32_HEADER - TAG
        return at

    @property
    def tag_at(self) -> int:
        return len(self.body) - TAG


def exchange_request(
    vector: torch.Tensor, *, nonce: str | None = None, tag_key_of: str | None = None
) -> Request:
    """``POST /v1/exchange`` of ``vector``, stream-signed for the peer ``callee`` (a fresh
    nonce unless given). ``tag_key_of``: compute the tag under another nonce (a wrong tag)."""
    nonce = secrets.token_hex(16) if nonce is None else nonce
    body = envelope_body(vector)
    key = auth.body_key(SECRET, tag_key_of or nonce, "request")
    tagged = body + poly1305_tag(key, body)
    headers = auth.sign_stream_request(
        SECRET, "POST", "/v1/exchange", len(tagged), receiver="callee", nonce=nonce
    )
    return Request(head_of(headers, len(tagged)), tagged, nonce)


def head_of(headers: dict[str, str], length: int) -> bytes:
    lines = [
        "POST /v1/exchange HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/msgpack",
        f"Content-Length: {length}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def caller_vector(numel: int, seed: int = 7) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- raw connections


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def tag_ok(self, nonce: str) -> bool:
        """The answer ends with the Poly1305 tag of the rest, under the request's nonce."""
        key = auth.body_key(SECRET, nonce, "response", self.status)
        return poly1305_tag(key, self.body[:-TAG]) == self.body[-TAG:]

    def vector(self) -> torch.Tensor:
        obj = msgpack.unpackb(self.body[:-TAG], raw=False)
        return torch.frombuffer(bytearray(obj["payload"]["data"]), dtype=torch.float32)

    @property
    def closes(self) -> bool:
        return self.headers.get("connection", "").lower() == "close"


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def connected(address: str) -> AsyncIterator[Connection]:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()


async def send_pieces(
    writer: asyncio.StreamWriter, pieces: Iterable[bytes], *, pause_s: float = 0.0
) -> None:
    """Write each piece on its own, letting the loop (the server's too: it runs in this
    process) read it before the next one is written: one TCP segment, one read each.
    ``pause_s`` also gives the reader time to ask for the next bytes (a reader that paused
    its transport between a bin and the tag would otherwise get two pieces in one read)."""
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        for _ in range(3):
            await asyncio.sleep(0)
        if pause_s:
            await asyncio.sleep(pause_s)


async def read_answer(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> Answer:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    status, headers, _ = parse_answer(head)
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout_s)
    return Answer(status, headers, body)


async def closed_by_server(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bool:
    """Whether the server closes the connection (EOF or reset) within ``timeout_s``."""
    try:
        return await asyncio.wait_for(reader.read(1), timeout_s) == b""
    except ConnectionError:
        return True


def splits(body: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = [0, *sorted(set(cuts)), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(points) if b > a]


# ---------------------------------------------------------------------- served peers


@asynccontextmanager
async def callee(**kwargs: Any) -> AsyncIterator[Served]:
    """The callee every test talks to: peer ``callee``, seed 1, a 1.6 MB model."""
    async with served_peer("callee", seed=1, width=WIDTH, **kwargs) as served:
        await asyncio.sleep(0.002)  # requests signed after the millisecond it started
        yield served


async def slots_free(served: Served, timeout_s: float = 5.0) -> bool:
    """Whether every exchange slot is given back within ``timeout_s``."""
    state = served.runner.app[SERVER_STATE]  # type: ignore[attr-defined]
    for _ in range(int(timeout_s / 0.01)):
        if state.slots.in_use == 0:
            return True
        await asyncio.sleep(0.01)
    return False


async def exchange_answer(served: Served, request: Request) -> Answer:
    """``request`` in one write on a fresh connection, and its answer."""
    async with connected(served.address) as (reader, writer):
        writer.write(request.head + request.body)
        await writer.drain()
        return await read_answer(reader)


def expected_average(served: Served, vector: torch.Tensor) -> torch.Tensor:
    return (served.peer.flat.vector.detach().clone() + vector) / 2


def test_the_bodies_here_take_the_direct_path() -> None:
    """The premise of this file: its exchange bodies are large enough to be read directly."""
    request = exchange_request(caller_vector(2 * WIDTH + 2))
    headers = {"Content-Type": "application/msgpack"}
    assert len(request.body) >= DIRECT_BODY_BYTES
    assert can_take_over(headers, len(request.body))
    assert not can_take_over(headers, DIRECT_BODY_BYTES - 1)
    assert not can_take_over({"Transfer-Encoding": "chunked"}, len(request.body))
    assert not can_take_over({"Content-Encoding": "gzip"}, len(request.body))


# ---------------------------------------------------------------------- a bare connection


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait (polling the loop) until ``condition()`` holds; fail after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.002)):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"not within {timeout_s} s: {condition}")


class Owner(BaseProtocol):
    """The connection's owner as aiohttp is one: its body stream is fed what arrives until
    :func:`peer.transport.receive.take_over` switches the transport; after the hand-back, what
    arrives is kept in ``after`` (the next message's bytes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.stream = HttpStream(self, 1 << 16, loop=loop)
        self.after = bytearray()
        self.handed_back = False
        self.made = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.made.set()

    def data_received(self, data: bytes) -> None:
        if self.handed_back:
            self.after += data
        else:
            self.stream.feed_data(data)


@asynccontextmanager
async def owned_connection() -> AsyncIterator[tuple[Owner, asyncio.StreamWriter]]:
    loop = asyncio.get_running_loop()
    owners: list[Owner] = []

    def make() -> Owner:
        owners.append(Owner(loop))
        return owners[-1]

    server = await loop.create_server(make, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await until(lambda: bool(owners))
        await asyncio.wait_for(owners[0].made.wait(), 5)
        yield owners[0], writer
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_direct_body_reads_exactly_its_length_and_hands_the_rest_back() -> None:
    """Two large bins with small fields around them, the first 300 bytes fed to the
    owner's stream before the switch, the rest in odd pieces and glued to 4000 bytes of
    the next message: the object's bins are exact views of the arena, not one byte past
    the body is read (``overrun`` 0, ``remaining`` 0), and after :meth:`finish` the next
    message's bytes reach the owner untouched."""
    first = bytes(range(256)) * 2000 + b"first"
    second = bytes(reversed(range(256))) * 3000 + b"second"
    body = msgpack.packb({"a": first, "n": 7, "b": second, "s": "end"}, use_bin_type=True)
    after = b"POST /next HTTP/1.1\r\n" + b"x" * 3979
    async with owned_connection() as (owner, writer):
        writer.write(body[:300])
        await writer.drain()
        await until(lambda: owner.stream.total_bytes == 300)
        direct = take_over(owner.transport, owner, owner.stream, length=len(body))
        assert isinstance(direct, DirectBody)
        assert owner.transport is not None and owner.transport.get_protocol() is direct
        reading = asyncio.create_task(
            read_envelope_object(direct, length=len(body), cap=len(body), arena=None)
        )
        await send_pieces(writer, splits(body[300:], [1, 7, 513_000, 513_001, 600_000]))
        await send_pieces(writer, [after[:1000]])
        writer.write(after[1000:])
        obj, _ = await asyncio.wait_for(reading, 5)
        assert direct.remaining == 0 and direct.overrun == 0
        assert isinstance(obj["a"], memoryview) and isinstance(obj["b"], memoryview)
        assert bytes(obj["a"]) == first and bytes(obj["b"]) == second
        assert (obj["n"], obj["s"]) == (7, "end")
        owner.handed_back = True
        direct.finish(owner.stream, keep_alive=True)
        assert owner.transport.get_protocol() is owner
        assert owner.stream.is_eof()
        await until(lambda: len(owner.after) >= len(after))
        assert bytes(owner.after) == after


async def test_take_over_declines_a_body_already_complete() -> None:
    """A body aiohttp has fed whole (it came in the head's segment) is read through its
    stream as before: ``take_over`` returns None and the transport is untouched."""
    body = b"\xc4\x03abc"
    async with owned_connection() as (owner, writer):
        writer.write(body)
        await writer.drain()
        await until(lambda: owner.stream.total_bytes == len(body))
        assert take_over(owner.transport, owner, owner.stream, length=len(body)) is None
        assert owner.transport is not None and owner.transport.get_protocol() is owner
        assert take_over(None, owner, owner.stream, length=10) is None


# ---------------------------------------------------------------------- awkward splits


def _cuts(request: Request) -> dict[str, tuple[bytes, list[bytes]]]:
    """Per case: what goes with the head in its segment, then the body's other pieces."""
    body, b, d, t = request.body, request.bin_at, request.data_at, request.tag_at
    return {
        "head alone, body in one piece": (b"", [body]),
        "head with the first body byte": (body[:1], [body[1:]]),
        "head with the msgpack header": (body[:b], [body[b:]]),
        "head with the header and half the bin's length prefix": (body[: b + 3], [body[b + 3 :]]),
        "at the header/bin boundary": (b"", splits(body, [b])),
        "inside the bin's length prefix": (b"", splits(body, [b + 1, b + 2, b + 3, b + 4])),
        "right after the bin's header": (b"", splits(body, [d])),
        "at the tag's first byte": (b"", splits(body, [t, t + 1])),
        "every boundary at once": (b"", splits(body, [1, b, b + 2, d, d + 1, t, t + 1, t + 15])),
        "one byte at a time for 4 KiB": (
            b"",
            [body[i : i + 1] for i in range(4096)] + [body[4096:]],
        ),
        "the head and 4 KiB one byte at a time": (
            b"",
            [request.head[-1:]] + [body[i : i + 1] for i in range(4096)] + [body[4096:]],
        ),
    }


SPLIT_CASES = list(_cuts(exchange_request(torch.zeros(2 * WIDTH + 2))))


def pause_for(case: str) -> float:
    """A few ms between pieces, so each lands in a read of its own even where the reader
    paused in between; none where 4096 one-byte pieces go out (each still read alone)."""
    return 0.0 if "one byte" in case else 0.005


@pytest.mark.parametrize("case", SPLIT_CASES)
async def test_a_large_body_in_awkward_segments_is_averaged_as_if_sent_whole(case: str) -> None:
    """The same signed exchange, sent in one write to one callee and in ``case``'s pieces
    to its twin (same id, seed and model): the twin's model changes exactly as the first's
    and its answer is the same bytes, tag included (same nonce, same key)."""
    vector = caller_vector(2 * WIDTH + 2)
    nonce = secrets.token_hex(16)
    async with callee() as whole, callee() as split:
        assert model_bytes(whole.peer) == model_bytes(split.peer)
        expected = expected_average(whole, vector)
        request = exchange_request(vector, nonce=nonce)
        reference = await exchange_answer(whole, request)
        assert reference.status == 200, reference.body[:200]

        with_head, pieces = _cuts(request)[case]
        head = request.head
        if case == "the head and 4 KiB one byte at a time":
            head = head[:-1]  # its last byte goes first among the pieces
        async with connected(split.address) as (reader, writer):
            await send_pieces(writer, [head + with_head])
            await asyncio.sleep(0.02)  # the handler took the connection over meanwhile
            await send_pieces(writer, pieces, pause_s=pause_for(case))
            answer = await read_answer(reader)

        assert answer.status == 200, answer.body[:200]
        assert answer.tag_ok(nonce)
        assert answer.body == reference.body  # bit for bit, tag included
        assert model_bytes(split.peer) == model_bytes(whole.peer)
        torch.testing.assert_close(split.peer.flat.vector, expected, rtol=0, atol=0)
        torch.testing.assert_close(answer.vector(), expected, rtol=0, atol=0)
        assert await slots_free(split)


# ---------------------------------------------------------------------- short, long, slow


@pytest.mark.parametrize("sent", [0, 1, 100, 600_000, -TAG, -1])
async def test_a_short_body_is_refused_and_leaves_the_model(sent: int) -> None:
    """The connection ends (half-closed) before ``Content-Length`` bytes: no 200, the
    callee's model and membership as they were, the slot given back, the next exchange
    served."""
    async with callee() as served:
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2))
        cut = request.body[:sent]
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [request.head])
            await asyncio.sleep(0.02)
            await send_pieces(writer, [cut] if cut else [])
            writer.write_eof()
            try:
                answer: Answer | None = await read_answer(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                answer = None  # closed unanswered
        if answer is not None:
            assert 400 <= answer.status < 500, answer
        assert served.digest() == before
        assert await slots_free(served)
        vector = caller_vector(2 * WIDTH + 2, seed=8)
        expected = expected_average(served, vector)
        again = await exchange_answer(served, exchange_request(vector))
        assert again.status == 200
        torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)


async def test_a_body_cut_by_a_reset_is_refused_and_leaves_the_model() -> None:
    async with callee() as served:
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2))
        async with connected(served.address) as (_, writer):
            await send_pieces(writer, [request.head, request.body[:700_000]])
            transport = writer.transport
            transport.abort()  # an RST, not a FIN
        assert await slots_free(served)
        assert served.digest() == before
        vector = caller_vector(2 * WIDTH + 2, seed=8)
        again = await exchange_answer(served, exchange_request(vector))
        assert again.status == 200


async def test_a_request_glued_after_the_body_is_not_read_as_the_body() -> None:
    """Two large exchanges pipelined: the second's head and body glued after the first body
    in one segment. The first is read to exactly its ``Content-Length`` (nothing of the
    second lands in its arena: its answer is the average with the first vector alone), and
    the second is served in turn on the same connection (the parser is renewed)."""
    async with callee() as served:
        first, second = caller_vector(2 * WIDTH + 2, 1), caller_vector(2 * WIDTH + 2, 2)
        own = served.peer.flat.vector.detach().clone()
        after_first = (own + first) / 2
        after_second = (after_first + second) / 2
        one, two = exchange_request(first), exchange_request(second)
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [one.head + one.body[:1000]])
            await asyncio.sleep(0.02)
            await send_pieces(writer, [one.body[1000:-5], one.body[-5:] + two.head + two.body])
            answer_one = await read_answer(reader)
            assert answer_one.status == 200, answer_one.body[:200]
            assert answer_one.tag_ok(one.nonce)
            torch.testing.assert_close(answer_one.vector(), after_first, rtol=0, atol=0)
            assert not answer_one.closes
            answer_two = await read_answer(reader)
        assert answer_two.status == 200, answer_two.body[:200]
        assert answer_two.tag_ok(two.nonce)
        torch.testing.assert_close(answer_two.vector(), after_second, rtol=0, atol=0)
        torch.testing.assert_close(served.peer.flat.vector, after_second, rtol=0, atol=0)
        assert await slots_free(served)


async def test_bytes_past_the_content_length_are_not_taken_for_the_body() -> None:
    """A body followed by junk that is no HTTP request: the body is answered (its length
    was exact), the junk is then refused by the renewed parser (``400``) and the
    connection closed; the model took the first exchange only."""
    async with callee() as served:
        vector = caller_vector(2 * WIDTH + 2)
        expected = expected_average(served, vector)
        request = exchange_request(vector)
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [request.head])
            await asyncio.sleep(0.02)
            await send_pieces(writer, [request.body + b"\x00" * 5000])
            answer = await read_answer(reader)
            assert answer.status == 200, answer.body[:200]
            refusal = await read_answer(reader)
            assert refusal.status == 400
            assert await closed_by_server(reader)
        torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)
        assert await slots_free(served)


async def test_a_body_trickling_past_the_deadline_is_408_and_leaves_the_model() -> None:
    deadline_s = 0.5
    async with callee(limits=ServerLimits(body_timeout_s=deadline_s)) as served:
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2))
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [request.head, request.body[: request.data_at + 1000]])
            loop = asyncio.get_running_loop()
            started = loop.time()

            async def trickle() -> None:
                at = request.data_at + 1000
                with suppress(ConnectionError):
                    while at < len(request.body) - 1:
                        writer.write(request.body[at : at + 100])
                        at += 100
                        await asyncio.sleep(0.05)

            trickling = asyncio.create_task(trickle())
            try:
                answer = await read_answer(reader, timeout_s=5)
            finally:
                trickling.cancel()
            waited = loop.time() - started
        assert answer.status == 408, answer
        assert json.loads(answer.body)["error"] == "body_timeout"
        assert deadline_s * 0.9 <= waited < deadline_s + 3
        assert answer.closes  # the parser is out of step with the rest of that body
        assert served.digest() == before
        assert await slots_free(served)
        again = await exchange_answer(served, exchange_request(caller_vector(2 * WIDTH + 2, 9)))
        assert again.status == 200


async def test_a_bin_claiming_more_than_the_body_holds_is_refused_unread() -> None:
    """The bin's length prefix names more bytes than the body has left: ``400`` once the
    body's tag verifies (authentic, refused for its form), no tensor byte read into the
    arena, and the model as it was."""
    async with callee() as served:
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2))
        body = bytearray(request.body[: -auth.TAG_BYTES])
        at = request.bin_at + 1
        body[at : at + 4] = (len(request.body)).to_bytes(4, "big")
        body += poly1305_tag(auth.body_key(SECRET, request.nonce, "request"), bytes(body))
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [request.head, bytes(body)])
            answer = await read_answer(reader)
        assert answer.status == 400, answer
        assert json.loads(answer.body)["error"] == "malformed_body"
        assert served.digest() == before
        assert await slots_free(served)


async def test_interleaved_large_bodies_on_two_connections_stay_apart() -> None:
    """Two large exchanges whose pieces alternate on two connections: each body lands in
    its own arena; the callee averages them one after the other (in either order) and
    each answer is the model right after its own average."""
    async with callee() as served:
        own = served.peer.flat.vector.detach().clone()
        first, second = caller_vector(2 * WIDTH + 2, 1), caller_vector(2 * WIDTH + 2, 2)
        one, two = exchange_request(first), exchange_request(second)
        async with connected(served.address) as (r1, w1), connected(served.address) as (r2, w2):
            await send_pieces(w1, [one.head])
            await send_pieces(w2, [two.head])
            await asyncio.sleep(0.02)
            step = 100_003
            for at in range(0, len(one.body), step):
                await send_pieces(w1, [one.body[at : at + step]])
                await send_pieces(w2, [two.body[at : at + step]])
            answers = await asyncio.gather(read_answer(r1), read_answer(r2))
        assert [a.status for a in answers] == [200, 200]
        got_one, got_two = (a.vector() for a in answers)
        one_first = torch.equal(got_one, (own + first) / 2)
        if one_first:
            torch.testing.assert_close(got_two, (got_one + second) / 2, rtol=0, atol=0)
        else:
            torch.testing.assert_close(got_two, (own + second) / 2, rtol=0, atol=0)
            torch.testing.assert_close(got_one, (got_two + first) / 2, rtol=0, atol=0)
        final = got_two if one_first else got_one
        torch.testing.assert_close(served.peer.flat.vector, final, rtol=0, atol=0)


async def test_a_digest_signed_large_exchange_is_read_directly_and_checked() -> None:
    """A digest-signed body (``X-Gossipnet-Signature`` over its SHA-256, checked after the
    body) in awkward pieces: the digest of the bytes as they landed matches, the exchange
    is served; one flipped tensor byte is ``401`` and leaves the model."""
    async with callee() as served:
        vector = caller_vector(2 * WIDTH + 2)
        expected = expected_average(served, vector)
        body = envelope_body(vector)
        for flip in (True, False):
            sent = body[:-100] + bytes([body[-100] ^ 1]) + body[-99:] if flip else body
            headers = auth.sign_request(SECRET, "POST", "/v1/exchange", body, receiver="callee")
            head = head_of(headers, len(sent))
            before = served.digest()
            async with connected(served.address) as (reader, writer):
                first, *pieces = splits(sent, [3, 79, 81, 5000, len(sent) - 1])
                await send_pieces(writer, [head + first, *pieces])
                answer = await read_answer(reader)
            if flip:
                assert answer.status == 401, answer
                assert served.digest() == before
                continue
            assert answer.status == 200, answer.body[:200]
            signature = {auth.RESPONSE_SIGNATURE_HEADER: answer.headers["x-gossipnet-signature"]}
            auth.verify_response(SECRET, 200, auth.request_nonce(headers), answer.body, signature)
            obj = msgpack.unpackb(answer.body)
            got = torch.frombuffer(bytearray(obj["payload"]["data"]), dtype=torch.float32)
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)


async def test_the_state_of_a_large_model_is_read_directly_by_the_client() -> None:
    async with callee() as served, client() as peer_client:
        reply = await peer_client.state(served.address, codecs={"none"}, receiver="callee")
        got = DenseCodec().decode(reply.payload, served.peer.spec)
        assert got.numpy().tobytes() == model_bytes(served.peer)


async def test_sync_rounds_mix_large_messages_read_into_fresh_buffers() -> None:
    """Sync mode keeps received messages until the round's combine, so each is read
    directly into a buffer of its own (no reused arena): two peers' D-PSGD round over
    1.6 MB messages leaves both at the pair's average."""
    async with (
        served_peer("a", seed=0, width=WIDTH, mode="sync") as a,
        served_peer(
            "b", seed=1, width=WIDTH, mode="sync", join=(a.peer.address,), fetch_state=False
        ) as b,
    ):
        average = (a.peer.flat.vector + b.peer.flat.vector) / 2
        done = await asyncio.wait_for(asyncio.gather(a.peer.gossip(), b.peer.gossip()), 10)
        assert list(done) == [1, 1]
        torch.testing.assert_close(a.peer.flat.vector, average)
        torch.testing.assert_close(b.peer.flat.vector, average)


# ---------------------------------------------------------------------- connection reuse


async def test_large_exchanges_share_one_keep_alive_connection() -> None:
    """Three large exchanges written one after the other on one raw HTTP/1.1 connection,
    a small request between them: each is answered correctly and the connection stays open
    (the server renews its parser after a direct read, ``JsonErrorRequestHandler.
    renew_parser``); a refusal after a direct read (a valid msgpack body that is no valid
    exchange) keeps it too."""
    async with callee() as served:
        async with connected(served.address) as (reader, writer):
            for seed in (1, 2, 3):
                if seed == 2:
                    await send_pieces(writer, [b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"])
                    status = await read_answer(reader)
                    assert status.status == 200 and json.loads(status.body)["id"] == "callee"
                vector = caller_vector(2 * WIDTH + 2, seed)
                expected = expected_average(served, vector)
                request = exchange_request(vector)
                await send_pieces(writer, [request.head + request.body[:10], request.body[10:]])
                answer = await read_answer(reader)
                assert answer.status == 200, answer.body[:200]
                assert answer.tag_ok(request.nonce)
                assert not answer.closes
                torch.testing.assert_close(answer.vector(), expected, rtol=0, atol=0)
                torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)
            before = served.digest()
            wrong = exchange_request(caller_vector(2 * WIDTH + 3))  # one value too many
            await send_pieces(writer, [wrong.head, wrong.body])
            refusal = await read_answer(reader)
            assert refusal.status == 422, refusal
            assert b"shape_mismatch" in refusal.body
            assert not refusal.closes
            assert served.digest() == before
            vector = caller_vector(2 * WIDTH + 2, 4)
            expected = expected_average(served, vector)
            request = exchange_request(vector)
            await send_pieces(writer, [request.head + request.body])
            answer = await read_answer(reader)
            assert answer.status == 200
            torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)
        assert await slots_free(served)


async def test_a_peer_client_reuses_its_connection_after_a_direct_answer() -> None:
    """``PeerClient`` reads a large answer directly, gives its connection a fresh parser and
    pools it: its next exchange goes over the same connection and is answered correctly."""
    async with callee() as served:
        server = served.runner.server
        assert server is not None
        codecs = served.peer.codecs
        async with PeerClient(
            secret=SECRET, timeout_s=5.0, max_body_bytes=served.peer.max_body_bytes
        ) as client:
            handlers = []
            for seed in (1, 2, 3):
                vector = caller_vector(2 * WIDTH + 2, seed)
                expected = expected_average(served, vector)
                envelope = Envelope(
                    sender="caller",
                    round=0,
                    step=0,
                    codec="none",
                    payload=DenseCodec().encode(vector),
                )
                reply = await client.exchange(
                    served.address, envelope, codecs=codecs, receiver="callee"
                )
                got = codecs[reply.codec].decode(reply.payload, served.peer.spec)
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
                torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)
                handlers.append(list(server.connections))
            assert len(handlers[0]) == 1
            assert handlers[0] == handlers[1] == handlers[2]  # the same connection each time


async def test_the_client_reconnects_after_a_neighbour_closes_behind_a_large_answer() -> None:
    """A neighbour that answers a large body with ``Connection: close`` and closes: the
    client's next call opens a new connection, and both answers are read correctly."""
    answers = [caller_vector(2 * WIDTH + 2, seed) for seed in (31, 32)]

    async def script(writer: asyncio.StreamWriter, headers: dict[str, str], index: int) -> None:
        head, body = answer_bytes(answers[index], headers)
        head = head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        writer.write(head + body)
        await writer.drain()
        writer.close()

    async with answering(script) as (address, heard), client() as peer_client:
        for expected in answers:
            got = await call(peer_client, address, caller_vector(2 * WIDTH + 2))
            assert got.numpy().tobytes() == expected.numpy().tobytes()
        assert [connection for _, connection in heard.requests] == [0, 1]


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_a_chunked_large_body_is_read_through_aiohttp_as_before() -> None:
    """Chunked bodies have no ``Content-Length``: never taken over (``can_take_over``), read
    through aiohttp's stream (``ChunkSource``), and the exchange is served."""
    async with callee(secret=None) as served:
        vector = caller_vector(2 * WIDTH + 2)
        expected = expected_average(served, vector)
        body = envelope_body(vector)
        head = (
            b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunks = [
            b"%x\r\n%s\r\n" % (len(piece), piece)
            for piece in splits(body, range(100_000, len(body), 100_000))
        ]
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [head, *chunks, b"0\r\n\r\n"])
            answer = await read_answer(reader)
        assert answer.status == 200, answer.body[:200]
        obj = msgpack.unpackb(answer.body)
        got = torch.frombuffer(bytearray(obj["payload"]["data"]), dtype=torch.float32)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)


# ---------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI to make a test certificate")
    return make_certificate(Path(tmp_path_factory.mktemp("tls")))


async def test_a_large_exchange_over_tls_averages_both_models(
    certificate: tuple[str, str],
) -> None:
    """Two real peers over mutual TLS: the request and the answer (1.6 MB each) are read
    directly from the TLS transport (decrypted straight into the arena); both models end
    as the pair's average, and a second round reuses the connection."""
    cert, key = certificate
    tls = {"tls_cert": cert, "tls_key": key, "tls_ca": cert}
    async with (
        served_peer("a", seed=0, width=WIDTH, **tls) as a,
        served_peer(
            "b", seed=1, width=WIDTH, join=(a.peer.address,), fetch_state=False, **tls
        ) as b,
    ):
        for _ in range(2):
            average = (a.peer.flat.vector + b.peer.flat.vector) / 2
            assert await b.peer.gossip() == 1
            torch.testing.assert_close(a.peer.flat.vector, average, rtol=0, atol=0)
            torch.testing.assert_close(b.peer.flat.vector, average, rtol=0, atol=0)
        assert b.peer.health.exchanges_failed == 0


async def test_over_tls_a_trickling_or_cut_body_is_refused_and_the_next_is_served(
    certificate: tuple[str, str],
) -> None:
    """Over TLS (the peer's own server, mutual TLS, body deadline 0.5 s): a large body that
    trickles past the deadline is ``408``, one cut by the sender's close is refused; the
    model is untouched and the next exchange over TLS is served."""
    cert, key = certificate
    tls = {"tls_cert": cert, "tls_key": key, "tls_ca": cert}
    context = client_ssl_context(cafile=cert, certfile=cert, keyfile=key)
    async with callee(request_timeout_s=0.5, **tls) as served:
        address = served.peer.address
        assert address is not None
        host, port = address.split(":")
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2))
        reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
        try:
            await send_pieces(writer, [request.head, request.body[:300_000]])
            answer = await read_answer(reader)  # nothing more is sent: the deadline passes
        finally:
            writer.close()
        assert answer.status == 408, answer
        reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
        cut = exchange_request(caller_vector(2 * WIDTH + 2))
        try:
            await send_pieces(writer, [cut.head])
            await asyncio.sleep(0.05)  # the handler took the connection over
            await send_pieces(writer, [cut.body[:300_000]])
            writer.close()
            await writer.wait_closed()
        except ConnectionError:
            pass
        assert await slots_free(served)
        assert served.digest() == before
        vector = caller_vector(2 * WIDTH + 2, seed=5)
        expected = expected_average(served, vector)
        again = exchange_request(vector)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
        try:
            await send_pieces(writer, [again.head, again.body[:5000], again.body[5000:]])
            answer = await read_answer(reader)
        finally:
            writer.close()
        assert answer.status == 200, answer.body[:200]
        assert answer.tag_ok(again.nonce)
        torch.testing.assert_close(served.peer.flat.vector, expected, rtol=0, atol=0)


# ---------------------------------------------------------------------- signed swarms


async def test_a_wrong_tag_in_the_last_byte_is_401_and_leaves_the_model() -> None:
    async with callee() as served:
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2))
        flipped = request.body[:-1] + bytes([request.body[-1] ^ 1])
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [request.head])
            await asyncio.sleep(0.02)
            await send_pieces(writer, [flipped[:-1], flipped[-1:]])
            answer = await read_answer(reader)
        assert answer.status == 401, answer
        assert b"unauthorized" in answer.body
        assert served.digest() == before
        assert await slots_free(served)


async def test_a_tag_made_under_another_nonce_is_401() -> None:
    async with callee() as served:
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2), tag_key_of="cd" * 16)
        answer = await exchange_answer(served, request)
        assert answer.status == 401
        assert served.digest() == before


async def test_a_signed_body_cut_before_its_tag_is_refused_and_leaves_the_model() -> None:
    """The signed length is the whole body's, the sender stops before the tag's last byte:
    refused (the connection closes unanswered or with a 4xx), nothing applied."""
    async with callee() as served:
        before = served.digest()
        request = exchange_request(caller_vector(2 * WIDTH + 2))
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [request.head, request.body[:-1]])
            writer.write_eof()
            try:
                answer: Answer | None = await read_answer(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                answer = None
        if answer is not None:
            assert 400 <= answer.status < 500
        assert served.digest() == before
        assert await slots_free(served)


async def test_a_refused_body_read_whole_does_not_hold_its_connection() -> None:
    """A 401 after the whole body was read: the connection is either kept usable (the
    parser renewed, the next exchange on it served) or closed at once, not held open."""
    async with callee() as served:
        request = exchange_request(caller_vector(2 * WIDTH + 2), tag_key_of="cd" * 16)
        async with connected(served.address) as (reader, writer):
            await send_pieces(writer, [request.head, request.body])
            answer = await read_answer(reader)
            assert answer.status == 401
            if answer.closes:
                assert await closed_by_server(reader, timeout_s=2.0)
            else:
                good = exchange_request(caller_vector(2 * WIDTH + 2))
                await send_pieces(writer, [good.head + good.body])
                assert (await read_answer(reader)).status == 200


# ---------------------------------------------------------------------- the caller's side


@dataclass
class Heard:
    """What a raw answering server was sent: one ``(head, body)`` per request, and the
    connection each came on (its index)."""

    requests: list[tuple[dict[str, str], int]]


AnswerScript = Callable[[asyncio.StreamWriter, dict[str, str], int], Awaitable[None]]
"""Writes the answer to one request: ``(writer, request headers, request index)``."""


@asynccontextmanager
async def answering(script: AnswerScript) -> AsyncIterator[tuple[str, Heard]]:
    """A raw HTTP/1.1 server on 127.0.0.1 that reads each request whole (head and
    ``Content-Length`` body, several per connection) and lets ``script`` answer it."""
    heard = Heard([])
    connections = 0
    writers: list[asyncio.StreamWriter] = []
    tasks: list[asyncio.Task[Any]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connection = connections
        connections += 1
        writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                _, headers = _request_headers(head)
                if headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await reader.readexactly(int(headers.get("content-length", "0")))
                heard.requests.append((headers, connection))
                await script(writer, headers, len(heard.requests) - 1)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", heard
    finally:
        server.close()
        for writer in writers:
            writer.close()
        for task in tasks:
            task.cancel()  # a script still stalling
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


def _request_headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    pairs = (line.split(":", 1) for line in lines[1:] if line)
    return lines[0], {k.strip().lower(): v.strip() for k, v in pairs}


def answer_bytes(vector: torch.Tensor, headers: dict[str, str]) -> tuple[bytes, bytes]:
    """A callee's 200 answer to a stream-signed request: ``(head, tagged body)``."""
    body = envelope_body(vector, sender="callee")
    nonce = auth.request_nonce({"Authorization": headers["authorization"]})
    tagged = body + poly1305_tag(auth.body_key(SECRET, nonce, "response", 200), body)
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\n"
        f"Content-Length: {len(tagged)}\r\n\r\n"
    ).encode()
    return head, tagged


def client(timeout_s: float = 5.0) -> PeerClient:
    return PeerClient(secret=SECRET, timeout_s=timeout_s, max_body_bytes=4 * (2 * WIDTH + 2) * 4)


async def call(peer_client: PeerClient, address: str, vector: torch.Tensor) -> torch.Tensor:
    """One exchange of ``vector`` with the peer ``callee`` at ``address``; its answer."""
    codecs = {"none": DenseCodec()}
    envelope = Envelope(
        sender="caller", round=0, step=0, codec="none", payload=DenseCodec().encode(vector)
    )
    reply = await peer_client.exchange(address, envelope, codecs=codecs, receiver="callee")
    return codecs[reply.codec].decode(reply.payload, ModelSpec(numel=vector.numel()))


@pytest.mark.parametrize("case", SPLIT_CASES)
async def test_a_large_answer_in_awkward_segments_is_read_exactly(case: str) -> None:
    answer = caller_vector(2 * WIDTH + 2, seed=11)

    async def script(writer: asyncio.StreamWriter, headers: dict[str, str], index: int) -> None:
        head, body = answer_bytes(answer, headers)
        as_request = Request(head, body, "")
        with_head, pieces = _cuts(as_request)[case]
        if case == "the head and 4 KiB one byte at a time":
            head = head[:-1]
        await send_pieces(writer, [head + with_head])
        await asyncio.sleep(0.02)
        await send_pieces(writer, pieces, pause_s=pause_for(case))

    async with answering(script) as (address, _), client() as peer_client:
        got = await call(peer_client, address, caller_vector(2 * WIDTH + 2))
        assert got.numpy().tobytes() == answer.numpy().tobytes()


async def test_a_stalled_answer_fails_within_the_calls_timeout() -> None:
    """A neighbour sends the head and half a large answer, then nothing: the call fails
    (``PeerUnavailable``) at its total timeout, the direct read included."""

    async def script(writer: asyncio.StreamWriter, headers: dict[str, str], index: int) -> None:
        head, body = answer_bytes(caller_vector(2 * WIDTH + 2), headers)
        writer.write(head + body[: len(body) // 2])
        await asyncio.sleep(30)

    timeout_s = 1.0
    async with answering(script) as (address, _), client(timeout_s) as peer_client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PeerUnavailable):
            await call(peer_client, address, caller_vector(2 * WIDTH + 2))
        assert loop.time() - started < timeout_s + 2


@pytest.mark.parametrize("kept", [0, 100, 1_000_000, -TAG, -1])
async def test_a_cut_answer_is_a_typed_failure(kept: int) -> None:
    """The neighbour closes the connection inside a large answer's body: the call raises a
    typed error (a broken-off body or an unavailable neighbour), never a result."""

    async def script(writer: asyncio.StreamWriter, headers: dict[str, str], index: int) -> None:
        head, body = answer_bytes(caller_vector(2 * WIDTH + 2), headers)
        writer.write(head + body[:kept])
        await writer.drain()
        writer.close()

    async with answering(script) as (address, _), client() as peer_client:
        with pytest.raises((PeerUnavailable, ProtocolError)):
            await call(peer_client, address, caller_vector(2 * WIDTH + 2))


async def test_a_wrong_answer_tag_is_unauthorized() -> None:
    async def script(writer: asyncio.StreamWriter, headers: dict[str, str], index: int) -> None:
        head, body = answer_bytes(caller_vector(2 * WIDTH + 2), headers)
        writer.write(head + body[:-1] + bytes([body[-1] ^ 1]))
        await writer.drain()

    async with answering(script) as (address, _), client() as peer_client:
        with pytest.raises(Unauthorized):
            await call(peer_client, address, caller_vector(2 * WIDTH + 2))


async def test_an_answer_glued_after_an_answer_is_never_taken_as_authentic() -> None:
    """A neighbour writes a large answer and, glued to it, a second complete answer nobody
    asked for yet. The first call gets the first answer, read to exactly its
    ``Content-Length``. What the code does with the early one: the connection went back to
    the pool with its bytes unread, and the next call over it reads them as its answer;
    their tag is bound to the first request's nonce, so that call is refused
    ``Unauthorized`` (a typed failure, at once) and never returns the early vector."""
    first, early, second = (caller_vector(2 * WIDTH + 2, seed) for seed in (21, 22, 23))

    async def script(writer: asyncio.StreamWriter, headers: dict[str, str], index: int) -> None:
        head, body = answer_bytes(first if index == 0 else second, headers)
        glued = b"".join(answer_bytes(early, headers)) if index == 0 else b""
        writer.write(head + body + glued)
        await writer.drain()

    async with answering(script) as (address, _), client() as peer_client:
        got = await call(peer_client, address, caller_vector(2 * WIDTH + 2))
        assert got.numpy().tobytes() == first.numpy().tobytes()
        try:
            got = await asyncio.wait_for(
                call(peer_client, address, caller_vector(2 * WIDTH + 2)), 8
            )
        except (PeerUnavailable, ProtocolError) as error:
            assert isinstance(error, Unauthorized), error
        else:
            assert got.numpy().tobytes() == second.numpy().tobytes()
