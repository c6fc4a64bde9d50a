"""Spec strings: building rules and attacks by name, composition, and the errors for bad specs."""

from __future__ import annotations

import pytest
import torch

import consensus


def test_every_registered_rule_builds_from_its_name_and_runs() -> None:
    own, neighbours, weights = torch.zeros(3), torch.randn(8, 3), torch.full((8,), 0.1)
    for name, entry in consensus.AGGREGATORS.items():
        spec = f"{name}+median" if entry.wrapper else name
        rule = consensus.build(spec)
        assert isinstance(rule, consensus.Aggregator)
        assert rule(own, neighbours, weights).shape == (3,)


def test_parameters_reach_the_rule() -> None:
    rule = consensus.build("trimmed-mean:b=2")
    assert isinstance(rule, consensus.TrimmedMean) and rule.b == 2
    krum = consensus.build(" Krum : f = 2 , n = 8 ")
    assert isinstance(krum, consensus.Krum) and krum.f == 2
    gossip = consensus.build("clipped-gossip:tau=auto")
    assert isinstance(gossip, consensus.ClippedGossip) and gossip.tau == "auto"
    fixed = consensus.build("clipped_gossip:tau=0.5,f=3")
    assert isinstance(fixed, consensus.ClippedGossip) and fixed.tau == 0.5 and fixed.f == 3
    multi = consensus.build("multi-krum:f=1,m=none")
    assert isinstance(multi, consensus.MultiKrum) and multi.m is None
    median = consensus.build("geometric-median:nu=1e-3,T=7")
    assert isinstance(median, consensus.GeometricMedian) and (median.nu, median.T) == (1e-3, 7)


def test_composition_builds_wrappers_left_to_right_and_inherits_f() -> None:
    rule = consensus.build("nnm+krum:f=2")
    assert isinstance(rule, consensus.NearestNeighbourMixing) and rule.f == 2
    assert isinstance(rule.inner, consensus.Krum) and rule.inner.f == 2
    chain = consensus.build("nnm:f=1+bucketing:s=3,seed=4+trimmed-mean:b=2")
    assert isinstance(chain, consensus.NearestNeighbourMixing) and chain.f == 1
    assert isinstance(chain.inner, consensus.Bucketing) and (chain.inner.s, chain.inner.seed) == (
        3,
        4,
    )
    assert isinstance(chain.inner.inner, consensus.TrimmedMean) and chain.inner.inner.b == 2
    assert consensus.build("nnm+trimmed-mean:b=3").f == 3  # type: ignore[attr-defined]
    assert consensus.build("nnm+median").f == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("kurm:f=1", "unknown aggregator 'kurm'; choices: mean, median, trimmed-mean, krum"),
        ("krum:g=1", r"unknown parameter 'g' for krum; its parameters: f=1, n=none"),
        ("mean:b=1", "unknown parameter 'b' for mean; its parameters: none"),
        ("krum:f=two", "krum: parameter f must be an integer, got 'two'"),
        ("krum:f", "aggregator spec 'krum:f': parameter 'f' is not KEY=VALUE"),
        ("krum:f=1,f=2", "aggregator spec 'krum:f=1,f=2': parameter 'f' is given twice"),
        ("krum:f=-1", "krum: parameter f must be an integer >= 0, got -1"),
        ("clipped-gossip:tau=big", "clipped-gossip: parameter tau must be a number or auto"),
        ("clipped-gossip:tau=-1", "clipped-gossip: parameter tau must be >= 0"),
        ("geometric-median:nu=0", "geometric-median: parameter nu must be > 0"),
        ("bucketing:s=0+median", "bucketing: parameter s must be an integer >= 1, got 0"),
        ("bucketing:s=2", "bucketing is a wrapper and needs a rule after it"),
        ("median+krum", "median is a rule, not a wrapper; only bucketing, nnm may come before"),
        ("", "aggregator spec '': must be NAME or NAME:KEY=VALUE,...; got no NAME"),
        ("mean+", "aggregator spec 'mean+': component '': must be NAME or NAME:KEY=VALUE"),
    ],
)
def test_bad_specs_raise_one_clear_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        consensus.build(spec)


def test_help_text_lists_every_rule_with_defaults_and_the_composition_syntax() -> None:
    text = consensus.describe_aggregators()
    for name in consensus.AGGREGATORS:
        assert f"\n  {name}" in text
    assert "trimmed-mean:b=1,n=none" in text
    assert "bucketing:s=2,seed=0+RULE" in text
    assert "nnm+krum:f=1" in text
    attacks = consensus.describe_attacks()
    for name in consensus.ATTACKS:
        assert f"\n  {name}" in attacks
    assert "alie:f=1,n=none,z=none" in attacks


def test_attacks_build_from_specs() -> None:
    alie = consensus.build_attack("alie:f=2,z=1.5")
    assert isinstance(alie, consensus.ALittleIsEnough) and (alie.f, alie.z) == (2, 1.5)
    garbage = consensus.build_attack("garbage:kind=wrong-length")
    assert isinstance(garbage, consensus.Garbage) and garbage.kind == "wrong-length"
    for name in consensus.ATTACKS:
        assert isinstance(consensus.build_attack(name), consensus.Attack)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lie", "unknown attack 'lie'; choices: sign-flip, gaussian, scaling, alie"),
        (
            "garbage:kind=zero",
            "garbage: parameter kind must be one of nan, inf, huge, wrong-length",
        ),
        ("alie:n=2,f=2", "alie needs 0 <= f < n, got n=2, f=2"),
        ("gaussian:sigma=-1", "gaussian: parameter sigma must be >= 0"),
        ("sign-flip+ipm", "attack spec must be one NAME"),
    ],
)
def test_bad_attack_specs_raise(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        consensus.build_attack(spec)


def test_stateful_tells_whether_calls_depend_on_earlier_calls() -> None:
    stateless = ["mean", "median", "krum:f=1", "clipped-gossip", "nnm+krum:f=1", "geometric-median"]
    assert not any(consensus.build(spec).stateful for spec in stateless)
    stateful = ["centered-clipping", "bucketing+median", "nnm+centered-clipping"]
    assert all(consensus.build(spec).stateful for spec in stateful)
