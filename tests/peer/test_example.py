"""examples/embed_peer.py runs as a real OS process and its three peers learn."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_embed_example_runs_and_learns() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embed_peer.py"), "--steps", "25"],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("step")]
    assert len(lines) == 5
    accuracies = [float(a) for a in re.search(r"test acc ([\d. ]+)", lines[-1])[1].split()]
    assert len(accuracies) == 3 and min(accuracies) > 0.5  # 10 classes: chance is 0.1


def test_embed_example_rejects_bad_arguments() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embed_peer.py"), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2 and "--steps must be >= 5" in result.stderr
