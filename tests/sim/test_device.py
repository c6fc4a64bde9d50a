"""The simulator's ``device``: validation, the CLI flag, and every per-round tensor following
the peers' parameters.

A CPU-only machine cannot run CUDA, but it can catch the bug class that breaks a GPU run: a
tensor made on the default device (the CPU) next to tensors on the parameters' device. Under
``with torch.device("meta")`` every tensor made without an explicit device lands on the meta
device, which holds no data: mixing one with the CPU run's tensors, or reading a value out of
it, raises. So a run that completes under it, with the same records as a plain run, made
every tensor on the parameters' device (or on an explicit CPU for seeded draws and sizes).
The tests marked ``cuda`` run the same experiments on a GPU where there is one.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gossipnet.cli import main as gossipnet_main
from sim.algorithms import OptimizerConfig
from sim.batched import BatchedPeers
from sim.build import build
from sim.config import (
    ByzantineConfig,
    ConfigError,
    ExperimentConfig,
    NetworkConfig,
    WorkloadConfig,
    experiment_from_dict,
)
from sim.metrics import Record
from sim.runner import run
from workloads import build_model, resolve_device

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
cpu_only = pytest.mark.skipif(CUDA, reason="checks the error on a machine without CUDA")

BASE = ExperimentConfig(
    rounds=2,
    eval_every=1,
    workload=WorkloadConfig(
        dataset="synthetic:num_samples=300,seed=0", peers=8, batch_size=4, model="mlp:hidden=16"
    ),
)


def _with(config: ExperimentConfig = BASE, **algorithm: object) -> ExperimentConfig:
    return dataclasses.replace(config, algorithm=dataclasses.replace(config.algorithm, **algorithm))  # type: ignore[arg-type]


CASES: dict[str, ExperimentConfig] = {
    name: BASE.with_algorithm(name)
    for name in (
        "centralized",
        "allreduce",
        "parameter-server",
        "async-parameter-server",
        "easgd",
        "dpsgd",
        "local-sgd",
        "push-sum",
        "choco",
        "ad-psgd",
    )
}
CASES |= {
    "fedavg-half": _with(BASE.with_algorithm("fedavg"), fraction=0.5),
    "dpsgd-atc-qsgd": _with(order="adapt-then-combine", compressor="qsgd"),
    "dpsgd-qsgd-feedback": _with(compressor="qsgd:bits=4,feedback=true"),
    "choco-randk": _with(BASE.with_algorithm("choco"), compressor="randk:ratio=0.1"),
    "push-sum-exponential": _with(BASE.with_algorithm("push-sum"), topology="one-peer-exponential"),
    "dpsgd-loss-crash": dataclasses.replace(
        BASE,
        network=NetworkConfig(message_loss=0.2, crashes=({"peer": 2, "at": 0.0, "rejoin": 0.015},)),
    ),
    "adam-cnn1d-independent": dataclasses.replace(
        BASE,
        optimizer=OptimizerConfig(name="adam", lr=0.01),
        workload=dataclasses.replace(BASE.workload, model="cnn1d", init="independent"),
    ),
}
for _rule, _attack in (
    ("trimmed-mean", "alie"),
    ("krum", "gaussian"),
    ("bucketing+median", "sign-flip"),
    ("clipped-gossip", "garbage"),
):
    CASES[f"byzantine-{_rule}-{_attack}"] = dataclasses.replace(
        _with(aggregator=_rule, topology="complete"),
        byzantine=ByzantineConfig(count=1, attack=_attack),
    )


def _records(config: ExperimentConfig, *, default_device: str | None = None) -> list[Record]:
    algorithm, ctx, evaluation = build(config)
    evaluation = dataclasses.replace(evaluation, peer_limit=3)  # the seeded subset too
    if default_device is None:
        return run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=1)
    with torch.device(default_device):
        return run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=1)


def _same(a: list[Record], b: list[Record], *, tolerance: float = 0.0) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key, value in x.as_dict().items():
            other = y.as_dict()[key]
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(other), key
            elif isinstance(value, float):
                assert other == pytest.approx(value, rel=tolerance, abs=tolerance), key
            else:
                assert other == value, key


@pytest.mark.parametrize("case", list(CASES))
def test_every_round_tensor_follows_the_parameters_device(case: str) -> None:
    config = CASES[case]
    _same(_records(config, default_device="meta"), _records(config))


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if CUDA else "cpu")
    for bad in ("gpu", "CUDA", "cuda:", "cuda:x", "", "cpu:0", 0):
        with pytest.raises(ValueError, match=r"device must be auto, cpu, cuda or cuda:INDEX"):
            resolve_device(bad)  # type: ignore[arg-type]


@cpu_only
def test_cuda_without_cuda_is_a_clear_error() -> None:
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device(spec)
    config = dataclasses.replace(BASE, device="cuda")  # a valid file, for a machine with a GPU
    with pytest.raises(ConfigError, match=r"^device: .*CUDA is not available"):
        build(config)


def test_config_names_the_device_field() -> None:
    assert ExperimentConfig().device == "cpu"
    for bad in ("gpu", "cuda:one", 1, None):
        with pytest.raises(
            ConfigError, match=r"^device: got .*; allowed: auto, cpu, cuda, cuda:INDEX"
        ):
            ExperimentConfig(device=bad)  # type: ignore[arg-type]
    assert experiment_from_dict({"device": "auto"}).device == "auto"
    with pytest.raises(ConfigError, match=r"^device: "):
        experiment_from_dict({"device": "tpu"})


def test_auto_runs_where_the_parameters_are() -> None:
    config = dataclasses.replace(BASE, device="auto")
    _, ctx, evaluation = build(config)
    expected = torch.device("cuda" if CUDA else "cpu")
    assert ctx.device.type == expected.type
    assert ctx.x_train.device.type == expected.type
    assert evaluation.x_test.device.type == expected.type
    assert ctx.byzantine.device.type == expected.type


def test_batched_peers_initial_weights_do_not_depend_on_the_device() -> None:
    def factory() -> torch.nn.Module:
        return build_model("mlp:hidden=8", (5,), 3, seed=0)

    here = BatchedPeers(factory, 4, init="independent", seed=2, device="cpu")
    assert here.params.device == torch.device("cpu")
    if CUDA:
        there = BatchedPeers(factory, 4, init="independent", seed=2, device="cuda")
        assert there.params.device.type == "cuda"
        assert torch.equal(there.params.cpu(), here.params)
        assert all(b.device.type == "cuda" for b in there.buffers.values())


@cpu_only
def test_cli_device_flag_and_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run in a real process; the mistakes through the same entry point in-process
    (``gossipnet.cli.main``), which saves a Python start-up each."""
    path = tmp_path / "exp.toml"
    path.write_text(
        'rounds = 1\neval_every = 1\ndevice = "cpu"\n[workload]\n'
        'dataset = "synthetic:num_samples=200"\npeers = 4\nbatch_size = 4\nmodel = "logistic"\n',
        encoding="utf-8",
    )

    def gossipnet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gossipnet", "sim", "run", str(path), "--quiet", *args],
            capture_output=True,
            text=True,
            timeout=110,
            cwd=tmp_path,
        )

    def in_process(*args: str) -> tuple[int, str]:
        try:
            code = gossipnet_main(["sim", "run", str(path), "--quiet", *args])
        except SystemExit as exit:
            assert isinstance(exit.code, int)
            code = exit.code
        return code, capsys.readouterr().err

    ok = gossipnet("--device", "auto")
    assert ok.returncode == 0, ok.stderr
    monkeypatch.chdir(tmp_path)
    code, err = in_process("--device", "cuda")
    assert code == 2, err
    assert "device: device 'cuda': CUDA is not available" in err
    assert "Traceback" not in err
    code, err = in_process("--device", "tpu")
    assert code == 2, err
    assert "device: got 'tpu'; allowed: auto, cpu, cuda, cuda:INDEX" in err
    assert "Traceback" not in err
    path.write_text(path.read_text().replace('device = "cpu"', 'device = "gpu"'))
    code, err = in_process()
    assert code == 2 and "device: got 'gpu'; allowed: auto, cpu, cuda, cuda:INDEX" in err


@needs_cuda
@pytest.mark.parametrize("case", ["dpsgd", "allreduce", "byzantine-trimmed-mean-alie", "choco"])
def test_cuda_matches_cpu(case: str) -> None:
    config = CASES[case]
    on_gpu = _records(dataclasses.replace(config, device="cuda"))
    on_cpu = _records(config)
    # simulated time, bytes and steps are exact; accuracies and losses up to float rounding
    for a, b in zip(on_cpu, on_gpu, strict=True):
        assert (a.time, a.steps, a.bytes_total, a.bytes_busiest) == (
            b.time,
            b.steps,
            b.bytes_total,
            b.bytes_busiest,
        )
    _same(on_cpu, on_gpu, tolerance=1e-3)
