"""Build rules and attacks from spec strings; the registries the CLIs list in ``--help``.

Spec grammar::

    spec      := component ("+" component)*       # wrappers first, one rule last
    component := NAME [":" KEY "=" VALUE ("," KEY "=" VALUE)*]   # topologies.spec_grammar's

Examples: ``mean``, ``trimmed-mean:b=2``, ``krum:f=2,n=8``,
``clipped-gossip:tau=auto``, ``bucketing:s=2+median``, ``nnm+krum:f=1``.
Values are integers, floats, ``auto`` or ``none`` as each parameter allows.
Unknown names or parameters raise ``ValueError`` listing the choices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from topologies.spec_grammar import parse_spec

NONE_WORDS = ("none", "null")


@dataclass(frozen=True)
class Parameter:
    """One spec parameter: its name, accepted kind, default and a one-line doc.

    ``kind`` is ``int``, ``float``, ``int|none``, ``float|auto`` or ``choice``
    (then ``choices`` lists the accepted words).
    """

    name: str
    kind: str
    default: Any
    doc: str
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        default = "none" if self.default is None else self.default
        return f"{self.name}={default}"

    def parse(self, owner: str, text: str) -> Any:
        word = text.strip().lower()
        try:
            if self.kind == "choice":
                if word not in self.choices:
                    raise ValueError
                return word
            if self.kind.endswith("|none") and word in NONE_WORDS:
                return None
            if self.kind.endswith("|auto") and word == "auto":
                return "auto"
            if self.kind.startswith("int"):
                return int(word)
            return float(word)
        except ValueError:
            allowed = {
                "int": "an integer",
                "float": "a number",
                "int|none": "an integer or none",
                "float|none": "a number or none",
                "float|auto": "a number or auto",
                "choice": "one of " + ", ".join(self.choices),
            }[self.kind]
            raise ValueError(
                f"{owner}: parameter {self.name} must be {allowed}, got {text!r}"
            ) from None


@dataclass(frozen=True)
class Entry:
    """A registered rule, wrapper or attack: how to build it and what it accepts."""

    name: str
    factory: Callable[..., Any]
    parameters: tuple[Parameter, ...]
    summary: str
    wrapper: bool = False

    def parameter(self, key: str) -> Parameter:
        for p in self.parameters:
            if p.name == key:
                return p
        listed = ", ".join(p.describe() for p in self.parameters) or "none"
        raise ValueError(f"unknown parameter {key!r} for {self.name}; its parameters: {listed}")

    def usage(self) -> str:
        params = ",".join(p.describe() for p in self.parameters)
        head = f"{self.name}:{params}" if params else self.name
        return head + ("+RULE" if self.wrapper else "")


def parse_component(
    text: str, registry: Mapping[str, Entry], what: str
) -> tuple[Entry, dict[str, Any]]:
    """``name:key=value,...`` (:func:`topologies.spec_grammar.parse_spec`) -> (entry, parsed keyword
    arguments given explicitly); a :class:`topologies.spec_grammar.SpecError` for a malformed one."""
    name, texts = parse_spec(text, what)
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; choices: {', '.join(registry)}")
    entry = registry[name]
    return entry, {key: entry.parameter(key).parse(name, value) for key, value in texts.items()}


def describe(registry: Mapping[str, Entry], title: str) -> str:
    """Plain-text listing for ``--help``: one line per entry with its parameters and defaults."""
    width = max(len(e.usage()) for e in registry.values())
    lines = [title]
    lines += [f"  {e.usage():<{width}}  {e.summary}" for e in registry.values()]
    return "\n".join(lines)
