"""``gossipnet consensus`` in a real OS process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import consensus

ROOT = Path(__file__).resolve().parents[2]


def gossipnet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gossipnet", "consensus", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_lists_every_rule_and_attack() -> None:
    result = gossipnet()
    assert result.returncode == 0, result.stderr
    for name in [*consensus.AGGREGATORS, *consensus.ATTACKS]:
        assert f"\n  {name}" in result.stdout
    assert "bucketing:s=2,seed=0+RULE" in result.stdout


def test_help_shows_the_registry() -> None:
    result = gossipnet("--help")
    assert result.returncode == 0
    assert "--aggregator SPEC" in result.stdout
    assert "trimmed-mean:b=1,n=none" in result.stdout
    assert "alie:f=1,n=none,z=none" in result.stdout


def test_checks_a_composed_spec() -> None:
    result = gossipnet("--aggregator", "nnm+krum:f=2", "--attack", "alie:z=1.5")
    assert result.returncode == 0, result.stderr
    assert "NearestNeighbourMixing(f=2, inner=Krum(f=2))" in result.stdout
    assert "ALittleIsEnough(" in result.stdout and "z=1.5" in result.stdout


def test_a_bad_spec_is_one_line_and_exit_code_2() -> None:
    result = gossipnet("--aggregator", "krum:f=2,n=6")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "gossipnet consensus: error: krum needs n > 2f+2, got n=6, f=2"
    )
    result = gossipnet("--attack", "lie")
    assert result.returncode == 2
    assert "unknown attack 'lie'; choices: sign-flip" in result.stderr
