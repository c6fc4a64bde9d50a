"""A peer that leaves cleanly says goodbye (``POST /v1/leave``): its neighbours mark it
*left*, not failed, and stop calling it; a refused goodbye is a documented error."""

from __future__ import annotations

import pytest

from peer.protocol.errors import ProtocolError
from peer.transport.client import RemoteRefused

from .conftest import started_peer


async def test_a_peer_that_stops_says_goodbye_and_its_neighbour_marks_it_left() -> None:
    async with started_peer("a") as a:
        leaving = started_peer("b", seed=1, join=(a.address,))
        b = await leaving.__aenter__()
        member = a.membership.get("b")
        assert member is not None and member.status == "alive"
        await a.gossip()
        ok, failed = a.health.exchanges_ok, a.health.exchanges_failed
        assert ok >= 1
        await leaving.__aexit__(None, None, None)  # b.stop(): goodbye, then closed
        assert (member.status, member.failures) == ("left", 0)
        assert {"id": "b", "address": b.address, "status": "left"} in a.status()["neighbours"]
        await a.gossip()  # nobody left to call: no failed call to b
        assert a.health.exchanges_failed == failed
        assert [m["id"] for m in a.membership.view()] == ["a"]


async def test_a_goodbye_in_someone_elses_name_or_badly_formed_is_refused() -> None:
    async with started_peer("a") as a, started_peer("b", seed=1, join=(a.address,)) as b:
        assert b.client is not None and a.address is not None
        with pytest.raises((RemoteRefused, ProtocolError), match="own"):
            await b.client.leave(a.address, "a", receiver="a")
        with pytest.raises((RemoteRefused, ProtocolError), match=r"invalid_sender|id"):
            await b.client.leave(a.address, "not a peer id!", receiver="a")
        answer = await b.client.leave(a.address, "stranger", receiver="a")  # unknown: nothing
        assert answer["id"] == "a"
        assert a.membership.get("b") is not None and a.membership.get("b").status == "alive"
