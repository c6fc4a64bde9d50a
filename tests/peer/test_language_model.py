"""A language model in a peer: its evaluation reports loss and bits per byte, a real peer
process trains the gpt on text, and the model it saves generates text in one line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peer.node.model_file import load_model, sidecar_path
from peer.node.trainer import Trainer, is_language_model
from workloads import build_model, cross_entropy, evaluate, generate, load_dataset

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"language-model-test-swarm-secret-0123"


def test_a_trainer_reports_loss_and_bits_per_byte_of_a_language_model() -> None:
    data = load_dataset("text:context=16,max_bytes=20000")
    model = build_model("gpt:layers=1,width=16,heads=2", data.input_shape, 256, seed=0)
    trainer = Trainer(
        model, lambda p: torch.optim.SGD(p, lr=0.1), cross_entropy, [], torch.device("cpu")
    )
    result = trainer.evaluate(data.x_test, data.y_test, batch_size=7)
    expected = evaluate(model, data.x_test, data.y_test, data.task, batch_size=50)
    assert result["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert result["bits_per_byte"] == pytest.approx(result["loss"] / math.log(2))
    assert result["accuracy"] == pytest.approx(expected["accuracy"])
    assert result["samples"] == data.num_test
    assert is_language_model(model(data.x_test[:2]), data.y_test[:2])
    classifier = Trainer(
        torch.nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        cross_entropy,
        [],
        torch.device("cpu"),
    )
    scores = classifier.evaluate(torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]))
    assert scores["bits_per_byte"] is None and scores["accuracy"] is not None


@pytest.mark.timeout(300)
def test_a_peer_trains_a_gpt_on_text_and_its_model_generates(tmp_path: Path) -> None:
    model_file = tmp_path / "lm.safetensors"
    report = tmp_path / "eval.json"
    dataset = "text:context=32,max_bytes=60000"
    env = {**os.environ, "GOSSIPNET_SECRET": SECRET.decode()}
    command = [sys.executable, "-m", "gossipnet", "peer", "--id", "solo", "--dataset", dataset,
               "--model", "gpt:layers=1,width=32,heads=2", "--steps", "60", "--batch-size", "16",
               "--lr", "0.1", "--status-every", "30", "--progress", "lines",
               "--eval-out", str(report), "--save-model", str(model_file)]  # fmt: skip
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    reported = json.loads(report.read_text())
    assert reported["test_bits_per_byte"] == pytest.approx(reported["test_loss"] / math.log(2))
    assert reported["test_bits_per_byte"] < 6.0  # an untrained byte model scores about 8
    final = json.loads(result.stdout.strip().splitlines()[-1])
    assert final["test_bits_per_byte"] == reported["test_bits_per_byte"]
    document = json.loads(sidecar_path(model_file).read_text())
    assert document["evaluation"]["test_bits_per_byte"] == reported["test_bits_per_byte"]

    model = load_model(model_file)  # the documented one-liner: generate(load_model(FILE), ...)
    data = load_dataset(dataset)
    scores = evaluate(model, data.x_test, data.y_test, data.task)
    assert scores["bits_per_byte"] == pytest.approx(reported["test_bits_per_byte"], rel=1e-5)
    text = generate(model, "def ", 40, temperature=0.8, seed=0)
    assert len(text.encode("utf-8", "surrogateescape")) == 40
    assert text == generate(load_model(model_file), "def ", 40, temperature=0.8, seed=0)


def test_launchs_table_shows_bits_per_byte_for_a_language_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from peer.app.report import print_results, title

    peer = {"id": "peer-0", "step": 10, "test_accuracy": 0.3, "test_loss": 2.0,
            "test_bits_per_byte": 2.0 / math.log(2), "exchanges_ok": 4, "exchanges_failed": 0}  # fmt: skip
    results = {
        "task": "language-model",
        "num_classes": 256,
        "peers": [peer],
        "centralized": {
            "test_accuracy": 0.31,
            "test_loss": 1.9,
            "samples": 40,
            "error": None,
            "test_bits_per_byte": 1.9 / math.log(2),
        },
        "mean_test_accuracy": 0.3,
        "mean_test_bits_per_byte": peer["test_bits_per_byte"],
        "steps": 10,
    }
    args = argparse.Namespace(steps=10, batch_size=4, peers=1)
    assert title(results, args).startswith("validation bits per byte after 10 steps")
    print_results(results, args)
    table = capsys.readouterr().out
    assert "val. bits/byte" in table and "2.885" in table and "+0.144" in table
    assert "%" not in table
