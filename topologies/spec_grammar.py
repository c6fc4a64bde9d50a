"""The one grammar of registry spec strings, for every registry of every package.

A spec names an entry of a registry (a topology, an aggregator or attack, a compressor, a
data set, a partition, a model) and optionally its parameters::

    spec  := NAME [":" item ("," item)*]
    item  := KEY "=" VALUE

* NAME is matched ignoring case and ``_`` versus ``-`` (``Random_Regular`` is
  ``random-regular``): letters, digits, ``.``, ``-`` and ``_``, starting with a letter or
  digit.
* KEY is a name of letters, digits, ``_`` and ``-`` (``-`` read as ``_``), not starting with
  a digit; each KEY at most once.
* VALUE is the non-empty text up to the next ``,`` (it may hold ``=``); the registry
  converts it to the parameter's type.
* A registry reads a VALUE as its parameter's type with :func:`typed_value` (a bool is
  ``true``/``false``, ``1``/``0`` or ``yes``/``no``, in any case).
* Spaces around NAME, KEY and VALUE are ignored; ``NAME:`` with nothing after the ``:`` is
  ``NAME``. An empty item (``a=1,,b=2``, a trailing ``,``), an item without ``=``, and an
  empty KEY or VALUE are errors.

Every error is a :class:`SpecError` (a ``ValueError``) whose message names the registry and
the whole spec: ``topology spec 'ring:k': parameter 'k' is not KEY=VALUE``. Registries add
their own checks of the name and the parameters on top.

It lives in ``topologies`` (whose specs it began with) and imports nothing, not even the rest
of ``topologies``; ``workloads`` and ``consensus``, which import nothing else of ours, may
import it (the import-linter contracts allow exactly this module).

>>> parse_spec("Random_Regular: degree = 4, seed=1", "topology")
('random-regular', {'degree': '4', 'seed': '1'})
"""

from __future__ import annotations

import re

__all__ = ["SpecError", "parse_spec", "typed_value"]

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class SpecError(ValueError):
    """A spec string that does not follow the grammar; ``spec`` is the string, ``what`` the
    registry it was for (``topology``, ``compressor``...), ``key`` the parameter at fault
    where there is one."""

    def __init__(self, what: str, spec: object, reason: str, *, key: str | None = None) -> None:
        super().__init__(f"{what} spec {spec!r}: {reason}")
        self.what = what
        self.spec = spec
        self.reason = reason
        self.key = key


def parse_spec(spec: object, what: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME[:KEY=VALUE,...]`` into the normalized name and its parameters (text
    values, keys in the order given).

    Args:
        spec: the spec string.
        what: the registry's word for what it names, for messages (``aggregator``).
    Raises :class:`SpecError` for anything the grammar (module docstring) refuses.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(what, spec, "must be NAME or NAME:KEY=VALUE,...; got no NAME")
    head, _, rest = spec.strip().partition(":")
    name = head.strip().lower().replace("_", "-")
    if _NAME.fullmatch(name) is None:
        raise SpecError(
            what,
            spec,
            f"NAME {head.strip()!r} must be letters, digits, '.', '-' or '_' (the form is "
            "NAME or NAME:KEY=VALUE,...)",
        )
    params: dict[str, str] = {}
    if not rest.strip():
        return name, params
    for raw in rest.split(","):
        item = raw.strip()
        if not item:
            raise SpecError(what, spec, "an empty parameter (a stray ','); write KEY=VALUE")
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals:
            raise SpecError(what, spec, f"parameter {item!r} is not KEY=VALUE")
        if _KEY.fullmatch(key) is None:
            raise SpecError(
                what, spec, f"parameter {item!r}: KEY {key!r} must be letters, digits, '_', '-'"
            )
        key = key.replace("-", "_")
        if not value:
            raise SpecError(what, spec, f"parameter {key!r} has no VALUE", key=key)
        if key in params:
            raise SpecError(what, spec, f"parameter {key!r} is given twice", key=key)
        params[key] = value
    return name, params


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def typed_value(text: str, kind: type) -> object:
    """A spec's VALUE ``text`` as ``kind``: a bool from ``true``/``false``, ``1``/``0`` or
    ``yes``/``no`` (any case), anything else by ``kind(text)``; a ``ValueError`` when it is
    not one (the registry names the parameter in its own message).

    >>> typed_value(" Yes", bool), typed_value("0.5", float)
    (True, 0.5)
    """
    text = text.strip()
    if kind is bool:
        lowered = text.lower()
        if lowered not in _TRUE | _FALSE:
            raise ValueError(text)
        return lowered in _TRUE
    return kind(text)
