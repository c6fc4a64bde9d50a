"""A run whose models stop being finite ends cleanly at that round (sim.divergence).

The configurations diverge for real: plain SGD with a learning rate of 1e12 overflows an MLP's
weights within three rounds (its gradients grow with the weights through the layers).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from sim.algorithms import Context, RoundReport
from sim.build import build
from sim.cli import main
from sim.config import experiment_from_dict
from sim.divergence import EXIT_DIVERGED, Divergence, find_divergence, nonfinite_rows
from sim.metrics import Record, read_jsonl, write_jsonl
from sim.runner import run

DIVERGES = {
    "name": "diverges",
    "rounds": 20,
    "eval_every": 2,
    "workload": {
        "dataset": "synthetic:num_samples=400",
        "model": "mlp:hidden=8",
        "peers": 4,
        "batch_size": 8,
    },
    "optimizer": {"name": "sgd", "lr": 1e12},
}
"""Diverges at round 3 (all four peers' models overflow); the round-2 evaluation is finite."""


def _toml(data: dict, path: Path) -> Path:
    lines = [f"name = {json.dumps(data['name'])}"]
    lines += [f"{key} = {data[key]}" for key in ("rounds", "eval_every")]
    for section in ("workload", "optimizer"):
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in data[section].items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(data: dict) -> tuple[list[Record], list[Divergence]]:
    algorithm, ctx, evaluation = build(experiment_from_dict(data))
    seen: list[Divergence] = []
    records = run(
        algorithm,
        ctx,
        evaluation,
        rounds=data["rounds"],
        eval_every=data["eval_every"],
        on_diverge=seen.append,
    )
    return records, seen


def test_a_diverging_run_ends_at_that_round_and_keeps_what_it_recorded() -> None:
    records, seen = _run(DIVERGES)
    (divergence,) = seen
    assert divergence.round == 3
    assert divergence.peers == (0, 1, 2, 3) and divergence.models == 4
    # the evaluations before the divergence are kept, each marked with its round
    assert [r.round for r in records] == [0, 2]
    assert {r.diverged_at for r in records} == {3}
    assert all(math.isfinite(r.test_accuracy) for r in records)
    assert divergence.message() == (
        "diverged at round 3: 4 of 4 honest peers have a non-finite model (peers 0, 1, 2, 3)"
    )


def test_a_run_that_stays_finite_has_no_divergence() -> None:
    data = {**DIVERGES, "rounds": 4, "optimizer": {"name": "sgd", "lr": 0.1}}
    records, seen = _run(data)
    assert seen == []
    assert [r.round for r in records] == [0, 2, 4]
    assert all(r.diverged_at is None for r in records)


def test_only_honest_peers_count_and_ids_are_peer_ids() -> None:
    """Byzantine peers 0 and 2 send garbage; only the honest rows 1 and 3 are checked, and the
    ids named are theirs."""
    honest = torch.tensor([False, True, False, True])
    models = torch.zeros(2, 5)
    assert find_divergence(7, models, honest) is None
    models[1, 4] = float("nan")
    assert find_divergence(7, models, honest) == Divergence(7, (3,), 2)
    # every peer's rows (a gossip runner's parameters): the Byzantine rows are not looked at
    every = torch.zeros(4, 5)
    every[0] = every[2] = float("inf")
    assert find_divergence(7, every, honest) is None
    every[3, 0] = float("nan")
    assert find_divergence(7, every, honest) == Divergence(7, (3,), 2)
    # a baseline's single model: no peer to name
    single = find_divergence(2, torch.full((1, 3), float("inf")), honest)
    assert single == Divergence(2, (0,), 1)
    assert single.message() == "diverged at round 2: the model is non-finite"


def test_nonfinite_rows_checks_an_overflowing_sum_value_by_value() -> None:
    big = torch.finfo(torch.float32).max
    models = torch.tensor(
        [[big, big, 0.0], [1.0, float("inf"), 2.0], [0.0, 0.0, 0.0], [float("nan"), 0.0, 0.0]]
    )
    assert torch.isinf(models[0].sum())  # a finite row whose sum overflows is not a divergence
    assert nonfinite_rows(models).tolist() == [1, 3]
    with pytest.raises(ValueError, match=r"models: must be a \[m, d\] tensor"):
        nonfinite_rows(torch.zeros(3))


def test_a_long_list_of_peers_is_abbreviated() -> None:
    message = Divergence(5, tuple(range(12)), 20).message()
    assert message == (
        "diverged at round 5: 12 of 20 honest peers have a non-finite model "
        "(peers 0, 1, 2, 3, 4, 5, 6, 7, ... (4 more))"
    )


@dataclasses.dataclass
class _Steps:
    """A stand-in algorithm (no network involved): one model row per peer that takes the
    value ``values[r]`` in round r; round ``fail_at`` raises ``ValueError`` after writing it,
    as a rule does when the round's own local step made a model non-finite."""

    values: list[float]
    fail_at: int = -1
    name: str = "steps"

    def setup(self, ctx: Context) -> None:
        self.model = torch.zeros(ctx.n, ctx.peers.dim)

    def round(self, ctx: Context) -> RoundReport:
        self.model.fill_(self.values[ctx.round])
        if ctx.round == self.fail_at:
            raise ValueError("own contains NaN or Inf")
        return RoundReport(1.0, torch.zeros(ctx.n).numpy())

    def models(self, ctx: Context) -> torch.Tensor:
        return self.model[ctx.honest]


def _context() -> tuple[Context, object]:
    data = {**DIVERGES, "rounds": 1, "optimizer": {"name": "sgd", "lr": 0.1}}
    _algorithm, ctx, evaluation = build(experiment_from_dict(data))
    return ctx, evaluation


def test_a_round_that_fails_on_a_non_finite_model_is_the_divergence() -> None:
    ctx, evaluation = _context()
    algorithm = _Steps([0.0, 0.0, float("nan"), 0.0], fail_at=2)
    records = run(algorithm, ctx, evaluation, rounds=4, eval_every=1)  # type: ignore[arg-type]
    assert [r.round for r in records] == [0, 1, 2]
    assert {r.diverged_at for r in records} == {3}  # the third round could not finish


def test_any_other_error_of_a_round_is_raised() -> None:
    ctx, evaluation = _context()
    algorithm = _Steps([0.0, 0.0, 0.0], fail_at=1)
    with pytest.raises(ValueError, match="own contains NaN or Inf"):
        run(algorithm, ctx, evaluation, rounds=3, eval_every=1)  # type: ignore[arg-type]


def test_diverged_at_survives_json_lines(tmp_path: Path) -> None:
    records, _ = _run(DIVERGES)
    write_jsonl(records, tmp_path / "run.jsonl")
    assert read_jsonl(tmp_path / "run.jsonl")[-1].diverged_at == 3
    finite = dataclasses.replace(records[0], diverged_at=None)
    write_jsonl([finite], tmp_path / "finite.jsonl")
    assert read_jsonl(tmp_path / "finite.jsonl")[0].diverged_at is None
    with pytest.raises(ValueError, match="diverged_at: must be None or a round >= 1"):
        dataclasses.replace(finite, diverged_at=0)


def test_sim_run_writes_what_it_recorded_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _toml(DIVERGES, tmp_path / "diverges.toml")
    out = tmp_path / "run.csv"
    status = main(["run", str(path), "--quiet", "--csv", str(out)], prog="gossipnet sim")
    assert status == EXIT_DIVERGED == 3
    captured = capsys.readouterr()
    assert "gossipnet sim: diverges: diverged at round 3: 4 of 4 honest peers" in captured.err
    assert "diverged at" in captured.out and "round 3" in captured.out  # the table's column
    with out.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["round"] for row in rows] == ["0", "2"]
    assert {row["diverged_at"] for row in rows} == {"3"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_runs_the_other_runs_and_marks_the_diverged_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _toml({**DIVERGES, "rounds": 6}, tmp_path / "diverges.toml")
    out = tmp_path / "sweep"
    status = main(
        ["sweep", str(path), "--grid", "optimizer.lr=0.1,1e12", "--jobs", "1", "--out", str(out)],
        prog="gossipnet sim",
    )
    assert status == EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "sweep: run optimizer.lr=1000000000000.0 diverged at round 3" in err
    assert "sweep: 2/2 runs done (1 diverged) in " in err
    assert "1 run diverged" in err
    with (out / "results.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    by_lr: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_lr.setdefault(row["optimizer.lr"], []).append(row)
    assert [r["round"] for r in by_lr["0.1"]] == ["0", "2", "4", "6"]
    assert {r["diverged_at"] for r in by_lr["0.1"]} == {""}
    (diverged,) = set(by_lr) - {"0.1"}
    assert [r["round"] for r in by_lr[diverged]] == ["0", "2"]
    assert {r["diverged_at"] for r in by_lr[diverged]} == {"3"}
