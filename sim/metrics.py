"""What the simulator measures at each evaluation, and where it writes it.

All model metrics are over the honest peers only (Byzantine peers' own models do not count):

- ``test_accuracy`` / ``test_loss``: of the honest peers' average model x̄ = (1/m) Σ_i x_i;
- ``peer_accuracy_mean`` / ``peer_accuracy_worst``: each honest peer's own model, evaluated
  together in one ``vmap`` (a seeded subset when there are more than ``peer_limit``);
- a language model's records (:data:`LANGUAGE_MODEL_COLUMNS`) also have
  ``test_bits_per_byte`` (``test_loss / ln 2``, the average model's validation bits per byte)
  and ``peer_bits_per_byte_mean`` / ``peer_bits_per_byte_worst`` (the peers' own models; worst
  is highest); for them ``test_loss`` is the validation loss per byte in nats and the
  accuracies are next-byte top-1 accuracies;
- ``consensus_distance``: (1/m) Σ_i ‖x_i − x̄‖², how far the peers are from agreeing;
- ``time``: simulated seconds; ``bytes_total`` / ``bytes_busiest``: bytes sent by all peers
  and by the busiest one (a server counts as one busy peer);
- ``diverged_at``: the round at which the run's honest models stopped being finite, on
  every record of a run that diverged (:mod:`sim.divergence`; the run ended there), else
  ``None`` (an empty cell in CSV, null in JSON);
- a DP-SGD run's records (``[privacy]``, :data:`PRIVACY_COLUMNS`) also have ``epsilon`` and
  ``privacy_stopped_at``;
- the last record of a run with ``[audit]`` has the audits' results (:data:`AUDIT_COLUMNS`);
- ``group_metrics``: when the experiment names groups of peers (``[groups]``), each group's
  accuracy, worst member, inner consensus distance, accuracy on each group's classes and
  distance to the other groups, under flat keys ``group/<name>/<metric>[/<other group>]``
  (:mod:`sim.group_metrics` defines them); empty otherwise.

A record is one row per evaluation: :meth:`Record.as_dict` puts the group metrics beside the
fixed columns (:data:`COLUMNS`), so JSON lines and CSV (:func:`columns`: the fixed columns,
then every group column in the order first seen) stay tidy tables with one column per
measured quantity; :func:`group_rows` gives the group metrics as a long table, one row per
(evaluation, group, metric, other group). Plots (matplotlib, imported only inside the plotting
functions) show accuracy against simulated time and against bytes, and consensus distance.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from sim.batched import BatchedPeers
from workloads.task import CLASSIFICATION, LANGUAGE_MODEL, bits_per_byte, task_named

if TYPE_CHECKING:
    from sim.group_metrics import GroupMetrics

#: The prefix of every per-group key of :attr:`Record.group_metrics`.
GROUP_PREFIX = "group/"


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
    group_metrics: Mapping[str, float] = field(default_factory=dict)
    diverged_at: int | None = None
    test_bits_per_byte: float | None = None
    peer_bits_per_byte_mean: float | None = None
    peer_bits_per_byte_worst: float | None = None
    epsilon: float | None = None
    privacy_stopped_at: int | None = None
    membership_auc: float | None = None
    membership_auc_max: float | None = None
    membership_advantage: float | None = None
    membership_advantage_max: float | None = None
    reconstruction_cosine: float | None = None
    reconstruction_cosine_max: float | None = None
    epsilon_pair: float | None = None
    epsilon_pair_muffliato: float | None = None

    def __post_init__(self) -> None:
        given = [getattr(self, name) is not None for name in LANGUAGE_MODEL_COLUMNS]
        if any(given) and not all(given):
            raise ValueError(
                f"{', '.join(LANGUAGE_MODEL_COLUMNS)}: a language model's record has all "
                "three, a classifier's none"
            )
        if self.diverged_at is not None and (
            isinstance(self.diverged_at, bool)
            or not isinstance(self.diverged_at, int)
            or self.diverged_at < 1
        ):
            raise ValueError(f"diverged_at: must be None or a round >= 1, got {self.diverged_at!r}")
        stray = [key for key in self.group_metrics if not key.startswith(GROUP_PREFIX)]
        if stray:
            raise ValueError(
                f"group_metrics: every key starts with {GROUP_PREFIX!r} "
                f"(group/<name>/<metric>[/<other>]), got {stray[0]!r}"
            )

    @property
    def task(self) -> str:
        """``"language-model"`` when the record has bits per byte, else ``"classification"``
        (:data:`workloads.task.TASKS`)."""
        return CLASSIFICATION if self.test_bits_per_byte is None else LANGUAGE_MODEL

    @property
    def headline(self) -> float:
        """The task's headline metric of the average model: test accuracy of a classifier,
        validation bits per byte of a language model."""
        return self.test_accuracy if self.test_bits_per_byte is None else self.test_bits_per_byte

    @property
    def worst_peer(self) -> float:
        """The headline metric of the worst honest peer's own model (lowest accuracy,
        highest bits per byte)."""
        if self.peer_bits_per_byte_worst is None:
            return self.peer_accuracy_worst
        return self.peer_bits_per_byte_worst

    def as_dict(self) -> dict[str, Any]:
        """The fixed columns, a language model's columns (:data:`LANGUAGE_MODEL_COLUMNS`) when
        it is one, then the group metrics under their own keys (one flat row)."""
        row = {name: getattr(self, name) for name in COLUMNS}
        if self.test_bits_per_byte is not None:
            row.update({name: getattr(self, name) for name in LANGUAGE_MODEL_COLUMNS})
        if self.epsilon is not None:
            row.update({name: getattr(self, name) for name in PRIVACY_COLUMNS})
        row.update(
            {name: getattr(self, name) for name in AUDIT_COLUMNS if getattr(self, name) is not None}
        )
        if self.epsilon_pair is not None:
            row.update({name: getattr(self, name) for name in PAIR_COLUMNS})
        row.update(self.group_metrics)
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Record:
        """The record :meth:`as_dict` wrote: the fixed columns, the ``group/`` keys into
        :attr:`group_metrics`; any other key is an error naming it."""
        fixed = {
            key: value
            for key, value in row.items()
            if key in COLUMNS
            or (key in OPTIONAL_COLUMNS and not _missing(value))  # blank in a mixed CSV
        }
        for name in ("diverged_at", "privacy_stopped_at"):
            value = fixed.get(name)
            if isinstance(value, float):  # JSON null read back as NaN, or 38.0 from a table
                fixed[name] = None if math.isnan(value) else int(value)
        groups = {key: float(value) for key, value in row.items() if key.startswith(GROUP_PREFIX)}
        unknown = sorted(set(row) - set(fixed) - set(groups) - set(OPTIONAL_COLUMNS))
        if unknown:
            raise ValueError(
                f"record: unknown column {unknown[0]!r}; allowed: {', '.join(COLUMNS)}, "
                f"{GROUP_PREFIX}... keys"
            )
        return cls(**fixed, group_metrics=groups)


def _missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


LANGUAGE_MODEL_COLUMNS = (
    "test_bits_per_byte",
    "peer_bits_per_byte_mean",
    "peer_bits_per_byte_worst",
)
"""The columns only a language model's records have: the average model's validation bits per
byte (``test_loss / ln 2``), and the honest peers' own models' mean and worst (highest)."""

PRIVACY_COLUMNS = ("epsilon", "privacy_stopped_at")
"""The columns only a DP-SGD run's records have (``[privacy]``, :mod:`sim.privacy`): ε at the
table's δ after the steps so far (the largest of any peer), and the round before which the run
stopped because one more would have passed the target ε (on every record of such a run)."""
AUDIT_COLUMNS = (
    "membership_auc",
    "membership_auc_max",
    "membership_advantage",
    "membership_advantage_max",
    "reconstruction_cosine",
    "reconstruction_cosine_max",
)
"""The columns of a run with ``[audit]`` (:mod:`sim.audit`), on its last record only: the
membership-inference attack's ROC AUC and advantage, and the batch-of-one reconstruction's
cosine similarity, each the mean over the honest peers and (``_max``) the worst peer's."""
PAIR_COLUMNS = ("epsilon_pair", "epsilon_pair_muffliato")
"""The columns of a DP-SGD run with ``[privacy] pair = [u, v]`` (:mod:`sim.pair_privacy`): ε
of u's data against v's exact view (workloads.network_privacy), and the Muffliato paper's sum for the same pair
(for comparison, not a guarantee), each at most ``epsilon``."""
OPTIONAL_COLUMNS = LANGUAGE_MODEL_COLUMNS + PRIVACY_COLUMNS + PAIR_COLUMNS + AUDIT_COLUMNS

