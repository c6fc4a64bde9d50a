"""Topology spec strings, one grammar for both runners: ``NAME[:KEY=VALUE[,KEY=VALUE...]]``
(:mod:`topologies.spec_grammar`, the grammar of every registry's specs).

``"random-regular:degree=4,seed=1"`` names a static graph of :data:`topologies.TOPOLOGIES`
with builder parameters; ``"random-k-out:k=2"`` names a time-varying schedule of
:data:`SCHEDULES`. The simulator (``topology`` in a run's config) and the networked peer
(``--topology``) both parse with :func:`parse_spec` and build with :func:`build_schedule`, so
the same string gives the same W_t in both.

>>> parse_spec("Random_Regular:degree=4,seed=1")
('random-regular', {'degree': 4, 'seed': 1})
>>> build_schedule("random-k-out:k=2", 8, seed=3).neighbour_table(0).width >= 2
True
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from topologies.errors import TopologyError
from topologies.registry import TOPOLOGIES, build
from topologies.schedules import OnePeerExponential, RandomKOut, RandomMatching, Schedule, Static
from topologies.spec_grammar import SpecError
from topologies.spec_grammar import parse_spec as parse_grammar

#: A parsed parameter value: the text converted to int if it is one, else float, else kept.
Value = int | float | str


@dataclass(frozen=True)
class ScheduleSpec:
    """One named time-varying topology: its builder ``builder(n, **params)``, parameters
    (name -> default) and what a round looks like.

    A ``seed`` default is only the fallback of the fallback: :func:`build_schedule` fills an
    absent ``seed`` with its own ``seed`` argument (the run's seed).
    """

    name: str
    builder: Callable[..., Schedule]
    summary: str
    params: Mapping[str, object] = field(default_factory=dict)


SCHEDULES: dict[str, ScheduleSpec] = {
    s.name: s
    for s in [
        ScheduleSpec(
            "one-peer-exponential",
            OnePeerExponential,
            "round t: i averages with i + 2^(t mod ceil(log2 n)) (Ying et al., 2021)",
        ),
        ScheduleSpec(
            "random-matching",
            RandomMatching,
            "round t: a random (near-)perfect matching drawn from (seed, t); pairs average",
            {"seed": 0},
        ),
        ScheduleSpec(
            "random-k-out",
            RandomKOut,
            "round t: every node sends to k random peers drawn from (seed, t); receivers "
            "average (Epidemic Learning, de Vos et al., 2023)",
            {"k": 1, "seed": 0},
        ),
    ]
}
"""Time-varying topologies by name; every other spec name is a static graph of TOPOLOGIES."""

#: Integer parameters checked at parse time, with their smallest value: a schedule's ``k`` and
#: every ``seed`` (graph or schedule). Other graph parameters depend on n; their builders check.
_INTEGER_MINIMUM = {"k": 1, "seed": 0}


def topology_names() -> list[str]:
    """Every name a spec may start with: the static graphs, then the schedules."""
    return [*TOPOLOGIES, *SCHEDULES]


def _parameters(name: str) -> Mapping[str, object]:
    return SCHEDULES[name].params if name in SCHEDULES else TOPOLOGIES[name].params


def _canonical(name: str, spec: str) -> str:
    key = name.strip().lower().replace("_", "-")
    if key not in TOPOLOGIES and key not in SCHEDULES:
        raise TopologyError(
            "name",
            f"topology spec {spec!r}: unknown topology {name.strip()!r}; "
            f"choose one of: {', '.join(topology_names())}",
        )
    return key


def _value(text: str) -> Value:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _integer(value: object) -> int | None:
    """``value`` as an int if it is an integer (bool excluded), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _check(name: str, params: Mapping[str, object], spec: str) -> None:
    """Every key is a parameter of ``name``; schedule integers and every seed are in range."""
    allowed = _parameters(name)
    for key, value in params.items():
        if key not in allowed:
            raise TopologyError(
                key,
                f"topology spec {spec!r}: {name} takes no parameter {key!r}; "
                f"its parameters: {', '.join(allowed) or 'none'}",
            )
        if key in _INTEGER_MINIMUM:
            low = _INTEGER_MINIMUM[key]
            number = _integer(value)
            if number is None or number < low:
                raise TopologyError(
                    key,
                    f"topology spec {spec!r}: {key} must be an integer >= {low}, got {value!r}",
                )


def parse_spec(spec: str) -> tuple[str, dict[str, Value]]:
    """Split ``NAME[:KEY=VALUE,...]`` into the canonical name and its parameters.

    The grammar is :func:`topologies.spec_grammar.parse_spec`'s (the name is matched ignoring case
    and ``_`` vs ``-``); each VALUE becomes an int if it reads as one, else a float, else
    stays a string. Raises :class:`TopologyError` (a ``ValueError``) naming the spec for:
    a spec the grammar refuses, an unknown name (listing every name), a parameter the name
    does not take (listing its parameters), and a ``k`` (>= 1) or ``seed`` (>= 0) that is
    not such an integer.

    >>> parse_spec("random-k-out:seed=3")
    ('random-k-out', {'seed': 3})
    """
    try:
        head, texts = parse_grammar(spec, "topology")
    except SpecError as error:
        raise TopologyError(error.key or "spec", str(error)) from None
    name = _canonical(head, spec)
    params: dict[str, Value] = {key: _value(text) for key, text in texts.items()}
    _check(name, params, spec)
    return name, params


def build_schedule(
    spec: str,
    n: int,
    *,
    weights: str | None = None,
    params: Mapping[str, object] | None = None,
    seed: int = 0,
) -> Schedule:
    """The schedule a spec names, on ``n`` nodes.

    A static graph becomes ``Static(mixing_matrix(build(name, n, **params), weights=weights))``;
    a schedule name becomes ``OnePeerExponential(n)``, ``RandomMatching(n, seed)`` or
    ``RandomKOut(n, k, seed)``.

    Args:
        spec: ``NAME[:KEY=VALUE,...]`` (see :func:`parse_spec`).
        n: number of nodes.
        weights: a ``mixing_matrix`` scheme for a static graph; ``None`` = the graph's default.
            A schedule carries its own weights, so giving one there is an error.
        params: more parameters (a config table such as ``{degree = 4}``), merged with the
            spec's own; a key set in both is an error.
        seed: the seed of a random graph or schedule whose spec and params give none.

    >>> build_schedule("ring", 4).neighbour_table(0).degree.tolist()
    [2, 2, 2, 2]
    """
    name, merged = parse_spec(spec)
    extra = dict(params or {})
    for key in extra:
        if key in merged:
            raise TopologyError(
                key,
                f"topology spec {spec!r}: {key!r} is set both in the spec and in the "
                "parameters; give it once",
            )
    _check(name, extra, spec)
    if name in SCHEDULES and weights is not None:
        raise TopologyError(
            "weights",
            f"topology spec {spec!r}: weights={weights!r} applies only to static graphs; "
            f"the schedule {name} carries its own weights, leave weights unset",
        )
    from topologies.mixing import mixing_matrix  # scipy: only once a matrix is built

    every: dict[str, object] = {**merged, **extra}
    if "seed" in _parameters(name) and "seed" not in every:
        default = _integer(seed)
        if default is None or default < 0:
            raise TopologyError(
                "seed",
                f"topology spec {spec!r}: the default seed must be an integer >= 0, got {seed!r}",
            )
        every["seed"] = default
    try:
        if name in SCHEDULES:
            return SCHEDULES[name].builder(n, **{**SCHEDULES[name].params, **every})
        return Static(mixing_matrix(build(name, n, **every), weights=weights))
    except TopologyError as error:
        raise TopologyError(error.parameter, f"topology spec {spec!r}: {error.message}") from None
    except TypeError as error:
        raise TopologyError(
            "spec", f"topology spec {spec!r} with parameters {every}: {error}"
        ) from None
