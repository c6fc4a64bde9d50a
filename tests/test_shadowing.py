"""``gossipnet`` refuses to run when a foreign package shadows one of its own (issue 19)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gossipnet.cli import OWN_PACKAGES, foreign_packages

ROOT = Path(__file__).resolve().parents[1]


def test_an_intact_install_has_no_foreign_packages() -> None:
    assert foreign_packages() == []


def test_a_package_shadowing_ours_is_named_and_the_command_exits_2(tmp_path: Path) -> None:
    impostor = tmp_path / "gossip"
    impostor.mkdir()
    (impostor / "__init__.py").write_text("# an unrelated project called gossip\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "gossipnet", "topology", "ring", "--nodes", "4"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"gossip (found at {impostor / '__init__.py'})" in lines[0]
    assert "dedicated virtual environment" in lines[0]
    assert "gossip" in OWN_PACKAGES
