"""A SIGKILLed peer does not stop the others; restarted with --resume it rejoins (real processes)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from peer.app.swarm import free_ports

from .processes import start_peer, status, wait_until

SECRET = "failure-test-swarm-secret-0123456789"
WORKLOAD = ["--dataset", "synthetic:num_samples=600,seed=0", "--peers", "3",
            "--request-timeout-s", "2", "--status-every", "10"]  # fmt: skip
pytestmark = pytest.mark.slow


def start(tmp_path: Path, name: str, index: int, *extra: str) -> subprocess.Popen[bytes]:
    return start_peer(tmp_path, name, index, *extra, secret=SECRET, workload=WORKLOAD)


def member(address: str, peer_id: str) -> dict[str, Any]:
    return next((m for m in status(address)["neighbours"] if m["id"] == peer_id), {})


def test_sigkill_does_not_stop_the_others_and_resume_rejoins(tmp_path: Path) -> None:
    checkpoints = str(tmp_path / "c.checkpoints")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        # all three at once, as launch starts a swarm: a's port is chosen here and b and c
        # retry their join until a listens (not: a alone, training, while they start up)
        a = f"127.0.0.1:{free_ports(1)[0]}"
        processes.append(start(tmp_path, "a", 0, "--port", a.rpartition(":")[2]))
        processes.append(start(tmp_path, "b", 1, "--join", a))
        c_process = start(tmp_path, "c", 2, "--join", a, "--checkpoint-dir", checkpoints,
                          "--checkpoint-every", "10")  # fmt: skip
        processes.append(c_process)
        wait_until("a, b and c listen", lambda: all(
            (tmp_path / f"{x}.address").exists() for x in "abc"))  # fmt: skip
        assert (tmp_path / "a.address").read_text() == a
        b, c = (tmp_path / "b.address").read_text(), (tmp_path / "c.address").read_text()
        wait_until("c has checkpointed step 20", lambda: status(c)["step"] >= 25)
        wait_until("a knows c", lambda: member(a, "c").get("status") == "alive")
        c_process.send_signal(signal.SIGKILL)
        c_process.wait(timeout=10)
        steps = {address: status(address)["step"] for address in (a, b)}
        # a and b go on training and find c dead (suspected, then evicted)
        wait_until("a suspects c", lambda: member(a, "c").get("status") in ("suspected", "evicted"))
        wait_until("b suspects c", lambda: member(b, "c").get("status") in ("suspected", "evicted"))
        for address in (a, b):
            wait_until(f"{address} trains on", lambda x=address: status(x)["step"] >= steps[x] + 30)
        # c comes back from its newest checkpoint and rejoins
        (tmp_path / "c.address").unlink()
        processes.append(start(tmp_path, "c", 2, "--join", a, "--checkpoint-dir", checkpoints,
                               "--resume"))  # fmt: skip
        wait_until("c listens again", lambda: (tmp_path / "c.address").exists())
        c = (tmp_path / "c.address").read_text()
        resumed = re.search(r"resumed from \S+ at step (\d+)", (tmp_path / "c.out").read_text())
        assert resumed is not None
        k = int(resumed[1])
        assert k >= 20 and k % 10 == 0
        wait_until("c continues from its checkpoint", lambda: status(c)["step"] > k + 10)
        for address in (a, b):
            wait_until(f"{address} sees c alive", lambda x=address: member(x, "c") == {
                "id": "c", "address": c, "status": "alive"})  # fmt: skip
        for process in processes[:2] + processes[3:]:
            process.send_signal(signal.SIGTERM)
        for process in processes[:2] + processes[3:]:
            assert process.wait(timeout=60) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    final = [json.loads(line) for line in (tmp_path / "c.out").read_text().splitlines()
             if line.startswith("{")][-1]  # fmt: skip
    assert final["stopped"] is True and final["step"] > k + 10
