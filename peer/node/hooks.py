"""What :meth:`peer.node.peer.Peer.run` does after each optimizer step and each round: the
user's callbacks and a learning-rate scheduler, checked once by :class:`StepHooks`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol

SchedulerEvery = Literal["step", "round"]
SCHEDULER_EVERY: tuple[SchedulerEvery, ...] = ("step", "round")
"""When :meth:`Peer.run` steps a learning-rate scheduler: after every optimizer step, or
after every round (the same with one local step per round)."""

StepCallback = Callable[[int, float], object]
"""``callback(step, loss)``, called after each optimizer step with the new step count and
the loss of that step's batch (NaN if there was none)."""


class Scheduler(Protocol):
    """A learning-rate scheduler: anything with ``step()`` (``torch.optim.lr_scheduler``)."""

    def step(self) -> Any: ...


class StepHooks:
    """What :meth:`Peer.run` does after each optimizer step (and each round), checked once."""

    def __init__(
        self,
        callbacks: Iterable[StepCallback],
        scheduler: Scheduler | None,
        scheduler_every: SchedulerEvery,
    ) -> None:
        self.callbacks = tuple(callbacks)
        for index, callback in enumerate(self.callbacks):
            if not callable(callback):
                raise ValueError(
                    f"callbacks[{index}] must be callable as callback(step, loss), got "
                    f"{type(callback).__name__}"
                )
        if scheduler is not None and not callable(getattr(scheduler, "step", None)):
            raise ValueError(
                "scheduler must be a learning-rate scheduler with step() "
                f"(torch.optim.lr_scheduler), got {type(scheduler).__name__}"
            )
        if scheduler_every not in SCHEDULER_EVERY:
            raise ValueError(
                f"scheduler_every must be one of {', '.join(SCHEDULER_EVERY)}, "
                f"got {scheduler_every!r}"
            )
        self.per_step = scheduler if scheduler_every == "step" else None
        self.per_round = scheduler if scheduler_every == "round" else None


NO_HOOKS = StepHooks((), None, "step")
