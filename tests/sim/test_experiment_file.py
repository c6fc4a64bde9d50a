"""What an experiment file can say about a paper's setup: a user graph, named groups, label
sets, chosen Byzantine peers; each key validated with an error that names it."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import topologies
from sim.build import build, build_schedule, byzantine_mask, honest_neighbourhood
from sim.config import ConfigError, ExperimentConfig, experiment_from_dict, load_experiment

RING_WITH_BYZANTINE = {
    "rounds": 2,
    "workload": {"dataset": "synthetic:num_samples=300", "model": "logistic", "peers": 9},
    "algorithm": {"name": "dpsgd", "topology": "graph", "aggregator": "trimmed-mean:b=2"},
    # honest 0-2 on a ring, each with two Byzantine leaves: i ~ i + 3, i ~ i + 6
    "graph": {"edges": [[0, 1], [1, 2], [2, 0], [0, 3], [1, 4], [2, 5], [0, 6], [1, 7], [2, 8]]},
    "byzantine": {"peers": ["3-8"], "attack": "alie:z=10"},
}

DUMBBELL = {
    "rounds": 2,
    "groups": {"left": "0-2", "right": [3, 4, "5"]},
    "workload": {
        "dataset": "synthetic:num_samples=600",
        "model": "logistic",
        "peers": 6,
        "partition": "label-sets",
        "label_sets": {"left": "0-4", "right": "5-9"},
    },
    "algorithm": {"name": "dpsgd", "topology": "dumbbell"},
}


def data_of(config: ExperimentConfig) -> dict[str, Any]:
    """The nested tables of a config (``dataclasses.asdict``), the form a sweep edits."""
    data = dataclasses.asdict(config)
    data["graph"] = {k: v for k, v in data["graph"].items() if v is not None}
    return data


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with ``section__key=value`` (or top-level ``key=value``) set;
    a value of ``None`` removes the key."""
    data = copy.deepcopy(base)
    for name, value in changes.items():
        where, _, key = name.rpartition("__")
        table = data.setdefault(where, {}) if where else data
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return data


# --------------------------------------------------------------------------- a user graph


def test_a_graph_file_is_read_from_the_experiment_files_folder(tmp_path: Path) -> None:
    folder = tmp_path / "paper"
    folder.mkdir()
    (folder / "ring.edges").write_text("# a ring\n0 1\n1 2\n2 3\n3 0\n", encoding="utf-8")
    (folder / "exp.toml").write_text(
        '[workload]\npeers = 4\n[algorithm]\ntopology = "graph"\n[graph]\nfile = "ring.edges"\n',
        encoding="utf-8",
    )
    config = load_experiment(folder / "exp.toml")  # from another working directory
    assert config.graph is not None and config.graph.file == str(folder / "ring.edges")
    assert config.graph.edge_array().tolist() == [[0, 1], [1, 2], [2, 3], [3, 0]]
    assert config.topology == "graph"
    # the resolved table builds the same experiment again (as a sweep's records keep it)
    again = dataclasses.replace(config, seed=1)
    assert again.graph is not None and again.graph.edge_array().tolist() == [
        [0, 1],
        [1, 2],
        [2, 3],
        [3, 0],
    ]
    rebuilt = experiment_from_dict({**data_of(config)}, base_dir=tmp_path / "elsewhere")
    assert rebuilt.graph == config.graph
    expected = topologies.mixing_matrix(topologies.ring(4)).toarray()
    np.testing.assert_array_equal(build_schedule(config).mixing(0).toarray(), expected)


