"""Name-and-parameter registries shared by data sets, partitions and models.

A spec string names an entry and optionally sets its parameters, the same
syntax the consensus rules use::

    "mnist1d"                       -> ("mnist1d", {})
    "dirichlet:alpha=0.1"           -> ("dirichlet", {"alpha": "0.1"})
    "mlp:hidden=128,depth=3"        -> ("mlp", {"hidden": "128", "depth": "3"})

Values are converted to the type of the parameter's declared type, so a CLI
flag and a Python keyword argument end up identical.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from topologies.spec_grammar import parse_spec as parse_grammar
from topologies.spec_grammar import typed_value

T = TypeVar("T")


class _Required:
    """Marker for a parameter without a default (e.g. a data set's ``path``)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One parameter of a registry entry: its type, default (or REQUIRED) and a line of doc."""

    type: type
    default: Any
    doc: str
    optional: bool = False  # None is an allowed value

    def convert(self, owner: str, name: str, value: Any) -> Any:
        """Convert ``value`` (a string from a spec, or a Python value) to this parameter's type."""
        if value is None and self.optional:
            return None
        if self.optional and isinstance(value, str) and value.strip().lower() in {"none", ""}:
            return None  # "cache_dir=none" in a spec string
        if isinstance(value, str) and self.type is not str:
            try:
                return typed_value(value, self.type)
            except ValueError:
                raise ValueError(
                    f"{owner}: parameter {name!r} must be a {self.type.__name__}, got {value!r}"
                ) from None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if self.type is str and hasattr(value, "__fspath__"):
            return str(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise ValueError(
                f"{owner}: parameter {name!r} must be a {self.type.__name__}, got {value!r}"
            )
        return value


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered name: the factory, its parameters and a one-line description."""

    name: str
    factory: Callable[..., T]
    params: Mapping[str, Param] = field(default_factory=dict)
    doc: str = ""

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overlaid with ``given`` (converted and checked); raises ValueError on unknowns."""
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            allowed = ", ".join(self.params) or "(none)"
            raise ValueError(
                f"{self.name}: unknown parameter(s) {', '.join(unknown)}; allowed: {allowed}"
            )
        resolved: dict[str, Any] = {}
        for name, param in self.params.items():
            if name in given:
                resolved[name] = param.convert(self.name, name, given[name])
            elif param.default is REQUIRED:
                raise ValueError(f"{self.name}: parameter {name!r} is required ({param.doc})")
            else:
                resolved[name] = param.default
        return resolved

    def describe(self) -> str:
        """``name:p=default,...  doc`` for help texts."""
        params = ",".join(f"{k}={v.default!r}" for k, v in self.params.items())
        return f"{self.name}{':' + params if params else ''}  {self.doc}"


def parse_spec(spec: str, what: str) -> tuple[str, dict[str, str]]:
    """Split ``name:key=value,key=value`` into the name and a dict of string values, by the
    one grammar of :func:`topologies.spec_grammar.parse_spec` (a ``SpecError`` for a malformed spec)."""
    return parse_grammar(spec, what)


def lookup(registry: Mapping[str, Entry[T]], name: str, what: str) -> Entry[T]:
    """The entry called ``name``; a ValueError listing the choices otherwise."""
    try:
        return registry[name]
    except KeyError:
        raise ValueError(
            f"unknown {what} {name!r}; allowed: {', '.join(sorted(registry))}"
        ) from None
