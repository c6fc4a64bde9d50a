"""The model lock counts its holders; an exchange's caller relies on the count to know its
model still is the snapshot it sent, and keeps progress made while the answer was away."""

from __future__ import annotations

import asyncio
import threading
from contextlib import AsyncExitStack

import torch

from peer.node.model_lock import ModelLock

from .test_swarm import swarm


def test_the_count_grows_by_one_per_hold_and_not_for_a_failed_try() -> None:
    lock = ModelLock()
    assert lock.acquisitions == 0 and not lock.locked()
    with lock:
        assert lock.locked() and lock.acquisitions == 1
        refused: list[bool] = []
        thread = threading.Thread(target=lambda: refused.append(lock.acquire(blocking=False)))
        thread.start()
        thread.join()
        assert refused == [False] and lock.acquisitions == 1
    assert lock.acquire(timeout=1.0) and lock.acquisitions == 2
    lock.release()
    assert not lock.locked()


async def wait_until(condition: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_an_untouched_caller_takes_the_answer_exactly() -> None:
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        assert await a.gossip() == 1
        assert torch.equal(a.flat.vector, b.flat.vector)  # the callee's average, bit for bit


async def test_a_step_while_the_answer_is_away_is_kept() -> None:
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        x_a, x_b = a.flat.vector.clone(), b.flat.vector.clone()
        step = torch.full_like(x_a, 0.25)
        taken = a.lock.acquisitions
        b.lock.acquire()  # the callee cannot average until we let it
        try:
            call = asyncio.create_task(a.gossip())
            # the caller's snapshot is taken (one hold of its lock) and the request is out
            await wait_until(lambda: a.lock.acquisitions > taken and not a.lock.locked())
            with a.lock:  # a training step of the caller, under its lock, meanwhile
                a.flat.vector.add_(step)
        finally:
            b.lock.release()
        assert await call == 1
        average = (x_a + x_b) / 2
        torch.testing.assert_close(b.flat.vector, average)
        # x_a + step + (answer - sent): the average, plus the progress made meanwhile
        torch.testing.assert_close(a.flat.vector, average + step)
