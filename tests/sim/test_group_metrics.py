"""Per-group metrics: each value against a direct computation, Byzantine members left out,
records that carry them through JSON lines and CSV as flat, documented columns."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from sim.build import build
from sim.config import experiment_from_dict
from sim.group_metrics import GroupMetrics, class_correct
from sim.metrics import (
    COLUMNS,
    Record,
    columns,
    consensus_distance,
    group_rows,
    read_jsonl,
    write_csv,
    write_jsonl,
)
from sim.runner import run

from .helpers import make_context

GROUPS = {"low": (0, 1, 2), "high": (3, 4, 5), "edge": (2, 3)}
CLASSES = {"low": (0, 1, 2, 3, 4), "high": (5, 6, 7, 8, 9), "edge": (4, 5)}


def _models(n: int, seed: int = 0) -> tuple[object, object, torch.Tensor]:
    ctx, evaluation = make_context(n, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(ctx.peers.params.shape, generator=generator)
    return ctx, evaluation, ctx.peers.params + 0.5 * noise


def _accuracy(ctx, evaluation, models: torch.Tensor, classes: tuple[int, ...] | None = None):  # type: ignore[no-untyped-def]
    x, y = evaluation.x_test, evaluation.y_test
    if classes is not None:
        keep = torch.isin(y, torch.tensor(classes))
        x, y = x[keep], y[keep]
    accuracy, _ = ctx.peers.evaluate(x, y, models)
    return accuracy


def test_every_group_metric_equals_its_direct_computation() -> None:
    ctx, evaluation, models = _models(6)
    metrics = GroupMetrics(GROUPS, classes=CLASSES, num_classes=10)
    honest = torch.ones(6, dtype=torch.bool)
    out = metrics.measure(ctx.peers, evaluation.x_test, evaluation.y_test, models, honest)
    for name, members in GROUPS.items():
        rows = models[list(members)]
        average = rows.mean(dim=0, keepdim=True)
        assert out[f"group/{name}/accuracy"] == pytest.approx(
            float(_accuracy(ctx, evaluation, average)[0]), abs=1e-12
        )
        worst = float(_accuracy(ctx, evaluation, rows).min())
        assert out[f"group/{name}/worst_peer_accuracy"] == pytest.approx(worst, abs=1e-12)
        assert out[f"group/{name}/consensus_distance"] == consensus_distance(rows)
        for other, classes in CLASSES.items():
            on = float(_accuracy(ctx, evaluation, average, classes)[0])
            assert out[f"group/{name}/accuracy_on/{other}"] == pytest.approx(on, abs=1e-12)
    low = models[[0, 1, 2]].double().mean(0)
    high = models[[3, 4, 5]].double().mean(0)
    edge = models[[2, 3]].double().mean(0)
    assert out["group/low/distance_to/high"] == pytest.approx(float((low - high).square().sum()))
    assert out["group/low/distance_to/edge"] == pytest.approx(float((low - edge).square().sum()))
    assert out["group/high/distance_to/edge"] == pytest.approx(float((high - edge).square().sum()))
    assert "group/high/distance_to/low" not in out  # each pair once, in the file's order
    assert len(out) == 3 * (3 + 3) + 3


def test_byzantine_members_do_not_count_and_a_byzantine_group_is_skipped() -> None:
    ctx, evaluation, models = _models(6, seed=1)
    honest = torch.tensor([True, True, True, True, False, False])
    groups = {"mixed": (2, 3, 4), "bad": (4, 5)}
    metrics = GroupMetrics(groups, classes=None, num_classes=10)
    rows_of_honest = models[honest]  # what an algorithm's models() returns: honest rows
    out = metrics.measure(ctx.peers, evaluation.x_test, evaluation.y_test, rows_of_honest, honest)
    assert set(out) == {
        "group/mixed/accuracy",
        "group/mixed/worst_peer_accuracy",
        "group/mixed/consensus_distance",
    }
    average = models[[2, 3]].mean(0, keepdim=True)
    assert out["group/mixed/accuracy"] == pytest.approx(
        float(_accuracy(ctx, evaluation, average)[0]), abs=1e-12
    )
    assert out["group/mixed/consensus_distance"] == consensus_distance(models[[2, 3]])


def test_one_shared_model_serves_every_group() -> None:
    ctx, evaluation, models = _models(4, seed=2)
    metrics = GroupMetrics({"a": (0, 1), "b": (2, 3)}, classes={"a": (0,), "b": (1, 2)})
    one = models[:1]  # a baseline keeps one model
    out = metrics.measure(
        ctx.peers, evaluation.x_test, evaluation.y_test, one, torch.ones(4, dtype=torch.bool)
    )
    accuracy = float(_accuracy(ctx, evaluation, one)[0])
    assert out["group/a/accuracy"] == out["group/b/accuracy"] == pytest.approx(accuracy)
    assert out["group/a/worst_peer_accuracy"] == pytest.approx(accuracy)
    assert out["group/a/consensus_distance"] == 0.0
    assert out["group/a/distance_to/b"] == 0.0
    with pytest.raises(ValueError, match=r"models: expected one row per honest peer \(4\)"):
        metrics.measure(
            ctx.peers, evaluation.x_test, evaluation.y_test, models[:3], torch.ones(4).bool()
        )


def test_the_worst_peer_is_taken_over_a_seeded_subset_of_a_large_group() -> None:
    ctx, evaluation, models = _models(8, seed=3)
    honest = torch.ones(8, dtype=torch.bool)
    everyone = GroupMetrics({"all": tuple(range(8))}, peer_limit=8)
    some = GroupMetrics({"all": tuple(range(8))}, peer_limit=3, seed=5)
    full = everyone.measure(ctx.peers, evaluation.x_test, evaluation.y_test, models, honest)
    part = some.measure(ctx.peers, evaluation.x_test, evaluation.y_test, models, honest)
    again = some.measure(ctx.peers, evaluation.x_test, evaluation.y_test, models, honest)
    assert part == again
    assert part["group/all/worst_peer_accuracy"] >= full["group/all/worst_peer_accuracy"]
    assert part["group/all/accuracy"] == full["group/all/accuracy"]


def test_class_correct_counts_right_answers_per_class() -> None:
    ctx, evaluation, models = _models(3, seed=4)
    counts = class_correct(
        ctx.peers, evaluation.x_test, evaluation.y_test, models, 10, batch_size=7
    )
    accuracy = _accuracy(ctx, evaluation, models)
    total = evaluation.y_test.numel()
    torch.testing.assert_close(counts.sum(1) / total, accuracy.double(), rtol=0, atol=1e-12)
    for c in (0, 5):
        on = _accuracy(ctx, evaluation, models, (c,))
        size = int((evaluation.y_test == c).sum())
        torch.testing.assert_close(counts[:, c] / size, on.double(), rtol=0, atol=1e-12)


def _record(round_: int, groups: dict[str, float]) -> Record:
    return Record("dpsgd", round_, 0.1, 1, 2.0, 1.0, 0.5, 1.0, 0.5, 0.4, 0.0, math.nan, groups)


def test_records_carry_group_metrics_as_flat_columns_through_jsonl_and_csv(
    tmp_path: Path,
) -> None:
    records = [
        _record(0, {}),
        _record(5, {"group/a/accuracy": 0.5, "group/a/accuracy_on/b": 0.0}),
        _record(10, {"group/a/accuracy": 0.75, "group/a/distance_to/b": 2.5}),
    ]
    expected = (*COLUMNS, "group/a/accuracy", "group/a/accuracy_on/b", "group/a/distance_to/b")
    assert columns(records) == expected
    assert records[1].as_dict()["group/a/accuracy_on/b"] == 0.0
    write_jsonl(records, tmp_path / "run.jsonl")
    back = read_jsonl(tmp_path / "run.jsonl")
    assert [r.group_metrics for r in back] == [r.group_metrics for r in records]
    assert math.isnan(back[0].train_loss)
    write_csv(records, tmp_path / "run.csv")
    with (tmp_path / "run.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == expected
    assert rows[0]["group/a/accuracy"] == "" and rows[2]["group/a/distance_to/b"] == "2.5"


def test_group_rows_make_a_long_table() -> None:
    rows = group_rows([_record(5, {"group/a/accuracy": 0.5, "group/a/accuracy_on/b": 0.25})])
    assert rows == [
        {"algorithm": "dpsgd", "round": 5, "time": 0.1, "group": "a", "metric": "accuracy", "other": None, "value": 0.5},
        {"algorithm": "dpsgd", "round": 5, "time": 0.1, "group": "a", "metric": "accuracy_on", "other": "b", "value": 0.25},
    ]  # fmt: skip


def test_a_group_key_must_say_it_is_one() -> None:
    with pytest.raises(ValueError, match=r"group_metrics: every key starts with 'group/'"):
        _record(1, {"accuracy": 0.5})
    with pytest.raises(ValueError, match=r"record: unknown column 'acuracy'"):
        Record.from_dict({**_record(1, {}).as_dict(), "acuracy": 0.5})


def test_a_run_with_groups_records_them_at_every_evaluation() -> None:
    config = experiment_from_dict(
        {
            "rounds": 4,
            "eval_every": 2,
            "groups": {"left": "0-2", "right": "3-5"},
            "workload": {
                "dataset": "synthetic:num_samples=600",
                "model": "logistic",
                "peers": 6,
                "partition": "label-sets",
                "label_sets": {"left": "0-4", "right": "5-9"},
            },
            "algorithm": {"name": "dpsgd", "topology": "dumbbell"},
        }
    )
    algorithm, ctx, evaluation = build(config)
    records = run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=config.eval_every)
    keys = {
        f"group/{g}/{m}" for g in ("left", "right") for m in ("accuracy", "worst_peer_accuracy", "consensus_distance")
    } | {f"group/{g}/accuracy_on/{h}" for g in ("left", "right") for h in ("left", "right")} | {
        "group/left/distance_to/right"
    }  # fmt: skip
    assert [r.round for r in records] == [0, 2, 4]
    assert all(set(r.group_metrics) == keys for r in records)
    # each clique's data is only its classes: after a few rounds a clique's model is better
    # on its own classes than on the other clique's
    last = records[-1].group_metrics
    assert last["group/left/accuracy_on/left"] > last["group/left/accuracy_on/right"]
    assert last["group/right/accuracy_on/right"] > last["group/right/accuracy_on/left"]
    # a baseline keeps one model: its groups agree exactly
    baseline = config.with_algorithm("allreduce")
    algorithm, ctx, evaluation = build(baseline)
    shared = run(algorithm, ctx, evaluation, rounds=2, eval_every=2)[-1].group_metrics
    assert shared["group/left/accuracy"] == shared["group/right/accuracy"]
    assert shared["group/left/distance_to/right"] == 0.0


def test_group_metrics_make_no_tensor_on_the_default_device() -> None:
    """Every tensor the group metrics make names its device: under ``torch.device("meta")``
    (where a tensor made without one lands, and a GPU run would break) they equal a plain
    evaluation's, with a Byzantine member and the seeded worst-peer subset."""
    config = experiment_from_dict(
        {
            "rounds": 2,
            "groups": {"left": "0-2", "right": "3-5", "bad": [5]},
            "workload": {
                "dataset": "synthetic:num_samples=300",
                "model": "logistic",
                "peers": 6,
                "partition": "label-sets:sets=0-4|5-9",
            },
            "algorithm": {"name": "dpsgd", "topology": "complete"},
            "byzantine": {"groups": ["bad"], "attack": "sign-flip"},
        }
    )
    algorithm, ctx, evaluation = build(config)
    assert evaluation.groups is not None
    evaluation = dataclasses.replace(
        evaluation, groups=dataclasses.replace(evaluation.groups, peer_limit=2)
    )
    run(algorithm, ctx, evaluation, rounds=2, eval_every=2)
    models = algorithm.models(ctx)
    plain = evaluation.measure_groups(ctx.peers, models, ctx.honest)
    with torch.device("meta"):
        meta = evaluation.measure_groups(ctx.peers, models, ctx.honest)
    assert meta == plain
    assert "group/bad/accuracy" not in plain  # its only member is Byzantine
    assert "group/left/accuracy_on/bad" in plain  # its classes still count