COLUMNS = tuple(
    f.name for f in fields(Record) if f.name != "group_metrics" and f.name not in OPTIONAL_COLUMNS
)
"""The columns every record has (the group metrics come after them, see :func:`columns`)."""


def columns(records: Iterable[Record]) -> tuple[str, ...]:
    """:data:`COLUMNS`, :data:`LANGUAGE_MODEL_COLUMNS` when a record is a language model's,
    :data:`PRIVACY_COLUMNS` when one is a DP-SGD run's, :data:`PAIR_COLUMNS` when one has
    ``epsilon_pair``, the :data:`AUDIT_COLUMNS` a record has,
    then every group-metric key of ``records`` in the order first seen."""
    seen: dict[str, None] = {}
    language = private = False
    audits: list[set[str]] = []
    language = private = pair = False
    for record in records:
        audits.append({name for name in AUDIT_COLUMNS if getattr(record, name) is not None})
        language = language or record.test_bits_per_byte is not None
        private = private or record.epsilon is not None
        pair = pair or record.epsilon_pair is not None
        seen.update(dict.fromkeys(record.group_metrics))
    optional = (LANGUAGE_MODEL_COLUMNS if language else ()) + (PRIVACY_COLUMNS if private else ())
    optional += PAIR_COLUMNS if pair else ()
    audited = tuple(name for name in AUDIT_COLUMNS if any(name in row for row in audits))
    return COLUMNS + optional + audited + tuple(seen)


