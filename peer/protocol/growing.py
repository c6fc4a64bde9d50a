"""A buffer a worker thread fills front to back while the event loop streams what is ready.

An exchange's answer is the pair's average, computed in a worker thread (never on the event
loop); the caller's request is a snapshot of its model, copied in a worker thread. Waiting
for the whole buffer before its first byte is sent puts that pass in series with the
transfer. A :class:`GrowingBuffer` lets them overlap: the worker computes the buffer in
chunks and publishes how far it got (:meth:`GrowingBuffer.advance`, thread-safe), and the
body writer (:class:`peer.transport.body.EnvelopeBody`) sends each slice once it is ready
(:meth:`GrowingBuffer.ready`). A worker that fails has its error published instead
(:func:`fill_in_thread`): the writer raises :class:`ProducerFailed` and the body is
never completed, so a reader that authenticates or length-checks the body applies nothing.

The worker publishes the last bytes only when everything it must do is done (a callee
commits the average to its model first): a complete body means a finished worker.
:func:`fill_in_thread` runs a worker with these rules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from peer.protocol.threads import in_thread

__all__ = ["GrowingBuffer", "ProducerFailed", "fill_in_thread"]


class ProducerFailed(Exception):
    """The worker filling a :class:`GrowingBuffer` raised (its error is the ``__cause__``)."""


class GrowingBuffer:
    """``view`` (bytes), written front to back by one worker thread; ``ready(end)`` waits,
    on the event loop, until its first ``end`` bytes are written.

    ``nbytes`` is the final size, known up front (it goes into ``Content-Length``).
    """

    def __init__(self, view: memoryview, loop: asyncio.AbstractEventLoop) -> None:
        view = memoryview(view)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.view = view
        self.nbytes = view.nbytes
        self._loop = loop
        self._ready = 0
        self._error: BaseException | None = None
        self._waiters: set[asyncio.Future[None]] = set()
        self._task: asyncio.Future[Any] | None = None
        self._on_release: list[Callable[[], None]] = []

    # ------------------------------------------------------------ the worker's side

    def advance(self, end: int) -> None:
        """The first ``end`` bytes are written (from any thread)."""
        self._loop.call_soon_threadsafe(self._advanced, end)

    # ------------------------------------------------------------ the loop's side

    @property
    def written(self) -> int:
        """Bytes published as written so far."""
        return self._ready

    async def ready(self, end: int) -> None:
        """Return once the first ``end`` bytes are written; :class:`ProducerFailed` if the
        worker failed first."""
        if end > self.nbytes:
            raise ValueError(f"end {end} is past the buffer's {self.nbytes} bytes")
        while self._ready < end:
            if self._error is not None:
                raise ProducerFailed(str(self._error)) from self._error
            waiter = self._loop.create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)
        if self._error is not None and self._ready < self.nbytes:
            raise ProducerFailed(str(self._error)) from self._error

    async def settled(self) -> None:
        """Wait until the worker returned (or failed), whatever became of the body; its
        error is not raised here (the writer reported it)."""
        task = self._task
        if task is not None:
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: the writer has reported it

    def when_released(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the loop) once the body is done with this buffer and its
        worker has returned: the buffer's memory may then be reused (a pool's ``give``)."""
        self._on_release.append(callback)

    def release(self) -> None:
        """The body is done with this buffer (written, or given up): run the
        :meth:`when_released` callbacks now, or when the worker returns if it still runs."""
        callbacks, self._on_release = self._on_release, []
        if not callbacks:
            return

        def run(_: object = None) -> None:
            for callback in callbacks:
                callback()

        task = self._task
        if task is not None and not task.done():
            task.add_done_callback(run)
        else:
            run()

    def _advanced(self, end: int) -> None:
        self._ready = max(self._ready, min(end, self.nbytes))
        self._wake()

    def _failed(self, error: BaseException) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:  # every reader waiting now
            if not waiter.done():
                waiter.set_result(None)


def fill_in_thread(
    buffer: GrowingBuffer, worker: Callable[..., Any], *args: Any
) -> asyncio.Future[Any]:
    """Start ``worker(*args)`` in a worker thread (:func:`peer.protocol.threads.in_thread`); it calls
    ``buffer.advance`` as it goes. An exception is published to ``buffer`` (and kept in the
    returned future). The buffer keeps the future, so :meth:`GrowingBuffer.settled` waits
    for the worker."""

    async def run() -> Any:
        try:
            return await in_thread(worker, *args)
        except BaseException as error:
            buffer._failed(error)
            raise

    task = asyncio.ensure_future(run())
    buffer._task = task
    return task
