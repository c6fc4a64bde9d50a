"""Real ``gossipnet peer`` processes for the failure and rejoin tests: start one, read its
open status, wait for a condition (shared by test_failures.py and test_rejoin.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def start_peer(
    tmp_path: Path, name: str, index: int, *extra: str, secret: str, workload: Sequence[str]
) -> subprocess.Popen[bytes]:
    """``gossipnet peer --id NAME --peer-index INDEX`` writing its address to
    ``tmp_path/NAME.address`` and its output to ``NAME.out`` / ``NAME.err`` (appended)."""
    env = {**os.environ, "GOSSIPNET_SECRET": secret}
    command = [sys.executable, "-m", "gossipnet", "peer", "--id", name, "--peer-index", str(index),
               "--address-file", str(tmp_path / f"{name}.address"), *workload, *extra]  # fmt: skip
    with open(tmp_path / f"{name}.out", "ab") as out, open(tmp_path / f"{name}.err", "ab") as err:
        return subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT)


def status(address: str) -> dict[str, Any]:
    """The peer's open ``GET /v1/status``."""
    with urllib.request.urlopen(f"http://{address}/v1/status", timeout=5) as response:
        loaded = json.loads(response.read())
    assert isinstance(loaded, dict)
    return loaded


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 90) -> None:
    """Poll ``condition`` (connection errors count as not yet) until it holds or
    ``timeout`` seconds pass (then fail, naming ``what``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting until {what}")
