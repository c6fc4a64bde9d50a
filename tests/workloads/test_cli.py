"""``gossipnet workloads``: ``list`` and a mistake as real OS processes, the rest in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workloads.cli import main

ROOT = Path(__file__).resolve().parents[2]


def gossipnet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gossipnet", "workloads", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_list_shows_every_registered_name_and_parameter() -> None:
    from workloads import DATASETS, MODELS, PARTITIONS

    result = gossipnet("list")
    assert result.returncode == 0, result.stderr
    for registry in (DATASETS, PARTITIONS, MODELS):
        for entry in registry.values():
            assert f"  {entry.name} " in result.stdout
            for name in entry.params:
                assert f"      {name}=" in result.stdout
    assert "path=(required)" in result.stdout


def test_inspect_prints_sizes_skew_and_parameter_count(capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (``list`` and a mistake run as real processes)."""
    dataset = "synthetic:num_samples=1000,num_classes=10,seed=0"
    argv = ["inspect", "--dataset", dataset, "--partition", "shards:shards_per_peer=1",
            "--peers", "8", "--model", "mlp-100k"]  # fmt: skip
    assert main(argv, "gossipnet workloads") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "dataset    Dataset(name='synthetic', train=800, test=200, input_shape=(20,), num_classes=10)"
    )
    assert "over 8 peers: samples per peer min 100 mean 100.0 max 100" in lines[1]
    # One label-sorted shard of 100 among classes of about 80 spans 2 or 3 classes.
    mean_classes = float(lines[1].split("classes per peer mean ")[1].split()[0])
    assert 1.0 <= mean_classes <= 3.0
    # 20 inputs: 20*291 + 291 + 291*291 + 291 + 291*10 + 10
    assert lines[2] == "model      mlp-100k: 94,003 parameters"


def test_inspect_iid_peers_see_every_class(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["inspect", "--dataset", "synthetic:num_samples=1000,seed=0", "--peers", "8"])
    assert code == 0
    assert "classes per peer mean 10.00 of 10" in capsys.readouterr().out


def test_bad_input_exits_2_with_one_line() -> None:
    result = gossipnet("inspect", "--dataset", "imagenet")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "gossipnet workloads: error: --dataset: unknown dataset 'imagenet'; allowed: cifar10"
    )
    assert len(result.stderr.strip().splitlines()) == 1  # no usage block
    assert "Traceback" not in result.stderr


def test_bad_input_messages(capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (
            ["inspect", "--dataset", "synthetic:num_samples=100", "--peers", "500"],
            "--partition: iid",
        ),
        (
            ["inspect", "--dataset", "synthetic:num_samples=100", "--model", "resnet"],
            "--model: unknown model",
        ),
        (["inspect", "--peers", "0"], "--peers must be >= 1, got 0"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv, "gossipnet workloads")
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
