"""Emulated links (``peer.transport.shaping``): real peers on 127.0.0.1 whose uplinks are
shaped; an exchange of a body of known size takes its latency and bandwidth, loss fails the
seeded share of exchanges, and a peer without a setting sends as it always did."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import torch

from peer.app.cli import parse_peer_args
from peer.app.launch import _parser as launch_parser
from peer.app.swarm import peer_flags
from peer.app.usage import UsageError
from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.transport.shaping import EmulatedLink, LinkSettings

from .conftest import SECRET

NUMEL = 50_000
"""Float32 parameters of the test model: a 200 KB body each way."""


class Flat(torch.nn.Module):
    def __init__(self, numel: int, seed: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.randn(numel, generator=torch.Generator().manual_seed(seed))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.sum()


@asynccontextmanager
async def pair(
    numel: int, caller: dict[str, Any], callee: dict[str, Any]
) -> AsyncIterator[tuple[Peer, Peer]]:
    """A listening callee and a client-only caller joined to it (async mode: one
    ``gossip()`` is one exchange, the caller's model there and the callee's back)."""

    def make(peer_id: str, model_seed: int, **config: Any) -> Peer:
        return Peer(
            Flat(numel, model_seed),
            lambda params: torch.optim.SGD(params, lr=0.0),
            torch.nn.functional.mse_loss,
            [],
            PeerConfig(
                peer_id=peer_id, secret=SECRET, request_timeout_s=10.0, evict_after=10_000, **config
            ),
        )

    served = make("callee", 1, **callee)
    await served.start()
    try:
        calling = make(
            "caller", 2, client_only=True, join=(served.address,), fetch_state=False, **caller
        )
        await calling.start()
        await asyncio.sleep(0.002)  # signed after the callee's start millisecond
        try:
            yield calling, served
        finally:
            await calling.stop()
    finally:
        await served.stop()


async def timed_exchange(caller: Peer) -> tuple[int, float]:
    started = time.perf_counter()
    done = await caller.gossip()
    return done, time.perf_counter() - started


async def test_an_exchange_takes_the_latency_and_the_bandwidth_of_both_uplinks() -> None:
    latency, bandwidth = 0.05, 2e6  # 50 ms, 16 Mbit/s: a 200 KB body takes 0.1 s
    link = {"latency": latency, "bandwidth": bandwidth}
    async with pair(NUMEL, link, link) as (caller, callee):
        assert caller.ctx.link is not None and callee.ctx.link is not None
        done, elapsed = await timed_exchange(caller)
        assert done == 1
        body = caller.ctx.link.sent_bytes  # what the caller's uplink carried: one body
        assert NUMEL * 4 < body < NUMEL * 4 + 1024
        assert callee.ctx.link.sent_bytes == body  # the answer, the same size
        expected = 2 * (latency + body / bandwidth)  # there and back, each on its sender's link
        assert elapsed >= 0.98 * expected
        assert elapsed < expected + 1.0  # loose: a loaded machine only adds time


async def test_one_slow_uplink_slows_what_that_peer_sends_only() -> None:
    bandwidth = 2e6  # a straggler's uplink: the caller's 200 KB take 0.1 s, the answer not
    async with pair(NUMEL, {"bandwidth": bandwidth}, {}) as (caller, callee):
        assert callee.ctx.link is None and caller.ctx.link is not None
        done, elapsed = await timed_exchange(caller)
        assert done == 1
        one_body = caller.ctx.link.sent_bytes / bandwidth
        assert one_body >= 0.1
        assert one_body * 0.98 <= elapsed < one_body + 1.0


async def test_unset_is_no_link_and_shaping_changes_the_time_not_the_bits() -> None:
    assert not PeerConfig(peer_id="a").link.shaped
    async with pair(1000, {}, {}) as (caller, callee):
        assert caller.ctx.link is None and callee.ctx.link is None
        assert caller.client is not None and caller.client.link is None
        assert await caller.gossip() == 1
        plain = (caller.flat.vector.clone(), callee.flat.vector.clone())
    async with pair(1000, {"latency": 0.01}, {"jitter": 0.005}) as (caller, callee):
        assert await caller.gossip() == 1
        assert torch.equal(caller.flat.vector, plain[0])
        assert torch.equal(callee.flat.vector, plain[1])


async def lost_pattern(caller: dict[str, Any], callee: dict[str, Any], n: int) -> list[bool]:
    async with pair(16, caller, callee) as (calling, _):
        return [await calling.gossip() == 0 for _ in range(n)]


async def test_loss_fails_the_seeded_share_of_exchanges_the_same_with_the_same_seed() -> None:
    caller = {"message_loss": 0.3, "seed": 7}
    first = await lost_pattern(caller, {}, 40)
    assert first == await lost_pattern(caller, {}, 40)  # same seed, same losses
    assert 4 <= sum(first) <= 22  # 12 expected of 40 (p = 0.3; < 1e-3 outside)
    assert first != await lost_pattern({**caller, "seed": 8}, {}, 40)


async def test_a_lost_answer_fails_the_exchange_after_the_callee_took_the_request() -> None:
    async with pair(16, {}, {"message_loss": 0.5, "seed": 3}) as (caller, callee):
        failed = [await caller.gossip() == 0 for _ in range(20)]
        assert callee.ctx.link is not None
        assert sum(failed) == callee.ctx.link.lost_messages > 0
        assert callee.ctx.link.messages == 20  # every request reached the callee


def test_draws_are_seeded_jitter_stays_in_its_band_and_loss_has_its_rate() -> None:
    settings = LinkSettings(latency=0.05, jitter=0.01, message_loss=0.1)
    link, again = EmulatedLink(settings, seed="s"), EmulatedLink(settings, seed="s")
    draws = [link.draw() for _ in range(4000)]
    assert draws == [again.draw() for _ in range(4000)]
    delays = [delay for delay, _ in draws]
    assert 0.04 <= min(delays) < 0.0405 and 0.0595 < max(delays) <= 0.06
    assert abs(sum(delays) / len(delays) - 0.05) < 5e-4
    assert abs(sum(lost for _, lost in draws) / len(draws) - 0.1) < 0.02
    assert LinkSettings(latency=0.001, jitter=0.01).shaped  # clipped at 0, never negative
    assert min(EmulatedLink(LinkSettings(jitter=0.01)).draw()[0] for _ in range(50)) >= 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--latency", "50 parsecs"], "--latency: got '50 parsecs'; allowed: a number of seconds"),
        (["--bandwidth", "100Mbps"], "--bandwidth: got '100Mbps'; allowed: a number of bytes"),
        (["--bandwidth", "0"], "--bandwidth: got '0', must be > 0; allowed:"),
        (["--message-loss", "100%"], "--message-loss: got '100%', must be < 1; allowed:"),
    ],
)
def test_a_bad_link_flag_is_one_line_naming_the_flag_and_the_allowed_forms(
    flags: list[str], message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_peer_args(["--id", "a", *flags], raise_errors=True)
    assert str(caught.value).startswith(message)


def test_flags_are_read_in_the_simulators_units_and_launch_passes_them_to_every_peer(
    tmp_path: Any,
) -> None:
    _, config = parse_peer_args(
        ["--id", "a", "--latency", "50ms", "--bandwidth", "100Mbit", "--message-loss", "1%"],
        raise_errors=True,
    )
    assert config.link == LinkSettings(latency=0.05, bandwidth=1.25e7, message_loss=0.01)
    args = launch_parser("gossipnet launch", False).parse_args(
        ["--latency", "50ms", "--bandwidth", "100Mbit"]
    )
    flags = peer_flags(args, 0, tmp_path, secret_file=None, peer_file=None)
    assert flags[flags.index("--latency") + 1] == "0.05" and "--jitter" not in flags
    _, passed = parse_peer_args(flags, raise_errors=True)
    assert passed.link == LinkSettings(latency=0.05, bandwidth=1.25e7)


def test_a_peer_reads_its_link_from_a_simulator_network_table() -> None:
    table = {"latency": [0.01, 0.2], "bandwidth": 1.25e7, "message_loss": 0.01, "step_time": 1}
    assert LinkSettings.for_peer(table, 1) == LinkSettings(
        latency=0.2, bandwidth=1.25e7, message_loss=0.01
    )
    with pytest.raises(ValueError, match=r"^latency: has 2 per-peer values, none for peer 2"):
        LinkSettings.for_peer(table, 2)
