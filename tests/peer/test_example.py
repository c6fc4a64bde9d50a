"""examples/embed_peer.py runs as a real OS process and its three peers learn; a bad flag is
refused (in this process)."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_embed_example_rejects_bad_arguments(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script as ``__main__`` in this process (runpy): the same parser and check, without
    a Python and torch start-up of its own (the run above is the real process)."""
    monkeypatch.setattr(sys, "argv", ["embed_peer.py", "--steps", "2"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(ROOT / "examples" / "embed_peer.py"), run_name="__main__")
    assert exited.value.code == 2 and "--steps must be >= 5" in capsys.readouterr().err