def group_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    """The group metrics as a long table: one row per (record, key) with the run's
    ``algorithm``, ``round`` and ``time``, the ``group``, the ``metric`` and the ``other``
    group it refers to (``None`` for ``accuracy``, ``worst_peer_accuracy`` and
    ``consensus_distance``), and the ``value``.

    >>> record = Record("dpsgd", 10, 1.0, 10, 0.0, 0.0, 0.5, 1.0, 0.5, 0.4, 0.0, 1.0,
    ...                 group_metrics={"group/a/accuracy_on/b": 0.25})
    >>> group_rows([record])[0]["metric"], group_rows([record])[0]["other"]
    ('accuracy_on', 'b')
    """
    rows = []
    for record in records:
        for key, value in record.group_metrics.items():
            group, metric, *other = key[len(GROUP_PREFIX) :].split("/")
            rows.append(
                {
                    "algorithm": record.algorithm,
                    "round": record.round,
                    "time": record.time,
                    "group": group,
                    "metric": metric,
                    "other": other[0] if other else None,
                    "value": value,
                }
            )
    return rows


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
    groups: GroupMetrics | None = None
    task: str = CLASSIFICATION

    def __post_init__(self) -> None:
        if not isinstance(self.peer_limit, int) or self.peer_limit < 1:
            raise ValueError(f"peer_limit: must be an integer >= 1, got {self.peer_limit!r}")
        task_named(self.task)

    def measure_groups(
        self, peers: BatchedPeers, models: Tensor, honest: Tensor
    ) -> dict[str, float]:
        """The per-group metrics of ``models`` (:class:`sim.group_metrics.GroupMetrics`), or
        none when the experiment names no groups."""
        if self.groups is None:
            return {}
        return self.groups.measure(peers, self.x_test, self.y_test, models, honest)

    def measure(self, peers: BatchedPeers, models: Tensor) -> dict[str, float]:
        """Average-model and per-peer accuracy, loss and consensus distance of ``models [m, d]``;
        for a language model also the bits per byte of :data:`LANGUAGE_MODEL_COLUMNS`."""
        average = models.mean(dim=0, keepdim=True)
        accuracy, loss = peers.evaluate(
            self.x_test, self.y_test, average, batch_size=self.batch_size
        )
        if models.shape[0] == 1:
            per_peer, per_peer_loss = accuracy, loss
        else:
            rows = models
            if models.shape[0] > self.peer_limit:
                generator = torch.Generator().manual_seed(self.seed)
                pick = torch.randperm(models.shape[0], generator=generator, device="cpu")
                pick = pick[: self.peer_limit]
                rows = models[pick.to(models.device)]
            per_peer, per_peer_loss = peers.evaluate(
                self.x_test, self.y_test, rows, batch_size=self.batch_size
            )
        measured = {
            "test_accuracy": float(accuracy[0]),
            "test_loss": float(loss[0]),
            "peer_accuracy_mean": float(per_peer.mean()),
            "peer_accuracy_worst": float(per_peer.min()),
            "consensus_distance": consensus_distance(models),
        }
        if self.task == LANGUAGE_MODEL:
            measured["test_bits_per_byte"] = bits_per_byte(float(loss[0]))
            measured["peer_bits_per_byte_mean"] = bits_per_byte(float(per_peer_loss.mean()))
            measured["peer_bits_per_byte_worst"] = bits_per_byte(float(per_peer_loss.max()))
        return measured


