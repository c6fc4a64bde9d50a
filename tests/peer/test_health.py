"""Exchange health: a peer that stops averaging says so, once, in its log, status and metrics."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from peer.app.status import render
from peer.node.health import ExchangeHealth
from peer.node.peer import HEALTH_WINDOW_ROUNDS, Peer

from .conftest import started_peer

WINDOW = HEALTH_WINDOW_ROUNDS


def warnings_of(caplog: pytest.LogCaptureFixture, peer_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and r.getMessage().startswith(f"peer {peer_id}: no successful exchange")
    ]


def infos_of(caplog: pytest.LogCaptureFixture, peer_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and r.getMessage().startswith(f"peer {peer_id}: exchanging")
    ]


# ----------------------------------------------------------------------------- the tracker


def test_isolated_only_after_a_full_window_without_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="peer.node.health")
    health = ExchangeHealth("a", window=3)
    transitions = []
    for _ in range(2):
        health.record(failed=2)
        transitions.append(health.end_round())
    assert not health.isolated and health.rounds_without_exchange == 2
    health.record(failed=1)
    transitions.append(health.end_round())
    assert health.isolated and transitions == [None, None, "isolated"]
    assert warnings_of(caplog, "a") == [
        "peer a: no successful exchange in the last 3 rounds (5 failed); it is training alone"
    ]
    for _ in range(10):  # stays isolated: no further warning
        assert health.end_round() is None
    assert health.isolated and health.rounds_without_exchange == 13
    assert len(warnings_of(caplog, "a")) == 1
    health.record(ok=1, failed=4)
    assert health.end_round() == "recovered"
    assert not health.isolated and health.rounds_without_exchange == 0
    assert infos_of(caplog, "a") == [
        "peer a: exchanging again (1 successful this round) after 13 rounds without"
    ]
    assert (health.exchanges_ok, health.exchanges_failed, health.rounds) == (1, 9, 14)
    assert health.to_json() == {
        "exchanges": {"ok": 1, "failed": 9},
        "isolated": False,
        "rounds_without_exchange": 0,
    }


def test_one_success_in_the_window_keeps_a_peer_connected() -> None:
    health = ExchangeHealth("a", window=3)
    for round_ in range(12):
        health.record(ok=int(round_ % 3 == 0), failed=1)  # one success every third round
        assert health.end_round() is None
        assert not health.isolated
    assert health.rounds_without_exchange == 2


def test_the_window_counts_rounds_run_not_rounds_since_a_fresh_start() -> None:
    health = ExchangeHealth("a", window=5)
    for _ in range(4):  # fewer rounds than the window: not isolated yet, however they went
        health.end_round()
    assert not health.isolated and health.rounds_without_exchange == 4
    assert health.end_round() == "isolated"


def test_a_round_with_nobody_to_exchange_with_counts_as_without_success() -> None:
    health = ExchangeHealth("a", window=2)
    health.record(ok=1)
    health.end_round()
    health.end_round()  # no neighbour known: no call at all
    assert not health.isolated
    assert health.end_round() == "isolated"
    assert health.exchanges_failed == 0  # isolated with nothing failed: nobody to call


def test_successes_between_rounds_count_in_the_open_round() -> None:
    health = ExchangeHealth("a", window=1)
    assert health.end_round() == "isolated"
    health.record(ok=1)  # e.g. served as the callee before the next round ends
    assert health.exchanges_ok == 1 and health.isolated  # decided when the round closes
    assert health.end_round() == "recovered"


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "5"])
def test_a_bad_window_is_refused_with_its_name(window: object) -> None:
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        ExchangeHealth("a", window=window)  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("ok", -1), ("failed", 1.5), ("ok", True)])
def test_bad_counts_are_refused_with_their_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 0"):
        ExchangeHealth("a", window=2).record(**{field: value})  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- real peers


async def scrape(peer: Peer) -> dict[str, float]:
    """``GET /metrics`` over HTTP: the unlabelled samples by name."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{peer.address}/metrics") as response,
    ):
        assert response.status == 200
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def test_a_peer_whose_only_neighbour_stops_becomes_isolated_then_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="peer")
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(started_peer("a", request_timeout_s=1.0, evict_after=2))
        async with started_peer("b", seed=1, join=(a.address,), fetch_state=False) as b:
            assert await b.gossip() == 1  # a averages as the callee: counted in its open round
            assert await a.gossip() == 1
            await b.stop(goodbye=False)  # b dies without a word (a clean stop says goodbye)
        assert a.status()["exchanges"] == {"ok": 2, "failed": 0}  # b's call and its own
        for round_ in range(1, WINDOW):
            assert await a.gossip() == 0
            status = a.status()
            assert not status["isolated"] and status["rounds_without_exchange"] == round_
        assert await a.gossip() == 0
        # Two calls failed (b suspected, then evicted); the rounds after had nobody to call.
        status = a.status()
        assert a.membership.neighbours() == []
        assert status["isolated"] is True
        assert status["rounds_without_exchange"] == WINDOW
        assert status["exchanges"] == {"ok": 2, "failed": 2}
        assert (
            f"exchanges 2 ok, 2 failed  ISOLATED: no successful exchange in {WINDOW} rounds, "
            "training alone"
        ) in render(status).splitlines()
        metrics = await scrape(a)
        assert metrics["gossipnet_isolated"] == 1
        assert metrics["gossipnet_rounds_without_exchange"] == WINDOW
        for _ in range(3):
            await a.gossip()
        assert a.status()["rounds_without_exchange"] == WINDOW + 3
        assert warnings_of(caplog, "a") == [
            f"peer a: no successful exchange in the last {WINDOW} rounds (2 failed); "
            "it is training alone"
        ]
        assert infos_of(caplog, "a") == []
        async with started_peer("c", seed=2, join=(a.address,), fetch_state=False):
            assert await a.gossip() == 1
            status = a.status()
            assert status["isolated"] is False and status["rounds_without_exchange"] == 0
            assert status["exchanges"] == {"ok": 3, "failed": 2}
            assert "exchanges 3 ok, 2 failed" in render(status).splitlines()
            metrics = await scrape(a)
            assert metrics["gossipnet_isolated"] == 0
            assert metrics["gossipnet_rounds_without_exchange"] == 0
        assert len(infos_of(caplog, "a")) == 1
        assert len(warnings_of(caplog, "a")) == 1


