"""``peer.protocol.growing.GrowingBuffer``: a body streamed while a worker thread still writes it.

The rule under test (peer/protocol/growing.py): the event loop sends a slice only once the worker
published it (``advance``); a worker that fails publishes its error instead, the body
writer raises ``ProducerFailed`` before the body is complete, and a reader that
authenticates or length-checks the body applies nothing. The last tests run it end to end:
a callee whose averaging worker fails mid-answer (its own model is non-finite) leaves both
models as they were and the caller records a failed exchange.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgpack
import pytest
import torch
from aiohttp import web

from peer.node.pairwise import STREAM_CHUNK_BYTES
from peer.protocol.growing import GrowingBuffer, ProducerFailed, fill_in_thread
from peer.protocol.wire import Envelope, pack_envelope
from peer.transport.body import CHUNK_BYTES, MSGPACK, EnvelopeBody

from .conftest import model_bytes
from .test_server import parse_answer, served_peer

WAIT_S = 5.0


def growing_of(nbytes: int) -> tuple[bytearray, GrowingBuffer]:
    data = bytearray(nbytes)
    return data, GrowingBuffer(memoryview(data), asyncio.get_running_loop())


async def test_ready_waits_until_the_worker_advanced_past_it() -> None:
    data, growing = growing_of(1000)
    gate = threading.Event()

    def worker() -> None:
        data[:100] = b"a" * 100
        growing.advance(100)
        gate.wait(WAIT_S)
        data[100:] = b"b" * 900
        growing.advance(1000)

    fill_in_thread(growing, worker)
    await asyncio.wait_for(growing.ready(100), WAIT_S)
    assert growing.written == 100
    waiting = asyncio.create_task(growing.ready(101))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # byte 101 is not written yet
    gate.set()
    await asyncio.wait_for(waiting, WAIT_S)
    assert growing.written == 1000
    assert bytes(growing.view) == b"a" * 100 + b"b" * 900
    await asyncio.wait_for(growing.settled(), WAIT_S)


async def test_ready_of_nothing_returns_and_past_the_end_is_refused() -> None:
    _, growing = growing_of(10)
    await asyncio.wait_for(growing.ready(0), WAIT_S)
    with pytest.raises(ValueError, match="past the buffer"):
        await growing.ready(11)


async def test_advance_never_goes_back_nor_past_the_end() -> None:
    _, growing = growing_of(10)
    growing.advance(8)
    growing.advance(3)
    await asyncio.wait_for(growing.ready(8), WAIT_S)
    assert growing.written == 8
    growing.advance(50)
    await asyncio.wait_for(growing.ready(10), WAIT_S)
    assert growing.written == 10


async def test_a_failed_worker_raises_producer_failed_with_its_error() -> None:
    data, growing = growing_of(1000)

    def worker() -> None:
        data[:100] = b"a" * 100
        growing.advance(100)
        raise RuntimeError("the average is not finite")

    task = fill_in_thread(growing, worker)
    with pytest.raises(ProducerFailed) as raised:
        await asyncio.wait_for(growing.ready(1000), WAIT_S)
    assert isinstance(raised.value.__cause__, RuntimeError)
    await asyncio.wait_for(growing.settled(), WAIT_S)  # the writer reported it: not raised
    assert isinstance(task.exception(), RuntimeError)


async def test_release_waits_for_the_worker_before_the_memory_is_reused() -> None:
    """``when_released`` callbacks (a pool taking the buffer back) run only once the body
    is done *and* the worker returned, never while the worker may still write."""
    _, growing = growing_of(100)
    gate = threading.Event()
    released: list[str] = []
    growing.when_released(lambda: released.append("given back"))

    def worker() -> None:
        gate.wait(WAIT_S)
        growing.advance(100)

    fill_in_thread(growing, worker)
    growing.release()
    await asyncio.sleep(0.05)
    assert released == []  # the worker still runs
    gate.set()
    await asyncio.wait_for(growing.settled(), WAIT_S)
    await asyncio.sleep(0)
    assert released == ["given back"]
    growing.release()
    assert released == ["given back"]  # once


async def test_release_without_a_worker_runs_at_once() -> None:
    _, growing = growing_of(10)
    released: list[int] = []
    growing.when_released(lambda: released.append(1))
    growing.release()
    assert released == [1]


async def test_two_readers_waiting_at_once_are_both_woken() -> None:
    _, growing = growing_of(100)
    first = asyncio.create_task(growing.ready(10))
    second = asyncio.create_task(growing.ready(20))
    await asyncio.sleep(0)
    growing.advance(20)
    done, _ = await asyncio.wait([first, second], timeout=1.0)
    for task in (first, second):
        task.cancel()
    assert done == {first, second}


# ---------------------------------------------------------------------- the body writer


def envelope_object(data: memoryview | GrowingBuffer) -> dict[str, object]:
    return {"v": 2, "sender": "x", "payload": {"codec": "none", "dtype": "<f4", "data": data}}


async def test_an_envelope_over_a_growing_buffer_is_the_bytes_it_ends_with() -> None:
    nbytes = 3 * CHUNK_BYTES + 5
    data, growing = growing_of(nbytes)
    body = EnvelopeBody(envelope_object(growing))
    final = bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256)

    def worker() -> None:
        for start in range(0, nbytes, 1000_000):
            end = min(nbytes, start + 1000_000)
            data[start:end] = final[start:end]
            growing.advance(end)

    expected = msgpack.packb(envelope_object(memoryview(final)), use_bin_type=True)
    assert body.size == len(expected)  # known before a byte is written (Content-Length)
    fill_in_thread(growing, worker)
    assert await asyncio.wait_for(body.as_bytes(), WAIT_S) == expected
    with pytest.raises(ValueError, match="streamed, not packed"):
        pack_envelope(
            Envelope(sender="x", round=0, step=0, codec="none", payload={"data": growing})
        )


@asynccontextmanager
async def serving(body: EnvelopeBody, failures: list[ProducerFailed]) -> AsyncIterator[str]:
    """A real aiohttp server answering ``GET /`` with ``body`` as the peer's server writes
    an answer: headers with its ``Content-Length``, the body, and on ``ProducerFailed``
    the connection aborted (its ``failures`` collected)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = MSGPACK
        response.content_length = body.size
        writer = await response.prepare(request)
        assert writer is not None
        try:
            await body.write(writer)
            await response.write_eof()
        except ProducerFailed as error:
            failures.append(error)
            assert request.transport is not None
            request.transport.abort()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def fetch_head(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """A raw ``GET /`` and the answer's ``Content-Length``."""
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    status, headers, _ = parse_answer(head)
    assert status == 200
    return reader, writer, int(headers["content-length"])


async def test_the_written_part_is_sent_while_the_worker_still_writes() -> None:
    """The first slice reaches the reader while the worker is held before the rest."""
    nbytes = 3 * CHUNK_BYTES
    data, growing = growing_of(nbytes)
    gate = threading.Event()

    def worker() -> None:
        data[:CHUNK_BYTES] = b"\x01" * CHUNK_BYTES
        growing.advance(CHUNK_BYTES)
        gate.wait(WAIT_S)
        data[CHUNK_BYTES:] = b"\x02" * (nbytes - CHUNK_BYTES)
        growing.advance(nbytes)

    body = EnvelopeBody(envelope_object(growing))
    header = body.pieces[0]  # the packed msgpack header, up to the bin's length
    assert isinstance(header, bytes)
    failures: list[ProducerFailed] = []
    async with serving(body, failures) as address:
        fill_in_thread(growing, worker)
        reader, writer, length = await fetch_head(address)
        try:
            start = await asyncio.wait_for(reader.readexactly(len(header) + CHUNK_BYTES), WAIT_S)
            assert start.endswith(b"\x01" * CHUNK_BYTES)
            assert growing.written == CHUNK_BYTES  # the worker is still held
            gate.set()
            rest = await asyncio.wait_for(reader.readexactly(length - len(start)), WAIT_S)
        finally:
            writer.close()
    assert rest == b"\x02" * (nbytes - CHUNK_BYTES)
    assert failures == []


async def test_a_worker_failing_mid_body_cuts_the_body_short() -> None:
    """The writer raises ``ProducerFailed`` after the slices that were ready; the reader
    gets fewer than ``Content-Length`` bytes and the connection's end."""
    nbytes = 3 * CHUNK_BYTES
    data, growing = growing_of(nbytes)

    def worker() -> None:
        data[:CHUNK_BYTES] = b"\x01" * CHUNK_BYTES
        growing.advance(CHUNK_BYTES)
        raise ValueError("own contains NaN or Inf")

    body = EnvelopeBody(envelope_object(growing))
    header = body.pieces[0]
    assert isinstance(header, bytes)
    ready_part = header + b"\x01" * CHUNK_BYTES
    failures: list[ProducerFailed] = []
    async with serving(body, failures) as address:
        fill_in_thread(growing, worker)
        reader, writer, length = await fetch_head(address)
        try:
            received = await asyncio.wait_for(reader.read(), WAIT_S)
        except ConnectionResetError:
            received = b""
        finally:
            writer.close()
    assert len(received) < length
    assert ready_part.startswith(received)  # at most what was ready, then the cut
    assert len(failures) == 1 and isinstance(failures[0].__cause__, ValueError)


# ---------------------------------------------------------------------- a real exchange

WIDTH = 550_000
"""``Linear(WIDTH, 2)``: 1 100 002 float32 parameters (4.4 MB), so the callee's streamed
average has two chunks of ``peer.node.pairwise.STREAM_CHUNK_BYTES``: the first is sent before
the second fails."""


async def test_a_callee_whose_average_fails_mid_answer_changes_no_model() -> None:
    """The callee's own model is non-finite in its last value: its averaging worker
    publishes the first chunk, then raises (the mean rule refuses a non-finite own vector).
    The answer's headers and first chunk are out; the body is cut. The caller applies
    nothing and records a failed exchange; the callee keeps its model as it was; the
    callee's slot is given back and, its model repaired, the next exchange succeeds."""
    assert (2 * WIDTH + 2) * 4 > STREAM_CHUNK_BYTES
    async with (
        served_peer("callee", seed=1, width=WIDTH) as callee,
        served_peer(
            "caller", seed=2, width=WIDTH, join=(callee.peer.address,), fetch_state=False
        ) as caller,
    ):
        with callee.peer.lock, torch.no_grad():
            callee.peer.flat.vector[-1] = float("nan")
        callee_before, caller_before = model_bytes(callee.peer), model_bytes(caller.peer)

        assert await caller.peer.gossip() == 0

        assert model_bytes(caller.peer) == caller_before
        assert model_bytes(callee.peer) == callee_before
        assert caller.peer.health.exchanges_failed == 1
        assert caller.peer.health.exchanges_ok == 0
        failed = caller.peer.metrics.registry.get_sample_value(
            "gossipnet_exchanges_total", {"role": "caller", "outcome": "failed"}
        )
        assert failed == 1.0

        with callee.peer.lock, torch.no_grad():
            callee.peer.flat.vector[-1] = 0.0
        average = (callee.peer.flat.vector + caller.peer.flat.vector) / 2
        assert await caller.peer.gossip() == 1
        torch.testing.assert_close(callee.peer.flat.vector, average, rtol=0, atol=0)
        torch.testing.assert_close(caller.peer.flat.vector, average, rtol=0, atol=0)
