"""A language model in the simulator: it trains, its records carry validation loss and bits
per byte, and its figures and targets use bits per byte (lower is better), not accuracy."""

from __future__ import annotations

import math
from pathlib import Path

from sim.build import build
from sim.config import experiment_from_dict
from sim.figures import draw_runs, target_accuracy, time_to_target
from sim.metrics import COLUMNS, LANGUAGE_MODEL_COLUMNS, columns, read_jsonl, write_jsonl
from sim.runner import run
from sim.sweep_figure import draw_sweep

EXPERIMENT = {
    "seed": 0,
    "workload": {
        "dataset": "text:context=16,max_bytes=40000",
        "partition": "iid",
        "model": "gpt:layers=1,width=16,heads=2",
        "peers": 4,
        "batch_size": 8,
    },
    "optimizer": {"name": "adam", "lr": 0.01},
    "algorithm": {"name": "dpsgd", "topology": "ring"},
}


def test_a_gpt_trains_with_dpsgd_and_records_bits_per_byte(tmp_path: Path) -> None:
    groups = {"groups": {"a": "0-1", "b": "2-3"}}
    config = experiment_from_dict({**EXPERIMENT, **groups, "rounds": 12, "eval_every": 6})
    records = run(*build(config), rounds=12, eval_every=6)
    first, last = records[0], records[-1]
    assert first.task == "language-model"
    assert 7.5 < first.test_bits_per_byte < 8.5  # an untrained byte model: about 8 bits
    assert last.test_bits_per_byte < first.test_bits_per_byte - 1.0  # it learns
    assert math.isclose(last.test_bits_per_byte, last.test_loss / math.log(2))
    assert last.peer_bits_per_byte_worst >= last.peer_bits_per_byte_mean
    assert (
        last.headline == last.test_bits_per_byte
        and last.worst_peer == last.peer_bits_per_byte_worst
    )
    # groups of peers work for a language model too (their accuracy is next-byte accuracy)
    assert first.group_metrics["group/a/accuracy"] == first.test_accuracy
    assert columns(records)[: len(COLUMNS) + 3] == COLUMNS + LANGUAGE_MODEL_COLUMNS
    write_jsonl(records, tmp_path / "records.jsonl")
    back = read_jsonl(tmp_path / "records.jsonl")
    assert back[1:] == records[1:]  # (the first has train_loss NaN, never equal to itself)
    assert back[0].test_bits_per_byte == first.test_bits_per_byte

    runs = {"dpsgd": records, "slower": records[:-1]}
    target = target_accuracy(runs, 0.9)  # lower is better: the best final / 0.9
    assert math.isclose(target, last.test_bits_per_byte / 0.9)
    assert time_to_target(records, target) is not None
    figure = draw_runs(runs)
    labels = {axis.get_ylabel() for axis in figure.axes}
    assert any(label.startswith("validation bits per byte") for label in labels)
    assert not any("accuracy" in label for label in labels)

    rows = [record.as_dict() for record in records]
    cells = {("ring", "0.01"): rows, ("ring", "0.1"): rows[:2], ("torus", "0.01"): "failed"}
    sweep = draw_sweep(["topology", "lr"], [["ring", "torus"], ["0.01", "0.1"]], cells, title="t")
    text = " ".join([sweep._suptitle.get_text()] + [axis.get_ylabel() for axis in sweep.axes])
    assert "bits per byte" in text and "accuracy" not in text
    bars = draw_sweep(["lr"], [["0.01"]], {("0.01",): rows}, title="t")
    assert bars.axes[0].get_xlim()[1] >= last.test_bits_per_byte


USER_MODEL = '''
import torch
from torch import nn


class Bigram(nn.Module):
    """Next-token logits from the current token alone: [B, L] -> [B, L, V]."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.table = nn.Embedding(num_classes, num_classes)

    def forward(self, tokens):
        return self.table(tokens)
'''


def test_user_code_language_model_trains_on_user_tokens_in_the_simulator(tmp_path: Path) -> None:
    import numpy as np

    (tmp_path / "bigram.py").write_text(USER_MODEL)
    stream = np.tile(np.arange(12), 300)  # token t is always followed by t + 1 (mod 12)
    np.savez(tmp_path / "tokens.npz", x=stream[:-1][:3584].reshape(-1, 16),
             y=stream[1:][:3584].reshape(-1, 16))  # fmt: skip
    config = experiment_from_dict(
        {
            **EXPERIMENT,
            "rounds": 30,
            "eval_every": 30,
            "workload": {
                **EXPERIMENT["workload"],
                "dataset": str(tmp_path / "tokens.npz"),
                "model": f"{tmp_path / 'bigram.py'}:Bigram",
            },
            "optimizer": {"name": "adam", "lr": 0.1},
        }
    )
    records = run(*build(config), rounds=30, eval_every=30)
    first, last = records[0], records[-1]
    assert first.task == "language-model"
    assert first.test_bits_per_byte > 3.0  # log2(12) = 3.58 for an untrained 12-token model
    assert last.test_bits_per_byte < 1.0 and last.test_accuracy > 0.95  # it learned t -> t+1
