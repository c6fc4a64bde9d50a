"""A peer's server admits within its bounds (``peer.transport.admission``): exchange slots, the
unauthenticated byte budget, and the limits' validation; slots come back however a request
ends (real servers on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from peer.node.peer import Peer
from peer.protocol import auth
from peer.protocol.errors import Busy, Overloaded
from peer.protocol.wire import Envelope
from peer.transport.admission import (
    MAX_JSON_BYTES,
    ByteBudget,
    LimitError,
    ServerLimits,
    Slots,
    default_max_connections,
)
from peer.transport.client import RemoteRefused
from peer.transport.server import SERVER_STATE

from .conftest import SECRET, started_peer
from .test_server import envelope_body, good, served_peer


async def _call(caller: Peer, callee: Peer) -> Envelope:
    assert callee.address is not None
    envelope = caller.ctx.envelope(caller.flat.vector.detach())
    assert caller.client is not None  # started
    return await caller.client.exchange(callee.address, envelope, codecs=caller.codecs)


async def test_excess_exchanges_get_409_busy_and_the_slot_frees() -> None:
    # A sync peer that never starts a round holds each caller until its deadline, so
    # the first exchange occupies the only slot for a while.
    async with (
        started_peer("a", mode="sync", round_deadline_s=1.5, max_concurrent_exchanges=1) as a,
        started_peer("b", seed=1, mode="sync") as b,
        started_peer("c", seed=2, mode="sync") as c,
    ):
        first = asyncio.create_task(_call(b, a))
        await asyncio.sleep(0.3)
        with pytest.raises(RemoteRefused) as refused:
            await _call(c, a)
        assert refused.value.status == 409 and refused.value.code == "busy"
        assert "the bound is 1" in refused.value.detail
        reply = await first  # the held exchange completes normally
        assert reply.sender == "a"
        again = await asyncio.wait_for(_call(c, a), 5)  # the slot is free again
        assert again.sender == "a"
        assert (
            a.metrics.registry.get_sample_value("gossipnet_request_errors_total", {"code": "busy"})
            == 1
        )


async def test_concurrent_callers_up_to_the_bound_are_all_served() -> None:
    async with started_peer(
        "a", mode="sync", round_deadline_s=1.0, max_concurrent_exchanges=3
    ) as a:
        async with (
            started_peer("b", seed=1) as b,
            started_peer("c", seed=2) as c,
            started_peer("d", seed=3) as d,
        ):
            replies = await asyncio.gather(*(_call(p, a) for p in (b, c, d)))
        assert [r.sender for r in replies] == ["a", "a", "a"]


@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")
async def test_an_answer_nobody_reads_holds_its_slot_only_until_the_deadline() -> None:
    """The answer is written while its slot is held: a caller that never reads an answer
    larger than the socket buffers keeps the slot until the body deadline cuts the
    connection, and then the slot is free again."""
    async with served_peer(
        "callee",
        width=1 << 21,  # 4M parameters: a 16 MB answer
        secret=None,
        max_concurrent_exchanges=1,
        request_timeout_s=1.5,
    ) as served:
        slots = served.runner.app[SERVER_STATE].slots  # type: ignore[attr-defined]
        host, port = served.address.split(":")
        body = envelope_body(good(served.peer))
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        await writer.drain()
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not slots.in_use and loop.time() - start < 10:
            await asyncio.sleep(0.01)
        assert slots.in_use == 1
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{served.address}/v1/status") as response,
        ):
            assert response.status == 200  # the event loop is free meanwhile
        assert slots.in_use == 1  # the unread answer still holds it
        while slots.in_use and loop.time() - start < 10:
            await asyncio.sleep(0.05)
        assert slots.in_use == 0  # freed by the 1.5 s deadline (the test never reads)
        assert loop.time() - start < 6
        try:
            got = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:
            got = b""
        assert len(got) < served.peer.spec.num_bytes  # the answer was cut off, never whole
        writer.close()


async def test_state_waits_for_a_slot_instead_of_busy() -> None:
    async with served_peer("callee", max_concurrent_exchanges=1) as served:
        slots = served.runner.app[SERVER_STATE].slots  # type: ignore[attr-defined]
        slots.take_now(Busy("test"))  # an exchange in flight
        headers = auth.sign_request(SECRET, "GET", "/v1/state", b"", receiver="callee")
        async with aiohttp.ClientSession() as session:
            fetch = asyncio.create_task(
                session.get(f"http://{served.address}/v1/state", headers=headers)
            )
            await asyncio.sleep(0.3)
            assert not fetch.done()  # queued behind the exchange, not refused
            slots.give()
            response = await asyncio.wait_for(fetch, 5)
            assert response.status == 200
            await response.read()
        assert slots.in_use == 0


async def test_slots_take_now_refuses_when_full_and_hands_over_in_order() -> None:
    slots = Slots(1)
    slots.take_now(Busy("x"))
    with pytest.raises(Busy):
        slots.take_now(Busy("full"))
    first = asyncio.create_task(slots.take(5))
    second = asyncio.create_task(slots.take(5))
    await asyncio.sleep(0)
    with pytest.raises(Busy):  # others queue: no jumping the line
        slots.take_now(Busy("queued"))
    slots.give()
    await asyncio.wait_for(first, 1)
    assert not second.done() and slots.in_use == 1
    slots.give()
    await asyncio.wait_for(second, 1)
    slots.give()
    assert slots.in_use == 0


async def test_a_slot_wait_times_out_and_leaves_nothing_behind() -> None:
    slots = Slots(1)
    slots.take_now(Busy("x"))
    with pytest.raises(TimeoutError):
        await slots.take(0.05)
    slots.give()
    assert slots.in_use == 0
    slots.take_now(Busy("free again"))
    assert slots.in_use == 1


def test_the_byte_budget_charges_refuses_and_returns() -> None:
    budget = ByteBudget(100)
    with budget.account() as first:
        first.charge(60)
        with budget.account() as second:
            second.charge(40)
            with pytest.raises(Overloaded, match="the bound is 100"):
                second.charge(1)
        assert budget.held == 60
    assert budget.held == 0 and budget.peak == 100


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_connections", 0),
        ("max_connections", True),
        ("max_concurrent_exchanges", 1.5),
        ("max_unauthenticated_bytes", MAX_JSON_BYTES - 1),
        ("body_timeout_s", 0),
        ("idle_timeout_s", float("nan")),
        ("max_headers", -1),
    ],
)
def test_limits_refuse_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(LimitError, match=f"ServerLimits.{field}") as error:
        ServerLimits(**{field: value})  # type: ignore[arg-type]
    assert isinstance(error.value, ValueError)


async def test_limits_are_derived_from_the_peer() -> None:
    async with started_peer("a", max_concurrent_exchanges=3, request_timeout_s=7.0) as peer:
        limits = ServerLimits.of(peer)
    assert limits.max_concurrent_exchanges == 3
    assert limits.max_connections == default_max_connections(3) == 44
    assert limits.body_timeout_s == 7.0


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_serving_share_bounds_serving_time_while_training_only() -> None:
    from peer.transport.admission import LimitError, ServingShare

    clock, training = _Clock(), [True]
    share = ServingShare(0.5, lambda: training[0], window_s=2.0, clock=clock)
    started = share.start()
    clock.now += 0.9  # 0.9 s served; the bucket drains 0.5 s per s from then on
    share.done(started)
    assert share.share() == pytest.approx(0.45) and share.admit()
    started = share.start()
    clock.now += 0.2  # 0.9 - 0.1 drained + 0.2 served = 1.0 s: the bound (0.5 x 2 s)
    share.done(started)
    assert share.share() == pytest.approx(0.5)
    assert not share.admit() and share.refused == 1
    training[0] = False  # a peer that does not train serves without the bound
    assert share.admit()
    training[0] = True
    # drained 0.05 s: open again for one exchange at once (a sliding window of spans would
    # reopen only when the first span leaves it, 2 s after it)
    clock.now += 0.1
    assert share.share() == pytest.approx(0.475) and share.admit()
    clock.now += 2.5
    assert share.share() == 0.0 and share.admit()
    # over a long stretch serving back to back, the time admitted is the share of it
    clock = _Clock()
    share = ServingShare(0.5, lambda: True, window_s=2.0, clock=clock)
    served = 0.0
    for _ in range(1000):  # every 10 ms a caller; an admitted exchange takes 10 ms
        if share.admit():
            started = share.start()
            clock.now += 0.01
            share.done(started)
            served += 0.01
        else:
            clock.now += 0.01
    assert 0.5 * 10 <= served <= 0.5 * (10 + 2) + 0.01  # 10 s: half, plus the 1 s allowance
    assert ServingShare(1.0, lambda: True).admit()
    for bad in (0, 1.5, True, "half"):
        with pytest.raises(LimitError, match="max_serving_share"):
            ServingShare(bad, lambda: True)  # type: ignore[arg-type]


async def test_a_peer_that_has_taken_its_steps_serves_beyond_the_share_at_once() -> None:
    """The serving share binds while a peer trains; once ``run`` has taken the steps asked
    for, neighbours still finishing theirs are served at once (not refused for the second
    a recent step would otherwise count as training)."""
    async with (
        started_peer("a") as a,
        started_peer("b", seed=1, join=(a.address,), fetch_state=False) as b,
    ):
        share = a.serving_share
        assert share is not None
        admitted = []

        def serving_looked_busy(step: int, loss: float) -> None:
            share.done(share.start() - 1.9)  # 1.9 s of the 2 s window spent serving
            admitted.append(share.admit())

        await a.run(steps=2, callbacks=[serving_looked_busy])
        assert admitted == [False, False]  # while it trains, the share binds
        assert share.share() > share.max_share
        assert await b.gossip() == 1  # finished a moment ago: served
        assert share.refused == 2