def test_an_inline_graph_with_lazy_metropolis_weights_runs_as_written() -> None:
    data = _with(DUMBBELL, algorithm__topology=None, algorithm__weights="lazy-metropolis")
    data["graph"] = {"nodes": 6, "edges": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0]]}
    config = experiment_from_dict(data)
    assert config.topology == "graph"  # the [graph] runs when no topology is named
    W = build_schedule(config).mixing(0).toarray()
    ring = topologies.mixing_matrix(topologies.ring(6)).toarray()
    np.testing.assert_allclose(W, (np.eye(6) + ring) / 2, atol=1e-15)


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        ({"edges": [[0, 1], [1, 9]]}, r"^graph\.edges: edge 1 \(1, 9\) names a node outside"),
        ({"edges": [[0, 1], [1, 1]]}, r"^graph\.edges: edge 1 \(1, 1\) is a self-loop"),
        ({"edges": [[0, 1], [1, 0]]}, r"^graph\.edges: edge 1 \(1, 0\) repeats edge 0"),
        ({"edges": [[0, 1], [2, 3], [4, 5]]}, r"^graph\.edges: the graph is not connected"),
        ({"edges": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]], "directed": True}, "strongly"),
        ({"edges": [[0, "1"]]}, r"^graph\.edges: edge 0 must be a pair of non-negative node ids"),
        ({"edges": "0 1"}, r"^graph\.edges: must be a list of pairs"),
        ({}, r"^graph: give exactly one of graph\.file .* or graph\.edges"),
        ({"file": "a.edges", "edges": [[0, 1]]}, r"^graph: give exactly one"),
        ({"edges": [[0, 1]], "directed": "yes"}, r"^graph\.directed: must be true or false"),
        ({"edges": [[0, 1]], "nodes": 5}, r"^graph\.nodes: must equal workload\.peers = 6"),
        ({"file": "absent.edges"}, r"^graph\.file: no such edge-list file"),
        (
            {"edges": [[0, 1]], "weights": "x"},
            r"^graph\.weights: unknown key in \[graph\]; allowed: ",
        ),
    ],
)
def test_a_bad_graph_is_refused_naming_its_key(
    graph: dict[str, Any], message: str, tmp_path: Path
) -> None:
    data = _with(DUMBBELL, algorithm__topology="graph")
    data["graph"] = graph
    with pytest.raises(ConfigError, match=message):
        experiment_from_dict(data, base_dir=tmp_path)


def test_a_bad_line_of_a_graph_file_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "g.edges").write_text("0 1\n1 2 3\n", encoding="utf-8")
    data = _with(DUMBBELL, algorithm__topology="graph")
    data["graph"] = {"file": "g.edges"}
    with pytest.raises(ConfigError, match=r"^graph\.file: .*g\.edges, line 2: expected two"):
        experiment_from_dict(data, base_dir=tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"algorithm__topology": "ring"}, r"^algorithm\.topology: the experiment has a \[graph\]"),
        (
            {"algorithm__topology": "graph", "algorithm__topology_params": {"degree": 2}},
            r"^algorithm\.topology_params: a \[graph\]",
        ),
        ({"algorithm__name": "allreduce", "algorithm__topology": None}, r"^graph: a user graph"),
    ],
)
def test_a_graph_conflicts_with_other_topology_keys(changes: dict[str, Any], message: str) -> None:
    data = _with(DUMBBELL, **changes)
    data["graph"] = {"edges": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0]]}
    with pytest.raises(ConfigError, match=message):
        experiment_from_dict(data)


def test_topology_graph_without_a_graph_table_is_refused() -> None:
    with pytest.raises(ConfigError, match=r'^algorithm\.topology: "graph" runs the \[graph\]'):
        experiment_from_dict(_with(DUMBBELL, algorithm__topology="graph"))


def test_a_directed_graph_needs_row_stochastic_weights_unless_push_sum() -> None:
    # 0 -> 1 -> 2 -> 0 and 0 -> 2: node 0 sends to two, the others to one
    data = _with(DUMBBELL, workload__peers=3, groups=None, algorithm__topology="graph")
    data["workload"].pop("label_sets")
    data["workload"]["partition"] = "iid"
    data["graph"] = {"edges": [[0, 1], [1, 2], [2, 0], [0, 2]], "directed": True}
    with pytest.raises(ConfigError, match=r"^graph\.directed: dpsgd averages with row-stoch"):
        build_schedule(experiment_from_dict(data))
    push_sum = _with(data, algorithm__name="push-sum")
    W = build_schedule(experiment_from_dict(push_sum)).mixing(0).toarray()
    np.testing.assert_allclose(W.sum(axis=0), 1.0)  # column-stochastic push weights
    regular = _with(data, graph={"edges": [[0, 1], [1, 2], [2, 0]], "directed": True})
    build_schedule(experiment_from_dict(regular))  # in = out degree: doubly stochastic


def test_sim_compare_runs_a_baseline_without_the_graph() -> None:
    data = _with(DUMBBELL, algorithm__topology="graph")
    data["graph"] = {"edges": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0]]}
    config = experiment_from_dict(data)
    assert config.with_algorithm("allreduce").graph is None
    assert config.with_algorithm("push-sum").graph == config.graph


