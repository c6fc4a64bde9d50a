"""The generated table in docs/topologies.md is current, and the report runs as a module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from topologies import TOPOLOGIES
from topologies.report import markdown_table

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_matches_the_report() -> None:
    table = markdown_table()
    assert table in (ROOT / "docs" / "topologies.md").read_text(encoding="utf-8"), (
        "docs/topologies.md is stale: paste the output of `python -m topologies.report`"
    )
    for name in TOPOLOGIES:
        assert f"| `{name}`" in table
    exponential = next(line for line in table.splitlines() if line.startswith("| `exponential` "))
    assert "| 0.4 | 0.2857 | 0.2222 |" in exponential  # 2 / (1 + log2 n)


def test_report_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "topologies.report", "8", "16"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("| topology | degree | gap n=8 | gap n=16 |")
    assert len(result.stdout.splitlines()) == 2 + len(TOPOLOGIES)
