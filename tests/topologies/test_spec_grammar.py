"""The one ``NAME[:KEY=VALUE,...]`` grammar (spec_grammar), and that every registry refuses
the same malformed specs with a message naming the spec."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import consensus
import topologies
from gossip.compression import build_compressor
from topologies.spec_grammar import SpecError, parse_spec
from workloads import check_dataset_spec, check_model_spec, check_partition_spec


@pytest.mark.parametrize(
    ("spec", "name", "params"),
    [
        ("ring", "ring", {}),
        ("  Random_Regular : degree = 4 , seed=1 ", "random-regular", {"degree": "4", "seed": "1"}),
        ("qsgd:bits=4,block=64", "qsgd", {"bits": "4", "block": "64"}),
        ("label-sets:sets=0-4|5-9", "label-sets", {"sets": "0-4|5-9"}),
        ("npz:path=C:/data/x.npz", "npz", {"path": "C:/data/x.npz"}),  # ':' in a VALUE
        ("x:a=b=c", "x", {"a": "b=c"}),  # '=' in a VALUE
        ("mnist1d:cache-dir=/tmp", "mnist1d", {"cache_dir": "/tmp"}),  # '-' in a KEY is '_'
        ("mlp-100k", "mlp-100k", {}),
        ("ring:", "ring", {}),  # NAME: is NAME
        ("ring:  ", "ring", {}),
    ],
)
def test_the_grammar_splits_name_and_parameters(spec: str, name: str, params: dict) -> None:
    assert parse_spec(spec, "thing") == (name, params)


MALFORMED = {
    "": "got no NAME",
    "   ": "got no NAME",
    ":a=1": "NAME '' must be",
    "ring:a=1,": "an empty parameter",
    "ring:a=1,,b=2": "an empty parameter",
    "ring:a": "parameter 'a' is not KEY=VALUE",
    "ring:=1": "KEY '' must be",
    "ring:1a=1": "KEY '1a' must be",
    "ring:a=": "parameter 'a' has no VALUE",
    "ring:a=1,a=2": "parameter 'a' is given twice",
    "ring:a-b=1,a_b=2": "parameter 'a_b' is given twice",
    "a b:c=1": "NAME 'a b' must be",
    "k=1": "NAME 'k=1' must be",
}


@pytest.mark.parametrize(("spec", "reason"), list(MALFORMED.items()))
def test_the_grammar_refuses_malformed_specs_naming_them(spec: str, reason: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec, "thing")
    assert str(caught.value).startswith(f"thing spec {spec!r}: ")
    assert reason in str(caught.value)
    assert caught.value.spec == spec and caught.value.what == "thing"


def test_a_key_at_fault_is_named() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec("ring:k=1,k=2", "thing")
    assert caught.value.key == "k"


def test_a_spec_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(SpecError, match="thing spec None: "):
        parse_spec(None, "thing")


_key = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
_value = st.from_regex(r"[A-Za-z0-9./|=+-]{1,8}", fullmatch=True)


@given(
    name=st.from_regex(r"[a-z0-9][a-z0-9.-]{0,10}", fullmatch=True),
    params=st.dictionaries(_key, _value, max_size=4),
)
def test_a_written_spec_reads_back(name: str, params: dict[str, str]) -> None:
    text = name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
    assert parse_spec(text, "thing") == (name, params)


@given(st.text(max_size=30))
def test_any_text_parses_or_is_refused_with_a_spec_error(text: str) -> None:
    try:
        name, params = parse_spec(text, "thing")
    except SpecError as error:
        assert str(error).startswith(f"thing spec {text!r}: ")
    else:
        assert name and all(key and value for key, value in params.items())


REGISTRIES: dict[str, tuple[str, Callable[[str], object]]] = {
    "topology": ("ring", lambda spec: topologies.build_schedule(spec, 8)),
    "aggregator": ("trimmed-mean", consensus.build),
    "attack": ("gaussian", consensus.build_attack),
    "compressor": ("qsgd", build_compressor),
    "dataset": ("synthetic", check_dataset_spec),
    "partition": ("dirichlet", check_partition_spec),
    "model": ("mlp", check_model_spec),
}
"""Each registry's word, a name it knows, and how it builds or checks a spec."""

SAME_MALFORMED = [
    "{name}:x=1,",
    "{name}:x=1,,y=2",
    "{name}:=1",
    "{name}:x",
    "{name}:x=",
    "{name}:x=1,x=2",
    ":x=1",
]


@pytest.mark.parametrize("registry", list(REGISTRIES))
@pytest.mark.parametrize("shape", SAME_MALFORMED)
def test_every_registry_refuses_the_same_malformed_specs(registry: str, shape: str) -> None:
    name, build = REGISTRIES[registry]
    spec = shape.format(name=name)
    with pytest.raises(ValueError) as caught:
        build(spec)
    assert f"{registry} spec {spec!r}: " in str(caught.value)


@pytest.mark.parametrize("registry", list(REGISTRIES))
def test_every_registry_reads_names_ignoring_case_and_underscores(registry: str) -> None:
    name, build = REGISTRIES[registry]
    build(name.upper().replace("-", "_"))
