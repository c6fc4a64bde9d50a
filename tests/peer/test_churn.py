"""Stragglers and churn of a real swarm: ``launch --crashes`` kills a peer process (SIGKILL)
on schedule and starts it again from its checkpoint, where it takes up its sync neighbours'
round, and ``launch --stragglers`` slows another, in one small real launch; bad ``--crashes`` are one line, exit 2, through the real
parser."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peer.app.churn import (
    REJOINS,
    Crash,
    crashes_flag,
    parse_crashes,
    parse_stragglers,
    stragglers_flag,
)
from peer.app.launch import _check
from peer.app.launch import _parser as launch_parser
from peer.app.swarm import peer_flags

ROOT = Path(__file__).resolve().parents[2]


def _checked(*argv: str) -> object:
    parser = launch_parser("gossipnet launch", False)
    args = parser.parse_args(["--peers", "4", "--steps", "200", "--no-centralized", *argv])
    _check(args, parser)
    return args


def test_crashes_are_the_simulators_with_rejoin_at_plus_down() -> None:
    args = _checked("--crashes", "3@20,1@2.5+4,1@10+1")
    assert args.crash_plan == (Crash(1, 2.5, 6.5), Crash(1, 10.0, 11.0), Crash(3, 20.0, None))
    flags = [peer_flags(args, i, Path("/r"), secret_file=None, peer_file=None) for i in range(4)]
    for index in (1, 3):  # a peer that crashes checkpoints, to rejoin from its checkpoint
        assert flags[index][flags[index].index("--checkpoint-dir") + 1] == (
            f"/r/peer-{index}.checkpoints"
        )
        assert flags[index][flags[index].index("--checkpoint-every") + 1] == "10"
    assert "--checkpoint-dir" not in flags[0] and "--checkpoint-dir" not in flags[2]


def test_the_simulators_models_written_as_flags_read_back_the_same() -> None:
    stragglers = {0: 2.5, 3: 10.0}
    assert parse_stragglers(stragglers_flag(stragglers), 4) == stragglers
    crashes = (Crash(1, 0.25, 1.75), Crash(2, 2.0, 9.5), Crash(1, 3.0, None))  # in time order
    assert parse_crashes(crashes_flag(crashes), 4) == crashes


def test_a_sync_peer_may_rejoin_but_not_a_push_sum_or_choco_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ring = ("--topology", "ring")
    for algorithm in REJOINS:  # they take up the swarm's round (ad-psgd has none)
        args = _checked("--algorithm", algorithm, *ring, "--crashes", "1@2+3")
        assert args.crash_plan == (Crash(1, 2.0, 5.0),)
    assert _checked("--mode", "sync", "--crashes", "1@2+3").crash_plan == (Crash(1, 2.0, 5.0),)
    args = _checked("--algorithm", "push-sum", *ring, "--crashes", "1@2")  # down to the end
    assert args.crash_plan == (Crash(1, 2.0, None),)
    capsys.readouterr()  # (sparseloco's launch warns about its codec)
    for algorithm, why in (
        ("push-sum", "the mass it held dies with it"),
        ("choco", "its neighbours' public copies of it"),
    ):
        with pytest.raises(SystemExit) as exit:
            _checked("--algorithm", algorithm, *ring, "--crashes", "1@2+3")
        assert exit.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.endswith("give PEER@AT (down to the end)")
        assert (
            f"--crashes: +DOWN (a rejoin) needs {', '.join(REJOINS)}; a {algorithm} peer "
            f"cannot rejoin: {why}"
        ) in err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4@1", "--crashes: peer 4 is outside 0..3 (--peers 4)"),
        (
            "1",
            "--crashes: each entry must be PEER@AT or PEER@AT+DOWN (seconds, e.g. 2@10+5), got '1'",
        ),
        ("a@1", "--crashes: a peer must be an id, got 'a'"),
        ("1@-1", "--crashes: AT of peer 1 must be >= 0 seconds, got -1"),
        ("1@x", "--crashes: AT of peer 1 must be a number, got 'x'"),
        ("1@1+0", "--crashes: DOWN of peer 1 must be > 0 seconds, got 0"),
        ("1@1+nan", "--crashes: DOWN of peer 1 must be finite, got 'nan'"),
        (
            "1@1+5,1@3",
            "--crashes: peer 1 crashes at 3 s while still down (until 6 s); a peer "
            "must be back before it crashes again",
        ),
        (
            "1@1,1@3+1",
            "--crashes: peer 1 crashes at 3 s while still down (until the end); a "
            "peer must be back before it crashes again",
        ),
    ],
)
def test_launch_refuses_bad_crashes_in_one_line(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        _checked("--crashes", value)
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(message) and "\n" not in err


STEPS = 500
DEADLINE_S = 1.0


@pytest.mark.slow
def test_a_crashed_sync_peer_is_killed_rejoins_in_step_and_a_straggler_is_slowed(
    tmp_path: Path, dataset_cache: Path
) -> None:
    # dpsgd over 3 peers whose links take 20 ms: the two that stay up keep exchanging for
    # STEPS x 50 ms = 25 s, longer than the restarted peer's start-up (3-21 s here)
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "GOSSIPNET_SECRET"}
    result = subprocess.run(
        [sys.executable, "-m", "gossipnet", "launch", "--peers", "3", "--steps", str(STEPS),
         "--algorithm", "dpsgd", "--latency", "20ms", "--round-deadline-s", str(DEADLINE_S),
         "--dataset", "synthetic:num_samples=600", "--no-centralized", "--progress", "none",
         "--stragglers", "0=3", "--crashes", "1@0.5+1", "--dir", str(run),
         "--log-dir", str(tmp_path / "log"), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**env, "GOSSIPNET_CACHE": str(dataset_cache), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.splitlines()[-1])
    straggler, crashed, _ = results["peers"]
    # the crash: killed on time, the process really gone, started again, trained again
    [crash] = crashed["crashes"]
    assert 0.5 <= crash["at"] < 1.5, crash
    assert crash["at"] + 1 - 0.05 <= crash["back"] < crash["at"] + 2, crash  # rejoin = at + down
    assert crash["rejoined"] is not None and crash["rejoined"] > crash["back"], crash
    with pytest.raises(ProcessLookupError):
        os.kill(crash["pid"], 0)
    assert int((run / "peer-1.pid").read_text()) != crash["pid"]
    assert (run / "peer-1.life1.out").is_file()
    assert f"peer-1 crashed at {crash['at']:.1f} s, back at {crash['back']:.1f} s" in result.stderr
    assert crashed["step"] == STEPS and crashed["state"] == "finished"
    if crash["from_step"] is not None:  # resumed: its second life began at its checkpoint
        assert f"resumed from {run}/peer-1.checkpoints" in (run / "peer-1.out").read_text()
    # back, it took up its neighbours' round: its rounds ran ahead of its steps by the rounds
    # it skipped, and from the round it took up to their last (STEPS - 1) it mixed both
    # neighbours' models of its round (the counts are its second life's)
    lines = [
        json.loads(line)
        for line in (run / "peer-1.out").read_text().splitlines()
        if line.startswith("{")
    ]
    skipped = lines[-1]["round"] - lines[-1]["step"]
    assert skipped > 0 and all(line["round"] - line["step"] == skipped for line in lines)
    took_up = (crash["from_step"] or 0) + skipped
    assert STEPS - took_up >= 20, (took_up, crash)  # it was back while they trained
    assert crashed["exchanges_ok"] >= 2 * (STEPS - took_up) - 4, (crashed, took_up)
    # and their rounds after it was back took the links' time, not the round deadline
    rows = list(csv.DictReader((tmp_path / "log" / "swarm" / "metrics.csv").open()))
    start = min(float(row["time_s"]) for row in rows if int(row["step"]) > 0)
    after = [
        (float(row["time_s"]), int(row["step"]))
        for row in rows
        if row["peer"] == "peer-2" and float(row["time_s"]) > start + crash["rejoined"] + 0.6
    ]
    after = [(t, step) for t, step in after if step < STEPS] or after[:1]
    seconds, steps = after[-1][0] - after[0][0], after[-1][1] - after[0][1]
    assert steps > 0 and seconds / steps < DEADLINE_S / 4, after
    # the straggler waited twice its compute (factor 3); the other did not wait
    assert straggler["slowdown"] == 3.0
    assert straggler["slowdown_waited_s"] == pytest.approx(2 * straggler["compute_s"], abs=0.05)
    assert straggler["compute_s"] > 0
    assert "slowdown" not in crashed and crashed.get("slowdown_waited_s", 0.0) == 0.0


@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_start_at_refuses_a_time_that_is_not_one(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from peer.app.cli import parse_peer_args

    with pytest.raises(SystemExit) as exit:
        parse_peer_args(["--id", "a", "--start-at", value])
    assert exit.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"--start-at: must be a Unix time in seconds >= 0, got {float(value)}")
    )


def test_the_title_counts_a_peer_down_at_the_end_apart() -> None:
    from argparse import Namespace

    from peer.app.report import title

    peers = [{"id": "peer-0", "step": 300}, {"id": "peer-1", "step": 30, "down": True}]
    results = {"steps": 300, "peers": peers, "task": "classification"}
    args = Namespace(steps=300, batch_size=32)
    assert title(results, args).endswith("after 300 steps of batch 32 (1 down)")
    peers[1].pop("down")  # the same steps without the crash: a run stopped early
    assert title(results, args).endswith("after 30-300 of 300 steps of batch 32 (stopped early)")
