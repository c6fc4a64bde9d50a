"""``bench/exchange.py``'s ``--device``: checked before any process starts (the timings
themselves are read from the bench's table, never asserted in a test)."""

from __future__ import annotations

import importlib.util
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
