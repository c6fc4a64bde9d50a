"""Peers find each other again: a restarted bootstrap peer rejoins the members its checkpoint
remembers, and joins retry until the peer they name is up (real processes)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peer.app.swarm import free_ports
from peer.node import checkpoint

from .processes import ROOT, start_peer, status, wait_until

SECRET = "rejoin-test-swarm-secret-0123456789"
WORKLOAD = ["--dataset", "synthetic:num_samples=600,seed=0", "--peers", "3",
            "--request-timeout-s", "2", "--status-every", "10", "--progress", "lines"]  # fmt: skip
pytestmark = pytest.mark.slow


def start(tmp_path: Path, name: str, index: int, *extra: str) -> subprocess.Popen[bytes]:
    return start_peer(tmp_path, name, index, *extra, secret=SECRET, workload=WORKLOAD)


def member(address: str, peer_id: str) -> str | None:
    """``peer_id``'s status in the view of the peer at ``address`` (None if unknown)."""
    return next((m["status"] for m in status(address)["neighbours"] if m["id"] == peer_id), None)


def remembered(folder: Path) -> set[str]:
    """The member ids the newest checkpoint in ``folder`` recorded."""
    loaded = checkpoint.load_latest(folder)
    if loaded is None:
        return set()
    return {entry["id"] for entry in json.loads(loaded.metadata["members"])}


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.timeout(300)
def test_a_restarted_bootstrap_peer_rejoins_the_members_it_remembers(tmp_path: Path) -> None:
    folder = tmp_path / "a.checkpoints"
    a_port = free_ports(1)[0]
    a = f"127.0.0.1:{a_port}"
    own_command = ("--port", str(a_port), "--checkpoint-dir", str(folder),
                   "--checkpoint-every", "10")  # fmt: skip
    processes = [start(tmp_path, "a", 0, *own_command)]
    try:  # b and c start with a, as launch starts a swarm: their joins retry until a listens
        processes += [start(tmp_path, "b", 1, "--join", a), start(tmp_path, "c", 2, "--join", a)]
        wait_until("a, b and c listen", lambda: all(
            (tmp_path / f"{x}.address").exists() for x in "abc"))  # fmt: skip
        b, c = (tmp_path / "b.address").read_text(), (tmp_path / "c.address").read_text()
        wait_until("a checkpointed b and c as members", lambda: remembered(folder) == {"b", "c"})
        processes[0].send_signal(signal.SIGKILL)
        processes[0].wait(timeout=10)
        for address in (b, c):
            wait_until(f"{address} evicts a", lambda x=address: member(x, "a") == "evicted")
        # a restarts with its own command plus --resume: no --join, nobody calls it
        (tmp_path / "a.address").unlink()
        processes.append(start(tmp_path, "a", 0, *own_command, "--resume"))
        wait_until("a listens again", lambda: (tmp_path / "a.address").exists())
        assert re.search(r"resumed from \S+ at step \d+", (tmp_path / "a.out").read_text())
        wait_until("a exchanges again", lambda: status(a)["exchanges"]["ok"] >= 10)
        for address in (b, c):
            wait_until(f"{address} sees a alive", lambda x=address: member(x, "a") == "alive")
        assert member(a, "b") == "alive" and member(a, "c") == "alive"
        served = [status(x)["exchanges"]["ok"] for x in (a, b, c)]
        wait_until("everyone keeps exchanging", lambda: all(
            status(x)["exchanges"]["ok"] >= n + 5 for x, n in zip((a, b, c), served)))  # fmt: skip
    finally:
        stop_all(processes)
    assert [p.returncode for p in processes[1:]] == [0, 0, 0]


@pytest.mark.timeout(180)
def test_a_peer_started_before_the_one_it_joins_waits_for_it(tmp_path: Path) -> None:
    a_port = free_ports(1)[0]
    a = f"127.0.0.1:{a_port}"
    processes = [start(tmp_path, "b", 1, "--join", a)]  # a is not up yet
    try:  # a starts once b has found it missing and is retrying (not after a fixed sleep)
        wait_until(
            "b retries a", lambda: "no answer yet from " + a in (tmp_path / "b.err").read_text()
        )
        processes.append(start(tmp_path, "a", 0, "--port", str(a_port)))
        wait_until("both listen", lambda: (tmp_path / "a.address").exists()
                   and (tmp_path / "b.address").exists())  # fmt: skip
        b = (tmp_path / "b.address").read_text()
        wait_until("a and b are members of each other",
                   lambda: member(a, "b") == "alive" and member(b, "a") == "alive")  # fmt: skip
        wait_until("they exchange", lambda: status(b)["exchanges"]["ok"] >= 5)
    finally:
        stop_all(processes)
    assert [p.returncode for p in processes] == [0, 0]


@pytest.mark.timeout(120)
def test_a_join_that_times_out_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """An unreachable bootstrap is retried, then the join gives up in one line, exit 2 (was
    also tests/peer/test_cli.py's test_an_unreachable_bootstrap_is_retried_then_one_line_exit_2:
    the same command, a second Python start-up and 2 s wait; its assertions are here)."""
    nobody = f"127.0.0.1:{free_ports(1)[0]}"
    env = {**os.environ, "GOSSIPNET_SECRET": SECRET}
    command = [sys.executable, "-m", "gossipnet", "peer", "--id", "b", "--join", nobody,
               "--join-timeout-s", "2", "--steps", "5", *WORKLOAD]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [errors[-1]] and errors[-1] == result.stderr.splitlines()[-1]
    assert errors[0].startswith(
        f"gossipnet peer: error: --join {nobody}: no answer within 2 s; start that peer first"
    )
    assert f"no answer yet from {nobody}; retrying" in result.stderr  # it was retried
    assert "--join-timeout-s" in errors[0] and "Traceback" not in result.stderr
    assert time.monotonic() - started < 60
    assert "listening" not in result.stdout
