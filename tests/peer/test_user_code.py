"""A practitioner's path with real processes: your own model file and an ``.npz`` data set
through ``launch --save-model``, ``export RUN`` and ``load_model``, which gives back the
accuracy the run reported. (Peers started before the one they join find it: every launch
starts them so, and tests/peer/test_rejoin.py checks it alone.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

MODEL_FILE = textwrap.dedent(
    """
    import math

    from torch import nn


    class Net(nn.Module):
        def __init__(self, input_shape, num_classes, hidden=32):
            super().__init__()
            self.body = nn.Sequential(
                nn.Flatten(),
                nn.Linear(math.prod(input_shape), hidden),
                nn.Tanh(),
                nn.Linear(hidden, num_classes),
            )

        def forward(self, x):
            return self.body(x)
    """
)


def _blobs(path: Path) -> None:
    """Three Gaussian blobs in 6 dimensions, keys ``x, y`` only: the loader holds out 20 %."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((3, 6)) * 3
    labels = np.arange(600) % 3
    np.savez(path, x=centres[labels] + rng.standard_normal((600, 6)), y=labels)


def test_launch_save_model_export_and_load_model_give_the_accuracy_the_run_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newcomer's path from their own folder: ``launch --model mymodel.py:Net --dataset
    blobs.npz --save-model``, then ``gossipnet export RUN`` and ``gossipnet.load_model`` with
    no factory: the averaged model gives the accuracy launch printed and recorded, and no
    file they take home names this machine's paths."""
    (tmp_path / "mymodel.py").write_text(MODEL_FILE)
    _blobs(tmp_path / "blobs.npz")
    env = {k: v for k, v in os.environ.items() if k != "GOSSIPNET_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    result = subprocess.run(
        [sys.executable, "-m", "gossipnet", "launch", "--peers", "2", "--model", "mymodel.py:Net",
         "--dataset", "blobs.npz", "--steps", "15", "--lr", "0.1",
         "--save-model", "swarm.safetensors", "--dir", "run", "--progress", "none", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(result.stdout.splitlines()[-1])
    reported = results["model_evaluation"]
    assert results["model"] == "swarm.safetensors" and reported["test_samples"] == 120
    assert f"its test accuracy {100 * reported['test_accuracy']:.1f}%" in result.stderr
    document = json.loads((tmp_path / "swarm.json").read_text())
    assert document["evaluation"] == reported
    assert document["model"]["spec"] == "mymodel.py:Net"
    assert document["data"]["dataset"] == "blobs.npz"

    import gossipnet
    from peer.app.export import main as export
    from workloads import evaluate, load_dataset

    monkeypatch.chdir(tmp_path)  # where the user's code is: the file re-imports it from here
    assert export(["run", "--out", "exported.safetensors", "--dataset", "blobs.npz"]) == 0
    exported = json.loads((tmp_path / "exported.json").read_text())
    assert [s["path"] for s in exported["averaged_from"]] == [
        "run/peer-0.safetensors",
        "run/peer-1.safetensors",
    ]
    assert exported["evaluation"] == reported  # the same two models, the same average
    data = load_dataset("blobs.npz")
    for name in ("swarm.safetensors", "exported.safetensors"):
        model = gossipnet.load_model(name)
        assert type(model).__name__ == "Net"
        scores = evaluate(model, data.x_test, data.y_test, data.task)
        assert scores["accuracy"] == reported["test_accuracy"]
        assert scores["loss"] == pytest.approx(reported["test_loss"], rel=1e-6)
    for text in (tmp_path / "swarm.json").read_text(), (tmp_path / "exported.json").read_text():
        assert str(tmp_path) not in text and "cache_dir" not in text
