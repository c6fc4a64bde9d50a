"""Wrapping ``optimizer.step`` of one optimizer object, as ``torch.optim.lr_scheduler`` does.

:class:`peer.node.background.BackgroundPeer` runs its exchange after the step of the
optimizer your loop already has. :class:`StepWrap` replaces ``step`` on that optimizer
object with a bound method (as ``torch.optim.lr_scheduler`` expects of it, so schedulers
made later wrap ours, and those made before stay inside ours), and restores it.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

SCHEDULER_MARK = "_wrapped_by_lr_sched"
"""What ``torch.optim.lr_scheduler`` marks its own wrapper of ``optimizer.step`` with; ours
carries the mark on when it wraps that wrapper, or the scheduler would warn that the step
was overridden."""

Around = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
"""``around(inner_step, args, kwargs)``: what the wrapped step runs instead of ``inner_step``."""


class StepWrap:
    """``optimizer.step`` replaced by ``around(inner, args, kwargs)`` between
    :meth:`install` and :meth:`uninstall`."""

    def __init__(self, optimizer: torch.optim.Optimizer, around: Around) -> None:
        self.optimizer = optimizer
        self.around = around
        self._wrapped: types.MethodType | None = None
        self._replaced: Any = None

    def install(self) -> None:
        """Wrap ``optimizer.step`` on this optimizer object."""
        optimizer = self.optimizer
        inner: Callable[..., Any] = optimizer.step
        self._replaced = optimizer.__dict__.get("step")

        def step(_optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            return self.around(inner, args, kwargs)

        if hasattr(inner, SCHEDULER_MARK):  # a scheduler made before: its wrapper is inside
            setattr(step, SCHEDULER_MARK, True)
        self._wrapped = types.MethodType(step, optimizer)
        optimizer.step = self._wrapped  # type: ignore[method-assign]

    def uninstall(self) -> None:
        """Restore ``optimizer.step``; if something wrapped ours since (a scheduler made
        later), ours stays in its chain (``around`` then decides to pass straight through)."""
        optimizer = self.optimizer
        if self._wrapped is not None and optimizer.__dict__.get("step") is self._wrapped:
            if self._replaced is None:
                del optimizer.step
            else:
                optimizer.step = self._replaced  # type: ignore[method-assign]
        self._wrapped = None
