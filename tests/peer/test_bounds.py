"""A peer serves at most ``max_concurrent_exchanges`` exchanges at once (real servers)."""

from __future__ import annotations

import asyncio

import pytest

from peer.client import RemoteRefused
from peer.node import Peer
from peer.wire import Envelope

from .conftest import started_peer


async def _call(caller: Peer, callee: Peer) -> Envelope:
    assert callee.address is not None
    envelope = caller._envelope(caller.flat.vector.detach())
    return await caller._client().exchange(callee.address, envelope, codecs=caller.codecs)


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
        assert a.metrics.errors(code="busy")._value.get() == 1


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
