"""The one strict JSON decoder for everything that crosses the network as JSON.

``json.loads`` on untrusted bytes is not enough: it recurses once per nesting
level (a body of 100,000 ``[`` raises ``RecursionError``, which no handler
expects), accepts ``NaN`` and ``Infinity``, keeps the last of duplicate keys, and
spends quadratic time on long integers. :func:`loads` refuses all of these as a
typed :class:`~peer.protocol.errors.MalformedBody` (a 400 on the server, a refused
neighbour on the client) before or while decoding:

- the size is checked first (:class:`~peer.protocol.errors.BodyTooLarge`);
- the nesting depth is measured without recursion (strings are blanked out with
  one regular expression, then brackets are counted with a cumulative sum), and
  more than ``max_depth`` levels is refused before ``json`` sees the text;
- the text must be UTF-8; ``NaN``/``Infinity``, duplicate object keys and integers
  of more than 40 digits are refused.

The shape checks (which keys, which types) belong to the caller: see
:func:`expect_object`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from peer.protocol.errors import BodyTooLarge, MalformedBody

MAX_DEPTH = 32
"""Default nesting bound; protocol JSON is at most 3 levels deep."""
MAX_INT_DIGITS = 40
"""Longest integer literal accepted (a round or a byte count needs at most 20)."""

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def nesting_depth(data: bytes) -> int:
    """How deep the JSON text's arrays and objects nest, without recursion.

    Strings are removed first, so brackets inside them do not count. An unbalanced
    text gets some depth; ``json`` refuses it afterwards anyway.
    """
    text = _STRING.sub(b'""', data)
    raw = np.frombuffer(text, dtype=np.uint8)
    if raw.size == 0:
        return 0
    steps = np.isin(raw, (0x5B, 0x7B)).astype(np.int32) - np.isin(raw, (0x5D, 0x7D)).astype(
        np.int32
    )
    return int(np.cumsum(steps).max(initial=0))


def _constant(name: str) -> Any:
    raise MalformedBody(f"{name} is not a JSON number this protocol accepts")


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise MalformedBody(f"integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedBody(f"duplicate key {key[:64]!r} in a JSON object")
            seen.add(key)
    return obj


def loads(data: bytes, *, what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Decode untrusted JSON ``data``; every failure is a typed protocol error.

    Args:
        data: the raw body.
        what: what the body is (``"join body"``, ``"membership view"``), for messages.
        max_bytes: size cap (:class:`~peer.protocol.errors.BodyTooLarge` beyond it).
        max_depth: nesting cap (:class:`~peer.protocol.errors.MalformedBody` beyond it).
    """
    if len(data) > max_bytes:
        raise BodyTooLarge(f"{what} has {len(data)} bytes, the cap is {max_bytes}")
    depth = nesting_depth(data)
    if depth > max_depth:
        raise MalformedBody(f"{what} nests {depth} levels deep (at most {max_depth})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedBody(f"{what} is not UTF-8") from None
    try:
        return json.loads(
            text,
            parse_constant=_constant,
            parse_int=_integer,
            object_pairs_hook=_unique_keys,
        )
    except MalformedBody as error:
        raise MalformedBody(f"{what}: {error.detail}") from None
    except (ValueError, RecursionError):
        raise MalformedBody(f"{what} is not valid JSON") from None


def expect_object(
    obj: Any, *, what: str, required: dict[str, type | tuple[type, ...]]
) -> dict[str, Any]:
    """``obj`` as a JSON object holding exactly the ``required`` keys with those types.

    ``bool`` is never accepted where ``int`` is asked for (``true`` is not a round).
    """
    if not isinstance(obj, dict):
        raise MalformedBody(f"{what} must be a JSON object with keys {sorted(required)}")
    if set(obj) != set(required):
        extra = sorted(set(obj) - set(required))
        missing = sorted(set(required) - set(obj))
        raise MalformedBody(
            f"{what} must have exactly the keys {sorted(required)} "
            f"(missing {missing}, unexpected {[k[:64] for k in extra]})"
        )
    for key, kind in required.items():
        value = obj[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise MalformedBody(f"{what}: {key} must be {names}, got {type(value).__name__}")
    return obj