# --------------------------------------------------------------------------- groups


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"left": "0-9"}, r"^groups\.left: peer 9 is outside 0\.\.5"),
        ({"1st": [0]}, r"^groups\.1st: a group name is a letter or '_'"),
        ({"left": []}, r"^groups\.left: the set is empty"),
        ({"left": "2-0"}, r"^groups\.left: range '2-0' is empty"),
        ({"left": [0.5]}, r"^groups\.left: expected ids and ranges"),
    ],
)
def test_bad_groups_are_named(groups: dict[str, Any], message: str) -> None:
    data = _with(DUMBBELL, groups=groups)
    with pytest.raises(ConfigError, match=message):
        experiment_from_dict(data)


def test_groups_are_normalized_to_ascending_ids() -> None:
    config = experiment_from_dict(DUMBBELL)
    assert dict(config.groups) == {"left": (0, 1, 2), "right": (3, 4, 5)}


# --------------------------------------------------------------------------- label sets


def test_label_sets_by_group_and_by_peer_id() -> None:
    config = experiment_from_dict(DUMBBELL)
    assert config.peer_labels() == [(0, 1, 2, 3, 4)] * 3 + [(5, 6, 7, 8, 9)] * 3
    by_id = _with(DUMBBELL, workload__label_sets={"left": "0-4", "3": "5-7", "4": [8, 9], "5": "9"})
    labels = experiment_from_dict(by_id).peer_labels()
    assert labels is not None and labels[3:] == [(5, 6, 7), (8, 9), (9,)]
    spec = _with(DUMBBELL, workload__label_sets=None, workload__partition="label-sets:sets=0-4|5-9")
    assert experiment_from_dict(spec).peer_labels() == config.peer_labels()
    assert (
        experiment_from_dict(
            _with(DUMBBELL, workload__label_sets=None, workload__partition="iid")
        ).peer_labels()
        is None
    )


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"label_sets": {"left": "0-4"}}, r"^workload\.label_sets: peers 3, 4, 5 are given no"),
        ({"label_sets": {"left": "0-4", "right": "5-9", "4": "1"}}, r"^workload\.label_sets\.4: peer 4 already takes its labels from workload\.label_sets\.right"),
        ({"label_sets": {"middle": "0-4"}}, r"^workload\.label_sets\.middle: got 'middle', neither a group name nor a peer id; allowed: left, right, 0\.\.5"),
        ({"label_sets": {"left": "0-4", "right": "9-5"}}, r"^workload\.label_sets\.right: range '9-5' is empty"),
        ({"label_sets": {"left": "0-4", "right": "5-9"}, "partition": "iid"}, r'^workload\.label_sets: is read by partition = "label-sets"'),
        ({"label_sets": None}, r'^workload\.partition: "label-sets" needs the label sets'),
        ({"label_sets": {}}, r"^workload\.label_sets: must be a non-empty table"),
        ({"label_sets": None, "partition": "label-sets:sets=0-4|5-9|1|2|3|4|5"}, r"^workload\.partition: label-sets: sets gives 7 label sets for 6 peers"),
    ],
)  # fmt: skip
def test_bad_label_sets_are_named(workload: dict[str, Any], message: str) -> None:
    data = _with(DUMBBELL, **{f"workload__{key}": value for key, value in workload.items()})
    with pytest.raises(ConfigError, match=message):
        experiment_from_dict(data)


def test_a_label_that_is_not_a_class_of_the_data_is_refused_when_built() -> None:
    data = _with(DUMBBELL, workload__label_sets={"left": "0-4", "right": "5-10"})
    config = experiment_from_dict(data)  # the classes are known once the data set is made
    with pytest.raises(ConfigError, match=r"^workload\.label_sets: label-sets: label 10 is not"):
        build(config)


# --------------------------------------------------------------------------- Byzantine peers


def test_byzantine_peers_by_id_by_group_or_at_random() -> None:
    by_id = experiment_from_dict(RING_WITH_BYZANTINE)
    assert by_id.byzantine_peers() == (3, 4, 5, 6, 7, 8)
    assert np.flatnonzero(byzantine_mask(by_id)).tolist() == [3, 4, 5, 6, 7, 8]
    by_group = _with(RING_WITH_BYZANTINE, byzantine__peers=None, byzantine__groups=["a", "b"])
    by_group["groups"] = {"a": "3-5", "b": [6, 7, 8, 5]}
    assert experiment_from_dict(by_group).byzantine_peers() == (3, 4, 5, 6, 7, 8)
    both = _with(by_group, byzantine__peers=[0], byzantine__groups=["b"])
    assert experiment_from_dict(both).byzantine_peers() == (0, 5, 6, 7, 8)
    drawn = _with(
        RING_WITH_BYZANTINE, byzantine__peers=None, byzantine__count=2, algorithm__aggregator=None
    )
    config = experiment_from_dict(drawn)
    assert config.byzantine_peers() is None
    generator = torch.Generator().manual_seed(config.seed)
    expected = sorted(torch.randperm(9, generator=generator)[:2].tolist())
    assert np.flatnonzero(byzantine_mask(config)).tolist() == expected  # the seeded draw


