"""Stopping a swarm waits for peers that are still finishing, and says why it killed one.

The processes here are real OS processes in the swarm's process group that speak the peer's
side of the contract (``peer.app.run``: a status line with a ``phase`` on the way out, SIGTERM
answered by finishing first); the real peers' phase lines are checked end to end by
``test_scale.py``."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from peer.app.report import collect_results, print_results
from peer.app.swarm import PeerProcess, Swarm
from workloads.baseline import CentralizedResult

ARGS = argparse.Namespace(topology=None, steps=2, batch_size=2, peers=2, json=False)


def finishing_peer(swarm: Swarm, index: int, phase: str | None, seconds: float) -> PeerProcess:
    """A process that ignores SIGTERM while it is busy for ``seconds`` (saying ``phase`` in
    a status line, as a peer does on its way out), then exits 0."""
    said = (
        "ready" if phase is None else json.dumps({"id": f"peer-{index}", "step": 2, "phase": phase})
    )
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"print({said!r}, flush=True)\n"
        f"time.sleep({seconds})\n"
    )
    peer_id = f"peer-{index}"
    with (swarm.directory / f"{peer_id}.out").open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=subprocess.DEVNULL,
            process_group=0 if swarm.group is None else swarm.group,
        )
    if swarm.group is None:
        swarm.group = process.pid
    peer = PeerProcess(index, peer_id, process, swarm.directory, client_only=False)
    swarm.peers.append(peer)
    deadline = time.monotonic() + 10
    while not peer.stdout.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)  # its signal handler is set once it printed
    return peer


def test_a_fixed_grace_kills_a_peer_still_evaluating_and_the_table_says_why(
    tmp_path: Path,
) -> None:
    swarm = Swarm(ARGS, tmp_path)
    peer = finishing_peer(swarm, 0, "evaluating", 60)
    killed = swarm.stop(0.3)
    assert killed == [peer]
    assert peer.failed()
    assert peer.exit_reason() == "killed after the grace of 0.3 s while evaluating"
    results = collect_results(swarm, CentralizedResult())
    assert results["peers"][0]["error"] == "killed after the grace of 0.3 s while evaluating"
    table = io.StringIO()
    with redirect_stdout(table):
        print_results(results, ARGS)
    row = next(line for line in table.getvalue().splitlines() if "peer-0" in line)
    assert "killed after the grace of 0.3 s" in row, table.getvalue()  # long cells wrap


def test_the_default_grace_waits_while_a_peer_is_finishing_then_kills_one_that_is_not(
    tmp_path: Path,
) -> None:
    swarm = Swarm(ARGS, tmp_path)
    evaluating = finishing_peer(swarm, 0, "evaluating", 0.6)
    silent = finishing_peer(swarm, 1, None, 60)
    said: list[str] = []
    start = time.monotonic()
    killed = swarm.stop(base_s=0.2, limit_s=20, say=said.append)
    assert 0.5 < time.monotonic() - start < 10
    assert killed == [silent]
    assert evaluating.process.returncode == 0 and not evaluating.failed()
    assert silent.exit_reason().endswith("s before it began to stop"), silent.exit_reason()
    assert said == ["waiting for peer-0 (evaluating) to finish, up to 20 s in all "
                    "(--grace SECONDS sets a fixed grace)"]  # fmt: skip


def test_the_default_grace_has_an_upper_bound(tmp_path: Path) -> None:
    swarm = Swarm(ARGS, tmp_path)
    saving = finishing_peer(swarm, 0, "saving", 60)
    assert swarm.stop(base_s=0.1, limit_s=0.5) == [saving]
    assert saving.exit_reason() == "killed after the grace of 0.5 s while saving"


@pytest.mark.parametrize("grace", ["-1", "nan"])
def test_a_bad_grace_is_one_line(grace: str, capsys: pytest.CaptureFixture[str]) -> None:
    from peer.app.launch import main

    with pytest.raises(SystemExit) as exit:
        main(["--grace", grace])
    assert exit.value.code == 2
    assert capsys.readouterr().err.startswith("gossipnet launch: error: --grace: must be seconds")
