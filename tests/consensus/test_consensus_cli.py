"""``gossipnet consensus``: listing the registry in a real OS process, the rest through the
command's entry point (``gossipnet.cli.main``) in this process (no Python start-up each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``gossipnet consensus ARGS`` in this process: exit code, stdout, stderr."""
    from gossipnet.cli import main

    try:
        code = main(["consensus", *args])
    except SystemExit as exited:
        assert isinstance(exited.code, int | None)
        code = exited.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def test_lists_every_rule_and_attack() -> None:
    result = gossipnet()
    assert result.returncode == 0, result.stderr
    for name in [*consensus.AGGREGATORS, *consensus.ATTACKS]:
        assert f"\n  {name}" in result.stdout
    assert "bucketing:s=2,seed=0+RULE" in result.stdout


def test_help_shows_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = in_process(capsys, "--help")
    assert code == 0
    assert "--aggregator SPEC" in out
    assert "trimmed-mean:b=1,n=none" in out
    assert "alie:f=1,n=none,z=none" in out


def test_checks_a_composed_spec(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = in_process(capsys, "--aggregator", "nnm+krum:f=2", "--attack", "alie:z=1.5")
    assert code == 0, err
    assert "NearestNeighbourMixing(f=2, inner=Krum(f=2))" in out
    assert "ALittleIsEnough(" in out and "z=1.5" in out


def test_a_bad_spec_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = in_process(capsys, "--aggregator", "krum:f=2,n=6")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "gossipnet consensus: error: krum needs n > 2f+2, got n=6, f=2"
    )
    code, _, err = in_process(capsys, "--attack", "lie")
    assert code == 2
    assert "unknown attack 'lie'; choices: sign-flip" in err
