"""Exchange health of one peer: is it still averaging, or training alone?

A gossip peer whose exchanges all fail -- every neighbour suspected or evicted,
every call refused, a rule that raises on the other side -- does not stop: it
keeps taking local steps, which is *local training*, not decentralized SGD. The
averaging that makes D-PSGD and AD-PSGD (Lian et al., NeurIPS 2017 / ICML 2018)
converge to one model happens only through exchanges, so a peer with none for
several rounds has left the swarm in all but name. :class:`ExchangeHealth`
counts each round's successful and failed exchanges and says so, once, in the
log, the status and the metrics.

The rule, over a window of ``w`` rounds::

    isolated  <=>  rounds >= w  and  ok(t) == 0 for each of the last w rounds t

A round with nobody to exchange with (no neighbour known) has ``ok == 0`` too.
Becoming isolated logs one WARNING; the first successful round after it logs
one INFO (never a line per round)::

    health = ExchangeHealth("peer-a", window=5)
    for _ in range(5):
        health.record(failed=1)             # a call that failed this round
        health.end_round()                  # the fifth logs the WARNING
    assert health.isolated and health.rounds_without_exchange == 5
    health.record(ok=1)
    health.end_round()                      # logs the INFO "... exchanges again"
    assert not health.isolated

Not thread-safe: a peer calls it from its event loop only.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Literal

logger = logging.getLogger(__name__)

Transition = Literal["isolated", "recovered"]


class ExchangeHealth:
    """Successful and failed exchanges per round, and isolation over the last ``window`` rounds.

    Args:
        peer_id: the peer's id, named in the log lines.
        window: how many consecutive rounds without a successful exchange make the
            peer *isolated* (an integer >= 1).

    Attributes:
        exchanges_ok: successful exchanges since the start (the open round included).
        exchanges_failed: failed exchanges since the start (the open round included).
        rounds: rounds closed by :meth:`end_round`.
        rounds_without_exchange: consecutive closed rounds, up to the last, with no
            successful exchange.
    """

    def __init__(self, peer_id: str, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1 (rounds), got {window!r}")
        self.peer_id = peer_id
        self.window = window
        self.exchanges_ok = 0
        self.exchanges_failed = 0
        self.rounds = 0
        self.rounds_without_exchange = 0
        self._open_ok = 0
        self._open_failed = 0
        self._recent: deque[tuple[int, int]] = deque(maxlen=window)
        self._isolated = False

    @property
    def isolated(self) -> bool:
        """No successful exchange in each of the last ``window`` rounds (>= ``window`` run)."""
        return self._isolated

    def record(self, *, ok: int = 0, failed: int = 0) -> None:
        """Count ``ok`` successful and ``failed`` failed exchanges in the open round."""
        for name, value in (("ok", ok), ("failed", failed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        self._open_ok += ok
        self._open_failed += failed
        self.exchanges_ok += ok
        self.exchanges_failed += failed

    def end_round(self) -> Transition | None:
        """Close the open round; returns ``"isolated"`` or ``"recovered"`` on a change, else None.

        Logs the change: a WARNING when the peer becomes isolated, an INFO when an
        isolated peer exchanges successfully again.
        """
        ok, failed = self._open_ok, self._open_failed
        self._open_ok = self._open_failed = 0
        self._recent.append((ok, failed))
        self.rounds += 1
        without = self.rounds_without_exchange
        self.rounds_without_exchange = 0 if ok else without + 1
        now = self.rounds >= self.window and self.rounds_without_exchange >= self.window
        if now == self._isolated:
            return None
        self._isolated = now
        if now:
            logger.warning(
                "peer %s: no successful exchange in the last %d rounds (%d failed); "
                "it is training alone",
                self.peer_id,
                self.window,
                sum(f for _, f in self._recent),
            )
            return "isolated"
        logger.info(
            "peer %s: exchanging again (%d successful this round) after %d rounds without",
            self.peer_id,
            ok,
            without,
        )
        return "recovered"

    def to_json(self) -> dict[str, Any]:
        """The status fields: ``exchanges`` {ok, failed}, ``isolated``, ``rounds_without_exchange``."""
        return {
            "exchanges": {"ok": self.exchanges_ok, "failed": self.exchanges_failed},
            "isolated": self._isolated,
            "rounds_without_exchange": self.rounds_without_exchange,
        }