RUN_KEY = "run"
"""The key that names a record's run in a comparison's JSON lines (:func:`write_runs_jsonl`)."""


def _json_row(record: Record, run: str | None = None) -> str:
    row: dict[str, Any] = {} if run is None else {RUN_KEY: run}
    row.update(
        (k, None if isinstance(v, float) and math.isnan(v) else v)
        for k, v in record.as_dict().items()
    )
    return json.dumps(row) + "\n"


def write_jsonl(records: Iterable[Record], path: str | Path) -> None:
    """One JSON object per line, :meth:`Record.as_dict` (NaN written as null)."""
    with Path(path).open("w", encoding="utf-8") as handle:
        handle.writelines(_json_row(record) for record in records)


def write_runs_jsonl(runs: Mapping[str, Iterable[Record]], path: str | Path) -> None:
    """Several runs' records as :func:`write_jsonl` writes them, each line led by its run's
    name under :data:`RUN_KEY` (``sim compare``: named runs of one algorithm stay apart)."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for name, records in runs.items():
            handle.writelines(_json_row(record, name) for record in records)


def _read_rows(path: str | Path) -> Iterator[tuple[str | None, Record]]:
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row: dict[str, Any] = json.loads(line)
            name = row.pop(RUN_KEY, None)
            values: dict[str, Any] = {k: (math.nan if v is None else v) for k, v in row.items()}
            yield (None if name is None else str(name)), Record.from_dict(values)


def read_runs_jsonl(path: str | Path) -> dict[str, list[Record]]:
    """The runs :func:`write_runs_jsonl` wrote, by name, each in file order (lines without a
    run name, as :func:`write_jsonl` writes them, under their ``algorithm``)."""
    runs: dict[str, list[Record]] = {}
    for name, record in _read_rows(path):
        runs.setdefault(record.algorithm if name is None else name, []).append(record)
    return runs


def read_jsonl(path: str | Path) -> list[Record]:
    """The records :func:`write_jsonl` (or :func:`write_runs_jsonl`) wrote, in file order."""
    return [record for _, record in _read_rows(path)]


def write_csv(records: Iterable[Record], path: str | Path) -> None:
    """A header row of :func:`columns` (the fixed columns, then the group metrics), then one
    row per record; a group metric a record lacks is an empty cell."""
    every = list(records)
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns(every), restval="")
        writer.writeheader()
        for record in every:
            writer.writerow(record.as_dict())


# The figures live in sim.figures (axes chosen for the data); ``plot`` stays importable from
# here for sim.cli and older code. It imports matplotlib only when called.
from sim.figures import plot as plot  # noqa: E402
