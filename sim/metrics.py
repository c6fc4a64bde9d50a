"""What the simulator measures at each evaluation, and where it writes it.

All model metrics are over the honest peers only (Byzantine peers' own models do not count):

- ``test_accuracy`` / ``test_loss``: of the honest peers' average model x̄ = (1/m) Σ_i x_i;
- ``peer_accuracy_mean`` / ``peer_accuracy_worst``: each honest peer's own model, evaluated
  together in one ``vmap`` (a seeded subset when there are more than ``peer_limit``);
- ``consensus_distance``: (1/m) Σ_i ‖x_i − x̄‖², how far the peers are from agreeing;
- ``time``: simulated seconds; ``bytes_total`` / ``bytes_busiest``: bytes sent by all peers
  and by the busiest one (a server counts as one busy peer).

Records go to JSON lines or CSV; plots (matplotlib, imported only inside the plotting
functions) show accuracy against simulated time and against bytes, and consensus distance.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sim.batched import BatchedPeers


@dataclass(frozen=True)
class Record:
    """One evaluation point of one run."""

    algorithm: str
    round: int
    time: float
    steps: int
    bytes_total: float
    bytes_busiest: float
    test_accuracy: float
    test_loss: float
    peer_accuracy_mean: float
    peer_accuracy_worst: float
    consensus_distance: float
    train_loss: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS = tuple(f.name for f in fields(Record))


def consensus_distance(models: Tensor, *, block_rows: int = 64) -> float:
    """(1/m) Σ_i ‖x_i − x̄‖² of models ``[m, d]`` (0 for a single model).

    x̄ and the sum are accumulated in float64; rows are visited ``block_rows`` at a time, so
    no ``[m, d]`` temporary is made.
    """
    m = models.shape[0]
    if m <= 1:
        return 0.0
    mean = models.sum(dim=0, dtype=torch.float64) / m
    total = 0.0
    for start in range(0, m, block_rows):
        block = models[start : start + block_rows].double() - mean
        total += float(block.square().sum())
    return total / m


@dataclass(frozen=True)
class Evaluation:
    """How to evaluate: the test set and how many peers' own models to evaluate at most."""

    x_test: Tensor
    y_test: Tensor
    peer_limit: int = 64
    batch_size: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.peer_limit, int) or self.peer_limit < 1:
            raise ValueError(f"peer_limit: must be an integer >= 1, got {self.peer_limit!r}")

    def measure(self, peers: BatchedPeers, models: Tensor) -> dict[str, float]:
        """Average-model and per-peer accuracy, loss and consensus distance of ``models [m, d]``."""
        average = models.mean(dim=0, keepdim=True)
        accuracy, loss = peers.evaluate(
            self.x_test, self.y_test, average, batch_size=self.batch_size
        )
        if models.shape[0] == 1:
            per_peer = accuracy
        else:
            rows = models
            if models.shape[0] > self.peer_limit:
                generator = torch.Generator().manual_seed(self.seed)
                pick = torch.randperm(models.shape[0], generator=generator, device="cpu")
                pick = pick[: self.peer_limit]
                rows = models[pick.to(models.device)]
            per_peer, _ = peers.evaluate(self.x_test, self.y_test, rows, batch_size=self.batch_size)
        return {
            "test_accuracy": float(accuracy[0]),
            "test_loss": float(loss[0]),
            "peer_accuracy_mean": float(per_peer.mean()),
            "peer_accuracy_worst": float(per_peer.min()),
            "consensus_distance": consensus_distance(models),
        }


def write_jsonl(records: Iterable[Record], path: str | Path) -> None:
    """One JSON object per line (NaN written as null)."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for record in records:
            row = {
                k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in record.as_dict().items()
            }
            handle.write(json.dumps(row) + "\n")


def read_jsonl(path: str | Path) -> list[Record]:
    """The records :func:`write_jsonl` wrote."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row: dict[str, Any] = json.loads(line)
            values: dict[str, Any] = {k: (math.nan if v is None else v) for k, v in row.items()}
            records.append(Record(**values))
    return records


def write_csv(records: Iterable[Record], path: str | Path) -> None:
    """A header row of :data:`COLUMNS`, then one row per record."""
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for record in records:
            writer.writerow(record.as_dict())


def plot(
    runs: Mapping[str, Sequence[Record]], path: str | Path, *, title: str | None = None
) -> Path:
    """Three panels: test accuracy vs simulated time, vs bytes sent, and consensus distance vs
    time, one line per run. matplotlib is imported here and only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, records in runs.items():
        time = [r.time for r in records]
        axes[0].plot(time, [r.test_accuracy for r in records], label=name)
        axes[1].plot(
            [r.bytes_total for r in records], [r.test_accuracy for r in records], label=name
        )
        distance = [max(r.consensus_distance, 1e-30) for r in records]
        axes[2].plot(time, distance, label=name)
    axes[0].set(xlabel="simulated time (s)", ylabel="test accuracy of the average model")
    axes[1].set(xlabel="bytes sent by all peers", ylabel="test accuracy of the average model")
    axes[1].set_xscale("symlog")
    axes[2].set(xlabel="simulated time (s)", ylabel="consensus distance", yscale="log")
    for axis in axes:
        axis.grid(alpha=0.3)
    axes[0].legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
