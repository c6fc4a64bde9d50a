"""The model lock: a mutex that counts how often it was taken.

Every change to a peer's model (an optimizer step, a mix, an adopted average, a restore)
happens under its lock, so a holder that sees the count unchanged since its own last hold,
plus one, knows that nobody touched the model in between. The caller of an exchange uses
this to skip comparing its model with the snapshot it sent, a full pass over the model:
``gossip.PairwiseGossip.caller_update`` is then told the model *is* the snapshot
(``sent = own``), which takes the answer exactly, as the comparison would have found.
The count is conservative: a reader that only looked also counts, which costs the
comparison, never correctness.
"""

from __future__ import annotations

import threading
from types import TracebackType

__all__ = ["ModelLock"]


class ModelLock:
    """A :class:`threading.Lock` (same methods) with :attr:`acquisitions`, the number of
    times it was acquired, updated while it is held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acquisitions = 0
        """Times this lock was taken; read it while holding the lock."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        acquired = self._lock.acquire(blocking, timeout)
        if acquired:
            self.acquisitions += 1
        return acquired

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
