"""gossip.GossipConfig: the one validation both runners call, and build_algorithm."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gossip import (
    ALGORITHM_FIELDS,
    GOSSIP_ALGORITHMS,
    Choco,
    ConfigurationError,
    DecentralizedSGD,
    GossipConfig,
    PushSum,
    build_algorithm,
)
from gossip.compression import build_compressor
from gossip.outer import DiLoCo, NoLoCo, SparseLoCo
from gossip.settings import setting

VALUES = {
    "order": "adapt-then-combine",
    "local_steps": 3,
    "aggregator": "median",
    "compressor": "fp16",
    "consensus_step": 0.3,
}


@pytest.mark.parametrize("algorithm", list(GOSSIP_ALGORITHMS))
@pytest.mark.parametrize("field", list(VALUES))
def test_a_field_the_algorithm_does_not_read_is_an_error(algorithm: str, field: str) -> None:
    fixed = {name for name in VALUES if algorithm in setting(name).fixed}
    assert fixed == {
        "local-sgd": {"order"},
        "choco": {"order"},
        "ad-psgd": {"order", "local_steps"},
        "diloco": {"order"},
        "noloco": {"order"},
        "sparseloco": {"order"},
    }.get(algorithm, set())
    if field in ALGORITHM_FIELDS[algorithm]:
        assert getattr(GossipConfig(algorithm, **{field: VALUES[field]}), field) == VALUES[field]
    elif field in fixed:
        value = getattr(GossipConfig(algorithm), field)
        assert getattr(GossipConfig(algorithm, **{field: value}), field) == value  # same: fine
        other = {"combine-then-adapt": "adapt-then-combine"}.get(value, "combine-then-adapt")
        with pytest.raises(ConfigurationError, match=rf"^{field}: {algorithm} is always"):
            GossipConfig(algorithm, **{field: other if field == "order" else 3})
    else:
        with pytest.raises(ConfigurationError, match=rf"^{field}: is not used by {algorithm}"):
            GossipConfig(algorithm, **{field: VALUES[field]})


def test_the_fields_the_issue_found_silently_dropped_are_refused() -> None:
    for algorithm, field, value in [
        ("ad-psgd", "local_steps", 4),
        ("ad-psgd", "order", "adapt-then-combine"),
        ("push-sum", "aggregator", "trimmed-mean:b=1"),
        ("choco", "aggregator", "median"),
        ("choco", "order", "combine-then-adapt"),
    ]:
        with pytest.raises(ConfigurationError) as info:
            GossipConfig(algorithm, **{field: value})
        assert info.value.field == field


def test_defaults_are_filled_and_construction_is_idempotent() -> None:
    for algorithm in GOSSIP_ALGORITHMS:
        config = GossipConfig(algorithm)
        assert config.order is not None and config.local_steps is not None
        again = GossipConfig(**dataclasses.asdict(config))
        assert again == config
    assert GossipConfig("local-sgd").order == "adapt-then-combine"
    assert GossipConfig("local-sgd").local_steps == 4
    assert GossipConfig("push-sum").aggregator is None
    assert GossipConfig("choco").consensus_step == 0.5
    assert GossipConfig("ad-psgd").local_steps == 1


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"algorithm": "gossip"}, "algorithm", "must be one of dpsgd, local-sgd"),
        ({"order": "sideways"}, "order", "must be one of combine-then-adapt"),
        ({"local_steps": -1}, "local_steps", "integer >= 0 for dpsgd"),
        ({"local_steps": True}, "local_steps", "integer"),
        ({"algorithm": "local-sgd", "local_steps": 1}, "local_steps", ">= 2 for local-sgd"),
        ({"aggregator": "nosuch"}, "aggregator", "unknown aggregator 'nosuch'"),
        ({"compressor": "zip"}, "compressor", "unknown compressor 'zip'"),
        ({"compressor": "topk:ratio=0.1"}, "compressor", "topk drops most coordinates"),
        ({"algorithm": "push-sum", "compressor": "randk"}, "compressor", "randk drops"),
        ({"algorithm": "choco", "consensus_step": 0}, "consensus_step", r"in \(0, 1\]"),
        ({"algorithm": "choco", "consensus_step": float("nan")}, "consensus_step", "in"),
        (
            {"algorithm": "ad-psgd", "aggregator": "krum:f=1"},
            "aggregator",
            "krum:f=1 cannot run: krum needs n > 2f\\+2, got n=2, f=1; an AD-PSGD exchange",
        ),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        GossipConfig(**kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_choco_takes_sparsifiers() -> None:
    assert GossipConfig("choco", compressor="topk:ratio=0.1").compressor == "topk:ratio=0.1"


def test_check_neighbourhood_asks_the_rule() -> None:
    config = GossipConfig("dpsgd", aggregator="trimmed-mean:b=1")
    config.check_neighbourhood(3)  # 2b + 1
    with pytest.raises(ConfigurationError, match=r"trimmed-mean:b=1 cannot run.*the ring"):
        config.check_neighbourhood(2, where="the ring")
    GossipConfig("dpsgd").check_neighbourhood(1)  # the mean runs on anything
    GossipConfig("push-sum").check_neighbourhood(1)  # no aggregator at all
    # an AD-PSGD exchange always mixes 2 models, whatever the topology's degree
    GossipConfig("ad-psgd", aggregator="median").check_neighbourhood(50)


@given(
    algorithm=st.sampled_from(list(GOSSIP_ALGORITHMS)),
    local_steps=st.integers(min_value=2, max_value=9),
)
def test_build_algorithm_builds_what_the_config_says(algorithm: str, local_steps: int) -> None:
    settings = {"local_steps": local_steps} if "local_steps" in ALGORITHM_FIELDS[algorithm] else {}
    config = GossipConfig(algorithm, **settings)
    built = build_algorithm(config)
    kinds = {
        "push-sum": PushSum,
        "choco": Choco,
        "diloco": DiLoCo,
        "noloco": NoLoCo,
        "sparseloco": SparseLoCo,
    }
    kind = kinds.get(algorithm, DecentralizedSGD)
    assert type(built) is kind
    assert built.name == algorithm
    assert built.plan.order == config.order
    assert built.plan.local_steps == config.local_steps
    assert built.compressor.spec == build_compressor(config.compressor).spec


def test_local_sgd_is_adapt_then_combine_in_both_runners() -> None:
    # one name, one algorithm: H local steps, then one exchange (Lin et al. 2020)
    plan = build_algorithm(GossipConfig("local-sgd", local_steps=3)).plan
    assert plan.phases() == ("gradient", "step") * 3 + ("exchange",)