@pytest.mark.parametrize(
    ("byzantine", "message"),
    [
        ({"count": 2}, r"^byzantine\.count: give either count .* not both"),
        ({"peers": ["3-9"]}, r"^byzantine\.peers: peer 9 is outside 0\.\.8"),
        ({"peers": "0-8"}, r"^byzantine\.peers: must be < workload\.peers = 9 .*got 9"),
        ({"peers": None, "groups": ["evil"]}, r"^byzantine\.groups: unknown group 'evil'; allowed: none"),
        ({"peers": None, "groups": "evil"}, r"^byzantine\.groups: must be a list of group names"),
        ({"peers": None, "groups": []}, r"^byzantine\.groups: is empty"),
        ({"peers": ["x"]}, r"^byzantine\.peers: 'x' is not an id"),
    ],
)  # fmt: skip
def test_bad_byzantine_choices_are_named(byzantine: dict[str, Any], message: str) -> None:
    data = _with(RING_WITH_BYZANTINE, **{f"byzantine__{k}": v for k, v in byzantine.items()})
    with pytest.raises(ConfigError, match=message):
        experiment_from_dict(data)


def test_chosen_byzantine_peers_need_a_synchronous_gossip_algorithm() -> None:
    data = _with(RING_WITH_BYZANTINE, algorithm__name="fedavg", algorithm__topology=None)
    data["algorithm"].pop("aggregator")
    data.pop("graph")
    with pytest.raises(ConfigError, match=r"^byzantine\.peers: Byzantine peers are simulated"):
        experiment_from_dict(data)


# --------------------------------------------------------------------------- the size check


def test_the_robust_rules_size_check_counts_honest_receivers_only() -> None:
    """Byzantine leaves have one neighbour (2 models) but never aggregate; every honest node
    has 5, so trimmed-mean:b=2 (needs n > 4) runs. Counting the leaves refused it."""
    config = experiment_from_dict(RING_WITH_BYZANTINE)
    schedule = build_schedule(config)  # no error
    assert topologies.smallest_neighbourhood(schedule) == 2  # what the old check saw
    assert honest_neighbourhood(schedule, ~byzantine_mask(config)) == 5
    too_strong = _with(RING_WITH_BYZANTINE, algorithm__aggregator="trimmed-mean:b=3")
    with pytest.raises(ConfigError, match=r"^algorithm\.aggregator: .*n > 2b.*5 models"):
        build_schedule(experiment_from_dict(too_strong))
    # honest leaves do count: make one leaf honest and b=2 no longer fits it
    leaf_honest = _with(RING_WITH_BYZANTINE, byzantine__peers=["4-8"])
    with pytest.raises(ConfigError, match=r"^algorithm\.aggregator: .*as few as 1 neighbour"):
        build_schedule(experiment_from_dict(leaf_honest))


def test_the_ring_with_byzantine_leaves_builds_and_runs() -> None:
    from sim.runner import run

    algorithm, ctx, evaluation = build(experiment_from_dict(RING_WITH_BYZANTINE))
    assert ctx.byzantine.nonzero().squeeze(1).tolist() == [3, 4, 5, 6, 7, 8]
    records = run(algorithm, ctx, evaluation, rounds=2, eval_every=1)
    assert len(records) == 3 and all(np.isfinite(r.test_accuracy) for r in records)


def test_an_experiment_dataclass_validates_groups_too() -> None:
    with pytest.raises(ConfigError, match=r"^groups\.a: peer 20 is outside"):
        ExperimentConfig(groups={"a": (20,)})


def test_sparseloco_off_the_complete_graph_is_said_at_build_and_not_on_it() -> None:
    ring = _with(DUMBBELL, algorithm__name="sparseloco", algorithm__topology="ring")
    with pytest.warns(UserWarning, match=r"^sparseloco on topology 'ring': its slow weights"):
        build_schedule(experiment_from_dict(ring))
    complete = _with(ring, algorithm__topology="complete")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_schedule(experiment_from_dict(complete))
