"""Stragglers and churn of a local swarm: ``launch --stragglers`` and ``launch --crashes``.

The real counterparts of the simulator's ``[network]`` models (:mod:`sim.network`):

* ``--stragglers PEER=FACTOR[,...]`` is ``stragglers = {PEER = FACTOR}``: those peers get
  ``gossipnet peer --slowdown FACTOR`` (each local step takes FACTOR times its compute,
  :mod:`peer.node.straggler`). PEER is an id or a range ``A-B``, as the simulator's keys.
"""

from __future__ import annotations

import math


def _peers(text: str, peers: int, flag: str) -> tuple[int, ...]:
    """The ids ``"3"`` or ``"2-4"`` names, each in ``[0, peers)``."""
    first, dash, last = text.strip().partition("-")
    if not first.strip().isdigit() or (dash and not last.strip().isdigit()):
        raise ValueError(f"{flag}: a peer must be an id or a range A-B, got {text.strip()!r}")
    low = int(first)
    high = int(last) if dash else low
    if high < low:
        raise ValueError(f"{flag}: range {text.strip()} is empty; write it low-high")
    if high >= peers:
        raise ValueError(f"{flag}: peer {high} is outside 0..{peers - 1} (--peers {peers})")
    return tuple(range(low, high + 1))


def _number(text: str, flag: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: {what} must be a number, got {text.strip()!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag}: {what} must be finite, got {text.strip()!r}")
    return value


def parse_stragglers(text: str | None, peers: int) -> dict[int, float]:
    """``--stragglers PEER=FACTOR[,PEER=FACTOR...]`` as peer -> factor (empty for None); a
    ``ValueError`` starting ``--stragglers:`` for an id outside ``[0, peers)``, a peer given
    twice, or a factor that is not a finite number >= 1."""
    flag = "--stragglers"
    found: dict[int, float] = {}
    if text is None:
        return found
    for entry in text.split(","):
        key, equals, value = entry.partition("=")
        if not equals:
            raise ValueError(f"{flag}: each entry must be PEER=FACTOR (e.g. 3=3.0), got {entry!r}")
        factor = _number(value, flag, f"the factor of {key.strip()}")
        if factor < 1:
            raise ValueError(f"{flag}: the factor of {key.strip()} must be >= 1, got {factor:g}")
        for peer in _peers(key, peers, flag):
            if peer in found:
                raise ValueError(f"{flag}: peer {peer} is given twice; give it once")
            found[peer] = factor
    return found
