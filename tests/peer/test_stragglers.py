"""Emulated stragglers: ``gossipnet peer --slowdown K`` stretches every local step to K times
its compute (a real peer, real torch steps, its real ``/v1/status``), and ``launch
--stragglers`` hands the factor to the peers it names; bad values are one line, exit 2,
through the real parsers."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest
import torch

from peer.app.cli import parse_peer_args
from peer.app.launch import _check
from peer.app.launch import _parser as launch_parser
from peer.app.swarm import peer_flags
from peer.node.background import BackgroundPeer
from peer.node.config import PeerConfig
from peer.node.peer import Peer

from .conftest import SECRET, sgd


def _work(seed: int) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A model whose step takes a few milliseconds, so the stretch is measurable."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randn(256, 128, generator=g), torch.randint(0, 2, (256,), generator=g))]
    return model, data


async def _run(slowdown: float, steps: int) -> tuple[float, dict[str, float]]:
    model, data = _work(0)
    config = PeerConfig(peer_id="s", secret=SECRET, slowdown=slowdown)
    async with Peer(model, sgd, torch.nn.functional.cross_entropy, data, config) as peer:
        start = time.perf_counter()
        await peer.run(steps)
        wall = time.perf_counter() - start
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{peer.address}/v1/status") as response,
        ):
            status = await response.json()
    return wall, status


async def test_a_slowed_peer_takes_k_times_its_compute_per_step() -> None:
    steps = 8
    wall, status = await _run(3.0, steps)
    assert status["step"] == steps and status["slowdown"] == 3.0
    compute, waited = status["compute_s"], status["slowdown_waited_s"]
    assert compute > 0
    # (k - 1) x the measured compute, to within one sleep's lateness (paid off as it goes)
    assert waited == pytest.approx(2 * compute, abs=0.02)
    assert wall >= compute + waited  # the waits really passed: the run took >= 3x compute


def test_slowdown_refusals_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("0.5", "nan", "inf"):
        with pytest.raises(SystemExit) as exit:
            parse_peer_args(["--id", "a", "--slowdown", value])
        assert exit.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"--slowdown: must be a finite number >= 1, got {float(value)}")
        assert "\n" not in err
    with pytest.raises(ValueError, match="slowdown is 2, but a BackgroundPeer"):
        model, _ = _work(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        BackgroundPeer(model, optimizer, PeerConfig(peer_id="b", device="auto", slowdown=2))


def _launch_args(*argv: str) -> tuple[object, list[list[str]]]:
    parser = launch_parser("gossipnet launch", False)
    args = parser.parse_args(["--peers", "4", "--no-centralized", *argv])
    _check(args, parser)
    flags = [
        peer_flags(args, i, Path("/tmp/x"), secret_file=None, peer_file=None) for i in range(4)
    ]
    return args, flags


def _slowdown(flags: list[str]) -> float | None:
    return float(flags[flags.index("--slowdown") + 1]) if "--slowdown" in flags else None


def test_launch_hands_each_straggler_its_factor() -> None:
    _, flags = _launch_args("--stragglers", "1-2=3,0=1.5")
    assert [_slowdown(f) for f in flags] == [1.5, 3.0, 3.0, None]
    for index, own in enumerate(flags):  # the peer's own parser takes them
        assert parse_peer_args(own)[1].slowdown == (_slowdown(own) or 1.0), index


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4=2", "--stragglers: peer 4 is outside 0..3 (--peers 4)"),
        ("1=2,0-1=3", "--stragglers: peer 1 is given twice; give it once"),
        ("1=0.5", "--stragglers: the factor of 1 must be >= 1, got 0.5"),
        ("1=inf", "--stragglers: the factor of 1 must be finite, got 'inf'"),
        ("1", "--stragglers: each entry must be PEER=FACTOR (e.g. 3=3.0), got '1'"),
        ("x=2", "--stragglers: a peer must be an id or a range A-B, got 'x'"),
        ("3-1=2", "--stragglers: range 3-1 is empty; write it low-high"),
    ],
)
def test_launch_refuses_bad_stragglers_in_one_line(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        _launch_args("--stragglers", value)
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().endswith(message)
