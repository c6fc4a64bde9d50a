"""``AGGREGATORS`` registry and ``build(spec)`` for rules and wrapper chains."""

from __future__ import annotations

from typing import Any

from consensus.base import Rule
from consensus.clipping import CenteredClipping, ClippedGossip, GeometricMedian
from consensus.krum import Bulyan, Krum, MultiKrum
from consensus.mean import WeightedMean
from consensus.order_statistics import CoordinateWiseMedian, TrimmedMean
from consensus.registry import Entry, Parameter, describe, parse_component
from consensus.wrappers import Bucketing, NearestNeighbourMixing
from topologies.spec_grammar import SpecError

_N = Parameter("n", "int|none", None, "expected n (own + neighbours) to check the bound up front")
_F = Parameter("f", "int", 1, "number of Byzantine neighbours tolerated")

AGGREGATORS: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry("mean", WeightedMean, (), "weighted mean w_ii x_i + sum_j W_ij x_j (plain gossip)"),
        Entry("median", CoordinateWiseMedian, (), "weighted coordinate-wise median"),
        Entry(
            "trimmed-mean",
            TrimmedMean,
            (Parameter("b", "int", 1, "values dropped at each end per coordinate"), _N),
            "drop b largest and b smallest per coordinate, weighted mean of the rest (n > 2b)",
        ),
        Entry("krum", Krum, (_F, _N), "the input closest to its n-f-2 nearest (n > 2f+2)"),
        Entry(
            "multi-krum",
            MultiKrum,
            (_F, Parameter("m", "int|none", None, "inputs averaged (default n-f)"), _N),
            "weighted mean of the m best Krum scores (n > 2f+2)",
        ),
        Entry("bulyan", Bulyan, (_F, _N), "Krum selection then trimmed coordinates (n >= 4f+3)"),
        Entry(
            "geometric-median",
            GeometricMedian,
            (
                Parameter("nu", "float", 1e-6, "smoothing of the Weiszfeld weights"),
                Parameter("T", "int", 5, "Weiszfeld iterations"),
            ),
            "weighted geometric median by smoothed Weiszfeld",
        ),
        Entry(
            "centered-clipping",
            CenteredClipping,
            (
                Parameter("tau", "float", 1.0, "clipping radius"),
                Parameter("L", "int", 1, "clipping iterations per call"),
            ),
            "clip around the previous result, v += sum_c w_c clip(x_c - v, tau)",
        ),
        Entry(
            "clipped-gossip",
            ClippedGossip,
            (
                Parameter("tau", "float|auto", "auto", "clipping radius or auto (per node)"),
                Parameter("f", "int", 1, "neighbours clipped when tau=auto"),
            ),
            "self-centred clipping x_i + sum_j W_ij clip(x_j - x_i, tau_i)",
        ),
        Entry(
            "bucketing",
            Bucketing,
            (
                Parameter("s", "int", 2, "bucket size"),
                Parameter("seed", "int", 0, "seed of the shuffles"),
            ),
            "wrapper: rule over weighted means of shuffled buckets of s neighbours",
            wrapper=True,
        ),
        Entry(
            "nnm",
            NearestNeighbourMixing,
            (Parameter("f", "int|none", None, "Byzantine budget (default: the rule's f)"),),
            "wrapper: replace each input by the mean of its n-f nearest, then the rule",
            wrapper=True,
        ),
    ]
}


def _arguments(entry: Entry, given: dict[str, Any]) -> dict[str, Any]:
    return {p.name: given.get(p.name, p.default) for p in entry.parameters}


def build(spec: str) -> Rule:
    """Build an aggregation rule from a spec such as ``trimmed-mean:b=2`` or ``nnm+krum:f=1``.

    Wrappers (``bucketing``, ``nnm``) come first, joined by ``+``; exactly one
    rule comes last. A wrapper's ``f`` defaults to the final rule's ``f`` (or ``b``)
    (or 1). Raises ``ValueError`` naming the unknown name or parameter and
    listing the choices.
    """
    if not isinstance(spec, str):
        raise SpecError("aggregator", spec, "must be a string such as 'mean'")
    try:
        parts = [parse_component(text, AGGREGATORS, "aggregator") for text in spec.split("+")]
    except SpecError as error:
        if error.spec == spec:
            raise
        reason = f"component {error.spec!r}: {error.reason}"
        raise SpecError("aggregator", spec, reason, key=error.key) from None
    *wrappers, (last, last_kwargs) = parts
    if last.wrapper:
        raise ValueError(
            f"{last.name} is a wrapper and needs a rule after it, e.g. '{last.name}+median'; "
            f"rules: {', '.join(e.name for e in AGGREGATORS.values() if not e.wrapper)}"
        )
    for entry, _ in wrappers:
        if not entry.wrapper:
            raise ValueError(
                f"{entry.name} is a rule, not a wrapper; only "
                f"{', '.join(e.name for e in AGGREGATORS.values() if e.wrapper)} may come before '+'"
            )
    rule: Rule = last.factory(**_arguments(last, last_kwargs))
    budget = getattr(rule, "f", getattr(rule, "b", 1))
    for entry, kwargs in reversed(wrappers):
        arguments = _arguments(entry, kwargs)
        if "f" in arguments and arguments["f"] is None:
            arguments["f"] = budget
        rule = entry.factory(rule, **arguments)
    return rule


def describe_aggregators() -> str:
    """The ``--aggregator`` help text: every rule and wrapper with parameters and defaults."""
    return describe(
        AGGREGATORS,
        "aggregators (NAME[:key=value,...]; wrappers compose as WRAPPER+...+RULE, "
        "e.g. bucketing:s=2+median, nnm+krum:f=1):",
    )
