"""Spec strings NAME[:KEY=VALUE,...]: one parser and builder for the simulator and the peer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import topologies
from topologies import (
    SCHEDULES,
    TOPOLOGIES,
    OnePeerExponential,
    RandomKOut,
    RandomMatching,
    Schedule,
    Static,
    TopologyError,
    build_schedule,
    parse_spec,
    smallest_neighbourhood,
    topology_names,
)


def _tables_equal(a: Schedule, b: Schedule, t: int) -> bool:
    left, right = a.neighbour_table(t), b.neighbour_table(t)
    return all(
        np.array_equal(getattr(left, f), getattr(right, f))
        for f in ("index", "weight", "mask", "self_weight")
    )


def test_names_are_every_graph_then_every_schedule() -> None:
    assert topology_names() == [*TOPOLOGIES, *SCHEDULES]
    assert set(SCHEDULES) == {"one-peer-exponential", "random-matching", "random-k-out"}
    assert dict(SCHEDULES["random-k-out"].params) == {"k": 1, "seed": 0}
    assert dict(SCHEDULES["one-peer-exponential"].params) == {}


def test_parse_spec_canonical_name_and_typed_values() -> None:
    assert parse_spec("random-regular:degree=4,seed=1") == (
        "random-regular",
        {"degree": 4, "seed": 1},
    )
    assert parse_spec("  Small_World : degree = 6 , p = 0.25 ") == (
        "small-world",
        {"degree": 6, "p": 0.25},
    )
    assert parse_spec("One_Peer_Exponential") == ("one-peer-exponential", {})
    assert parse_spec("ring:") == ("ring", {})
    name, params = parse_spec("erdos-renyi:p=1")
    assert (name, params, type(params["p"])) == ("erdos-renyi", {"p": 1}, int)


@pytest.mark.parametrize(
    ("spec", "kind", "attributes"),
    [
        ("one-peer-exponential", OnePeerExponential, {"period": 3}),
        ("random-matching", RandomMatching, {"seed": 11}),
        ("random-matching:seed=4", RandomMatching, {"seed": 4}),
        ("random-k-out", RandomKOut, {"k": 1, "seed": 11}),
        # the simulator's old parser read seed=3 as k=3 and choked on k=2,seed=3
        ("random-k-out:seed=3", RandomKOut, {"k": 1, "seed": 3}),
        ("random-k-out:k=2,seed=3", RandomKOut, {"k": 2, "seed": 3}),
        ("Random_K_Out:k=3", RandomKOut, {"k": 3, "seed": 11}),
    ],
)
def test_every_schedule_builds_from_its_spec(
    spec: str, kind: type, attributes: dict[str, int]
) -> None:
    schedule = build_schedule(spec, 8, seed=11)
    assert isinstance(schedule, kind)
    assert schedule.n == 8
    assert {key: getattr(schedule, key) for key in attributes} == attributes


@pytest.mark.parametrize(
    ("spec", "params", "weights", "expected"),
    [
        ("ring", None, None, lambda: topologies.ring(8)),
        ("exponential", None, None, lambda: topologies.exponential(8)),
        ("torus:rows=2,cols=4", None, "max-degree", lambda: topologies.torus(8, 2, 4)),
        ("random-regular:degree=3", None, None, lambda: topologies.random_regular(8, 3, 5)),
        ("random-regular", {"degree": 3, "seed": 2}, "lazy", lambda: topologies.random_regular(8, 3, 2)),
        ("small-world:p=0.5", {"degree": 2}, None, lambda: topologies.small_world(8, 2, 0.5, 5)),
    ],
)  # fmt: skip
def test_graph_specs_build_the_static_mixing_matrix(
    spec: str, params: dict[str, int] | None, weights: str | None, expected
) -> None:  # type: ignore[no-untyped-def]
    schedule = build_schedule(spec, 8, weights=weights, params=params, seed=5)
    assert isinstance(schedule, Static)
    want = topologies.mixing_matrix(expected(), weights=weights)
    np.testing.assert_array_equal(schedule.mixing(0).toarray(), want.toarray())


def test_the_run_seed_fills_only_an_absent_seed() -> None:
    defaulted = build_schedule("erdos-renyi", 12, seed=7)
    explicit = build_schedule("erdos-renyi:seed=7", 12, seed=0)
    other = build_schedule("erdos-renyi", 12, seed=8)
    assert _tables_equal(defaulted, explicit, 0)
    assert not _tables_equal(defaulted, other, 0)
    from_params = build_schedule("random-matching", 12, params={"seed": 2}, seed=9)
    assert isinstance(from_params, RandomMatching) and from_params.seed == 2


@pytest.mark.parametrize("spec", ["random-matching", "random-k-out:k=3", "random-regular"])
def test_same_spec_and_seed_give_the_same_tables(spec: str) -> None:
    first, second = build_schedule(spec, 16, seed=4), build_schedule(spec, 16, seed=4)
    assert all(_tables_equal(first, second, t) for t in range(4))
    other = build_schedule(spec, 16, seed=5)
    assert not all(_tables_equal(first, other, t) for t in range(4))


@pytest.mark.parametrize(
    ("spec", "parameter", "message"),
    [
        ("", "spec", r"topology spec '': must be NAME or NAME:KEY=VALUE,...; got no NAME"),
        ("   ", "spec", r"topology spec '   ': must be NAME or NAME:KEY=VALUE,...; got no NAME"),
        ("moebius:k=1", "name", r"unknown topology 'moebius'; choose one of: ring, torus, .*"
         r"one-peer-exponential, random-matching, random-k-out"),
        ("ring:3", "spec", r"'ring:3': parameter '3' is not KEY=VALUE"),
        ("random-k-out:k=", "k", r"'random-k-out:k=': parameter 'k' has no VALUE"),
        ("random-k-out:=2", "spec", r"'random-k-out:=2': parameter '=2': KEY '' must be"),
        ("random-k-out:k=1,k=2", "k", r"'k' is given twice"),
        ("one-peer-exponential:bogus=1", "bogus",
         r"one-peer-exponential takes no parameter 'bogus'; its parameters: none"),
        ("random-matching:k=2", "k", r"random-matching takes no parameter 'k'; its parameters: seed"),
        ("random-regular:p=0.5", "p",
         r"random-regular takes no parameter 'p'; its parameters: degree, seed"),
        ("random-k-out:k=0", "k", r"k must be an integer >= 1, got 0"),
        ("random-k-out:k=2.0", "k", r"k must be an integer >= 1, got 2.0"),
        ("random-k-out:k=two", "k", r"k must be an integer >= 1, got 'two'"),
        ("random-matching:seed=-1", "seed", r"seed must be an integer >= 0, got -1"),
        ("random-regular:seed=x", "seed", r"seed must be an integer >= 0, got 'x'"),
    ],
)  # fmt: skip
def test_parse_errors_name_the_offending_part(spec: str, parameter: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message) as caught:
        parse_spec(spec)
    assert caught.value.parameter == parameter
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("spec", "kwargs", "parameter", "message"),
    [
        ("random-matching", {"weights": "metropolis"}, "weights",
         r"weights='metropolis' applies only to static graphs; the schedule random-matching"),
        ("random-regular:degree=4", {"params": {"degree": 3}}, "degree",
         r"'degree' is set both in the spec and in the parameters"),
        ("ring", {"params": {"degree": 3}}, "degree", r"ring takes no parameter 'degree'"),
        ("random-k-out", {"params": {"k": True}}, "k", r"k must be an integer >= 1, got True"),
        ("random-matching", {"seed": -2}, "seed", r"default seed must be an integer >= 0"),
        ("random-k-out:k=9", {}, "k", r"'random-k-out:k=9': k=9 out-peers is impossible for n=8"),
        ("hypercube", {}, "n", r"'hypercube': "),
        ("ring", {"weights": "bogus"}, "weights", r"'ring': unknown weights 'bogus'"),
    ],
)  # fmt: skip
def test_build_errors_name_the_offending_part(
    spec: str, kwargs: dict[str, object], parameter: str, message: str
) -> None:
    with pytest.raises(TopologyError, match=message) as caught:
        build_schedule(spec, 8 if spec != "hypercube" else 12, **kwargs)  # type: ignore[arg-type]
    assert caught.value.parameter == parameter


_VALUES = {
    "seed": st.integers(0, 2**63),
    "k": st.integers(1, 10**6),
    "p": st.floats(0.0, 1.0),
}


@st.composite
def _named_params(draw: st.DrawFn) -> tuple[str, str, dict[str, int | float]]:
    name = draw(st.sampled_from(topology_names()))
    allowed = list(SCHEDULES[name].params if name in SCHEDULES else TOPOLOGIES[name].params)
    keys = draw(st.lists(st.sampled_from(allowed), unique=True)) if allowed else []
    params = {key: draw(_VALUES.get(key, st.integers(1, 10**6))) for key in keys}
    spelled = draw(st.sampled_from([name, name.upper(), name.replace("-", "_"), f" {name} "]))
    return name, spelled, params


@given(_named_params())
def test_formatting_then_parsing_gives_the_params_back(
    case: tuple[str, str, dict[str, int | float]],
) -> None:
    name, spelled, params = case
    text = spelled + (":" + ",".join(f"{k}={v!r}" for k, v in params.items()) if params else "")
    parsed_name, parsed = parse_spec(text)
    assert parsed_name == name
    assert parsed == params
    assert {k: type(v) for k, v in parsed.items()} == {k: type(v) for k, v in params.items()}


@pytest.mark.parametrize(
    ("spec", "n", "expected"),
    [("ring", 8, 3), ("star", 8, 2), ("one-peer-exponential", 8, 2), ("complete", 6, 6),
     ("complete", 9, 9), ("random-matching", 7, 1), ("random-matching", 8, 2)],
)  # fmt: skip
def test_smallest_neighbourhood_is_own_plus_fewest_in_neighbours(
    spec: str, n: int, expected: int
) -> None:
    assert smallest_neighbourhood(build_schedule(spec, n)) == expected


def test_smallest_neighbourhood_checks_the_round() -> None:
    schedule = build_schedule("random-k-out:k=2", 3)  # everyone sends to both others
    assert [smallest_neighbourhood(schedule, t) for t in range(3)] == [3, 3, 3]
    with pytest.raises(TopologyError, match="t=-1"):
        smallest_neighbourhood(schedule, -1)
