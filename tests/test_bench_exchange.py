"""``bench/exchange.py``'s ``--device``: checked before any process starts (the timings
themselves are read from the bench's table, never asserted in a test)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_exchange", ROOT / "bench" / "exchange.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "--device: device must be auto, cpu, cuda or cuda:INDEX, got 'tpu'"),
        ("cuda:x", "--device: device must be auto, cpu, cuda or cuda:INDEX, got 'cuda:x'"),
        ("cuda:99", "--device: device 'cuda:99': index must be < "),
    ],
)
def test_a_device_that_cannot_be_used_is_refused_naming_the_flag(
    device: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if device == "cuda:99" and not torch.cuda.is_available():
        message = "--device: device 'cuda:99': CUDA is not available on this machine"
    with pytest.raises(SystemExit) as exited:
        bench().main(["--device", device, "--sizes", "1"])
    assert exited.value.code == 2
    assert f"bench/exchange.py: error: {message}" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench().main(["--device", "cuda"])
    assert exited.value.code == 2
    err = capsys.readouterr()
    assert "--device: device 'cuda': CUDA is not available" in err.err and "gloo" not in err.out


def test_phase_means_are_taken_over_the_exchanges_between_two_readings() -> None:
    """Only what was observed after the first reading counts (the warm-up is left out), and
    a phase this side never timed is left out rather than shown as zero."""
    before = {("caller", "round_trip"): (0.5, 1), ("caller", "adopt"): (0.1, 1)}
    after = {
        ("caller", "round_trip"): (0.5 + 3 * 0.02, 4),
        ("caller", "adopt"): (0.1 + 3 * 0.004, 4),
        ("callee", "check"): (0.0, 0),
    }
    means = bench()._phase_means(before, after)
    assert means.keys() == {("caller", "round_trip"), ("caller", "adopt")}
    assert means["caller", "round_trip"] == pytest.approx(0.02)
    assert means["caller", "adopt"] == pytest.approx(0.004)


@pytest.mark.parametrize("paths", ["stream_answer,warp", "", "direct-reads"])
def test_an_unknown_fast_path_is_refused_naming_the_flag_and_the_known_ones(
    paths: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bench().main(["--ablate", "--paths", paths, "--sizes", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr()
    known = ", ".join(bench().PATHS)
    assert "stream_signed" in known and "direct_reads" in known
    assert f"--paths must be comma-separated names among {known}, got {paths!r}" in err.err
    assert "gloo" not in err.out and "path turned off" not in err.out


def test_a_path_pays_only_beyond_the_larger_spread() -> None:
    """The verdict compares the medians' difference with the larger IQR of the two."""
    verdict = bench().verdict
    steady = [0.100, 0.101, 0.102, 0.103, 0.104]
    assert verdict(steady, [t + 0.050 for t in steady]) == "pays"
    assert verdict([t + 0.050 for t in steady], steady) == "costs"
    assert verdict(steady, [t + 0.002 for t in steady]) == "noise"
    wide = [0.050, 0.090, 0.110, 0.150, 0.200]  # IQR 60 ms: a 30 ms gain is within it
    assert verdict(steady, [t + 0.030 for t in wide]) == "noise"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_ablation_prints_a_verdict_for_the_path_turned_off() -> None:
    """``--ablate`` end to end, for one path (each configuration in fresh processes: the full
    path, the path off, the full path again): it exits 0 only if every configuration leaves
    both peers bit-identical with the full path's model, and prints the path's row with a
    verdict. That every path turned off gives the full path's bits is
    tests/peer/test_exchange_fast_paths.py's (all of them, in one process)."""
    command = [sys.executable, str(ROOT / "bench" / "exchange.py"), "--ablate", "--sizes", "1.5"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*command, "--paths", "direct_reads", "--repeats", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    table = {row[1]: row for row in rows if row and row[0] == "1.5"}
    assert list(table) == ["direct_reads"]
    assert table["direct_reads"][-1] in ("pays", "costs", "noise")
