"""The replay cache: the nonces a peer has accepted within its clock window, bounded."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["NonceCache"]


class NonceCache:
    """The nonces seen within the clock window, bounded to ``capacity`` entries.

    Entries older than the window are dropped (their requests would be stale
    anyway). If the cache is still full, the oldest entry is evicted and the
    *floor* rises to its timestamp: from then on every request at or below the
    floor is refused as stale, so an evicted nonce can never be replayed.
    Memory stays bounded; under a flood the effective window shrinks instead.
    """

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.floor = -1
        self._seen: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._seen

    def add(self, nonce: str, timestamp: int, *, oldest_valid: int) -> None:
        """Remember ``nonce``; drop entries whose timestamp is below ``oldest_valid``."""
        while self._seen:
            first_nonce, first_ts = next(iter(self._seen.items()))
            if first_ts >= oldest_valid and len(self._seen) < self.capacity:
                break
            del self._seen[first_nonce]
            if first_ts >= oldest_valid:
                self.floor = max(self.floor, first_ts)
        self._seen[nonce] = timestamp
