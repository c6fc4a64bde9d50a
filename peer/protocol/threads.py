"""Work in a worker thread whose result is not kept alive by asyncio's future chain.

``asyncio.to_thread`` returns its result through a ``concurrent.futures.Future`` chained to
an asyncio future by callbacks that refer to each other: a reference cycle, so the result
lives until Python's cyclic garbage collector runs. For a model-sized tensor that is a model
copy held for nothing, per call (docs/benchmarks.md, "Worker-thread results and garbage
collection"). :func:`in_thread` hands the result over outside the futures, so nothing of
the call outlives its use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_thread(function: Callable[..., T], *args: Any) -> T:
    """``await asyncio.to_thread(function, *args)``, without the result outliving its use."""
    box: list[T] = []

    def run() -> None:
        box.append(function(*args))

    await asyncio.to_thread(run)
    return box.pop()