async def test_a_sync_peer_counts_missing_round_models_as_failed() -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            started_peer("a", mode="sync", round_deadline_s=1.0, request_timeout_s=1.0)
        )
        async with started_peer(
            "b", seed=1, mode="sync", round_deadline_s=1.0, join=(a.address,), fetch_state=False
        ) as b:
            assert await asyncio.gather(a.gossip(), b.gossip()) == [1, 1]
            assert a.status()["exchanges"] == {"ok": 1, "failed": 0}
            assert b.status()["exchanges"] == {"ok": 1, "failed": 0}
            await b.stop(goodbye=False)  # b dies without a word (a clean stop says goodbye)
        for _ in range(WINDOW):  # b expected while suspected (3 evicts it), never arrives
            assert await a.gossip() == 0
        status = a.status()
        assert status["isolated"] is True
        assert status["exchanges"] == {"ok": 1, "failed": 3}


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_two_healthy_peers_report_their_exchanges_and_are_not_isolated(mode: str) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(started_peer("a", mode=mode, round_deadline_s=5.0))
        b = await stack.enter_async_context(
            started_peer(
                "b", seed=1, mode=mode, round_deadline_s=5.0, join=(a.address,), fetch_state=False
            )
        )
        steps = 2 * WINDOW
        await asyncio.gather(a.run(steps=steps), b.run(steps=steps))
        for peer in (a, b):
            status = peer.status()
            assert status["exchanges"]["ok"] >= steps, status  # every round averaged
            assert status["exchanges"]["failed"] == 0
            assert status["isolated"] is False
            # Async: b's own call can be declined (busy) while a's call to b is being
            # averaged, so a round (or, when the two keep colliding on a loaded machine, a
            # few) may end without an exchange of its own; never a whole window.
            assert status["rounds_without_exchange"] < (1 if mode == "sync" else WINDOW)
            metrics = await scrape(peer)
            assert metrics["gossipnet_isolated"] == 0
