"""Named runs: an experiment file's [compare] table, which `sim compare` runs side by side."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sim.cli import main
from sim.config import ConfigError, load_experiment
from sim.metrics import read_jsonl, read_runs_jsonl
from sim.sweep import named_runs_axis, plan_sweep

BASE = """
seed = 0
rounds = 3
[workload]
dataset = "synthetic:num_samples=200,seed=0"
model = "logistic"
peers = 4
[optimizer]
name = "adamw"
lr = 0.01
[algorithm]
name = "allreduce"
"""


def _file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(BASE + textwrap.dedent(extra))
    return path


def test_each_named_run_replaces_the_sections_it_gives_and_keeps_the_rest(tmp_path):
    path = _file(
        tmp_path,
        """
        [compare."data parallel"]
        algorithm = { name = "allreduce" }
        rounds = 30
        [compare.DiLoCo]
        algorithm = { name = "allreduce", local_steps = 10, outer_optimizer = "sgd:lr=0.7" }
        [compare.NoLoCo]
        algorithm = { name = "noloco", topology = "random-matching", local_steps = 10 }
        """,
    )
    plan = plan_sweep(path, [named_runs_axis(path)])
    by_label = {point.values["run"]: point.config for point in plan.points}
    assert list(by_label) == ["data parallel", "DiLoCo", "NoLoCo"]
    assert by_label["data parallel"].rounds == 30 and by_label["NoLoCo"].rounds == 3
    assert by_label["data parallel"].algorithm.outer_optimizer is None
    assert by_label["DiLoCo"].algorithm.outer_optimizer == "sgd:lr=0.7"
    noloco = by_label["NoLoCo"].algorithm
    assert (noloco.name, noloco.topology, noloco.gossip.consensus_step) == (
        "noloco",
        "random-matching",
        0.7,
    )
    assert all(config.optimizer.name == "adamw" for config in by_label.values())
    assert plan.describe() == "experiment: 4 peers"  # algorithm and rounds vary
    # `sim run` runs the file itself; the named runs are only checked
    assert load_experiment(path).algorithm.name == "allreduce"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ('[compare.x]\nalgorithm = "dpsgd"\n', "compare.x.algorithm"),
        ("[compare.x]\ntopology = 3\n", "compare.x.topology"),
        ("compare = 3\n", "compare"),
        ('[compare.x]\nalgorithm = { name = "noloco", outer_optimizer = "adam" }\n', None),
    ],
)
def test_a_bad_named_run_is_refused_with_its_field(tmp_path, extra, field):
    path = _file(tmp_path, extra)
    with pytest.raises((ConfigError, ValueError)) as caught:
        plan_sweep(path, [named_runs_axis(path)])
    if field is not None:
        assert str(caught.value).startswith(f"{field}:")
    else:
        assert "outer_optimizer" in str(caught.value)


def test_compare_without_a_choice_needs_named_runs(tmp_path, capsys):
    path = _file(tmp_path, "")
    with pytest.raises(SystemExit) as caught:
        main(["compare", str(path)])
    assert caught.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "[compare]" in error[0] and "--algorithms" in error[0]


def test_compare_keeps_named_runs_of_one_algorithm_apart_in_its_json_lines(tmp_path):
    path = _file(
        tmp_path,
        """
        [compare."H=1"]
        algorithm = { name = "allreduce" }
        [compare."H=2, Nesterov"]
        algorithm = { name = "allreduce", local_steps = 2, outer_optimizer = "sgd:lr=0.7,momentum=0.9,nesterov=true" }
        """,
    )
    out = tmp_path / "runs.jsonl"
    assert main(["compare", str(path), "--quiet", "--jsonl", str(out)]) == 0
    runs = read_runs_jsonl(out)
    assert list(runs) == ["H=1", "H=2, Nesterov"]
    assert {r.algorithm for rs in runs.values() for r in rs} == {"allreduce"}
    assert 2 * runs["H=1"][-1].steps == runs["H=2, Nesterov"][-1].steps  # 2 steps a round
    assert len(read_jsonl(out)) == sum(len(rs) for rs in runs.values())
