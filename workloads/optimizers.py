"""The local optimizer, declared once: its keys, their checks, the learning rate at step t.

:class:`LocalOptimizer` is every setting of the optimizer a peer steps between exchanges,
with its learning-rate schedule and gradient clipping. ``gossipnet peer`` and
``gossipnet launch`` take its keys as flags (``warmup_steps`` -> ``--warmup-steps``; ``name``
is ``--optimizer``), the simulator's ``[optimizer]`` table as keys (``sim.algorithms.
OptimizerConfig`` is this class, built over all peers' stacked ``[n, d]`` parameters), and
:func:`workloads.train_centralized` as an object. A key the chosen optimizer or schedule does
not read is an error naming it (:data:`OPTIMIZER_KEYS` says who reads what).

- ``sgd``: momentum (Polyak 1964), Nesterov (Sutskever et al., ICML 2013), weight decay
  added to the gradient: ``b <- μ b + g + λ x``, ``x <- x − η_t b`` (Nesterov:
  ``x − η_t (g + λ x + μ b)``).
- ``adam`` (Kingma & Ba, ICLR 2015) and ``adamw`` (decoupled weight decay, Loshchilov &
  Hutter, ICLR 2019: DiLoCo's inner optimizer): ``x <- x − η_t m̂ / (√v̂ + ε)`` with
  ``betas`` for the moments; adam adds ``λ x`` to the gradient, adamw shrinks
  ``x <- (1 − η_t λ) x`` instead.

The schedule (:meth:`LocalOptimizer.lr_at`, the one function both runners call): a linear
warm-up ``η_t = η (t + 1) / W`` for the first ``warmup_steps`` W steps, then ``constant``
``η``, ``cosine`` decay ``η_min + (η − η_min)(1 + cos(π s / D)) / 2`` over ``s = t − W``
clamped to ``decay_steps`` D (Loshchilov & Hutter, ICLR 2017, without restarts), or
``step`` decay ``η γ^⌊s / step_size⌋``. Clipping (``clip_norm`` c, per peer):
``g <- g · min(1, c / (‖g‖₂ + 10⁻⁶))`` with the peer's global norm, before the step
(torch.nn.utils.clip_grad_norm_'s rule).

    >>> import torch
    >>> net = torch.nn.Linear(3, 2)
    >>> settings = LocalOptimizer("adamw", lr=1e-3, schedule="cosine", decay_steps=100)
    >>> type(settings.torch_optimizer(net.parameters())).__name__
    'AdamW'
    >>> settings.lr_at(0), settings.lr_at(100)
    (0.001, 0.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch import Tensor

__all__ = [
    "LOCAL_OPTIMIZERS",
    "OPTIMIZER_KEYS",
    "SCHEDULES",
    "SGD_MOMENTUM",
    "LocalOptimizer",
    "OptimizerKey",
    "attach_schedule",
    "clip_rows_",
]

LOCAL_OPTIMIZERS = ("sgd", "adam", "adamw")
"""SGD (momentum: Polyak 1964), Adam (Kingma & Ba 2015), AdamW (Adam with decoupled weight
decay, Loshchilov & Hutter 2019: DiLoCo's inner optimizer)."""

SCHEDULES = ("constant", "cosine", "step")
"""The learning-rate schedules after the warm-up (:meth:`LocalOptimizer.lr_at`)."""

SGD_MOMENTUM = 0.9
"""SGD's momentum on ``gossipnet peer``/``launch`` and ``train_centralized`` when none is
given (the simulator's ``[optimizer]`` table: 0)."""

SCHEDULE_STEP = "schedule_step"
"""The param-group key where an optimizer with a schedule counts its steps (saved with the
optimizer's state, so a resumed peer goes on where it stopped)."""

CLIP_EPSILON = 1e-6
"""Added to the norm in clipping (torch.nn.utils.clip_grad_norm_'s)."""


@dataclass(frozen=True)
class OptimizerKey:
    """One key of the local optimizer: what it means, and which optimizers and schedules
    read it (a key given to others is an error)."""

    name: str
    help: str
    optimizers: tuple[str, ...] = LOCAL_OPTIMIZERS
    schedules: tuple[str, ...] = SCHEDULES

    @property
    def flag(self) -> str:
        """Its command-line flag (``--optimizer`` for ``name``)."""
        return "--optimizer" if self.name == "name" else "--" + self.name.replace("_", "-")


OPTIMIZER_KEYS: dict[str, OptimizerKey] = {
    key.name: key
    for key in (
        OptimizerKey("name", "local optimizer: " + ", ".join(LOCAL_OPTIMIZERS)),
        OptimizerKey("lr", "learning rate, > 0 (the peak when there is a schedule)"),
        OptimizerKey("momentum", "SGD momentum in [0, 1)", optimizers=("sgd",)),
        OptimizerKey("nesterov", "Nesterov momentum (needs momentum > 0)", optimizers=("sgd",)),
        OptimizerKey(
            "betas", "Adam's two moment decays, each in [0, 1)", optimizers=("adam", "adamw")
        ),
        OptimizerKey("eps", "Adam's epsilon, > 0", optimizers=("adam", "adamw")),
        OptimizerKey("weight_decay", "weight decay, >= 0 (adamw: decoupled)"),
        OptimizerKey("schedule", "learning-rate schedule: " + ", ".join(SCHEDULES)),
        OptimizerKey("warmup_steps", "steps of linear warm-up before the schedule, >= 0"),
        OptimizerKey("min_lr", "the learning rate at the end, in [0, lr]", schedules=("cosine",)),
        OptimizerKey(
            "decay_steps",
            "steps from the peak to min_lr after the warm-up (default: the run's steps "
            "less the warm-up)",
            schedules=("cosine",),
        ),
        OptimizerKey("gamma", "the factor every step_size steps, in (0, 1]", schedules=("step",)),
        OptimizerKey("step_size", "steps between two decays, >= 1 (required)", schedules=("step",)),
        OptimizerKey(
            "clip_norm",
            "clip each peer's gradient to this global L2 norm, > 0 (default: no clipping)",
        ),
    )
}
"""Every key of the local optimizer (the ``[optimizer]`` table's keys; the flags are these
with dashes, ``name`` is ``--optimizer``)."""


def _range(bracket: str) -> str:
    return bracket if bracket[0] in "<>" else f"in {bracket}"


def _number(key: str, value: Any, *, low: float, high: float = math.inf, open_low: bool = False,
            open_high: bool = False) -> float:  # fmt: skip
    if high == math.inf:  # a lower bound only: "> 0", ">= 0"
        bracket = ("> " if open_low else ">= ") + f"{low:g}"
    else:
        bracket = ("(" if open_low else "[") + f"{low:g}, {high:g}" + (")" if open_high else "]")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key}: must be a finite number {_range(bracket)}; got {value!r}")
    if value < low or value > high or (open_low and value == low) or (open_high and value == high):
        raise ValueError(f"{key}: must be a finite number {_range(bracket)}; got {value!r}")
    return float(value)


def _integer(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}: must be an integer >= {minimum}; got {value!r}")
    return value


def _betas(value: Any) -> tuple[float, float]:
    """``(0.9, 0.95)`` from a pair, a list or ``"0.9,0.95"``."""
    if isinstance(value, str):
        parts: list[Any] = [part.strip() for part in value.split(",")]
        try:
            parts = [float(part) for part in parts]
        except ValueError:
            raise ValueError(
                f"betas: must be two numbers in [0, 1) like 0.9,0.999; got {value!r}"
            ) from None
    elif isinstance(value, list | tuple):
        parts = list(value)
    else:
        raise ValueError(f"betas: must be two numbers in [0, 1) like 0.9,0.999; got {value!r}")
    if len(parts) != 2:
        raise ValueError(f"betas: must be two numbers in [0, 1) like 0.9,0.999; got {value!r}")
    first, second = (_number("betas", part, low=0.0, high=1.0, open_high=True) for part in parts)
    return first, second


def _boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{key}: must be true or false; got {value!r}")


@dataclass(frozen=True)
class LocalOptimizer:
    """The local optimizer, its learning-rate schedule and gradient clipping, checked when
    made: a ``ValueError`` whose message starts with the key at fault (``momentum: ...``).

    A key that ``name`` or ``schedule`` does not read (:data:`OPTIMIZER_KEYS`) must keep its
    default; :meth:`from_keys` refuses such a key as soon as it is given. ``decay_steps``
    of a cosine schedule left out is the run's steps less the warm-up (:meth:`for_run`).
    """

    name: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    nesterov: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    decay_steps: int | None = None
    gamma: float = 0.1
    step_size: int | None = None
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        if self.name not in LOCAL_OPTIMIZERS:
            raise ValueError(f"name: got {self.name!r}; allowed: {', '.join(LOCAL_OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: got {self.schedule!r}; allowed: {', '.join(SCHEDULES)}")
        object.__setattr__(self, "nesterov", _boolean("nesterov", self.nesterov))
        object.__setattr__(self, "betas", _betas(self.betas))
        defaults = {f.name: f.default for f in dataclasses.fields(LocalOptimizer)}
        for key in OPTIMIZER_KEYS.values():
            value = getattr(self, key.name)
            if value != defaults[key.name] and not self._reads(key):
                raise ValueError(self._unread(key))
        _number("lr", self.lr, low=0.0, open_low=True)
        _number("momentum", self.momentum, low=0.0, high=1.0, open_high=True)
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov: needs momentum > 0; got momentum 0")
        _number("eps", self.eps, low=0.0, open_low=True)
        _number("weight_decay", self.weight_decay, low=0.0)
        _integer("warmup_steps", self.warmup_steps, 0)
        _number("min_lr", self.min_lr, low=0.0, high=float(self.lr))
        if self.decay_steps is not None:
            _integer("decay_steps", self.decay_steps, 1)
        _number("gamma", self.gamma, low=0.0, high=1.0, open_low=True)
        if self.schedule == "step" and self.step_size is None:
            raise ValueError("step_size: the step schedule needs it (steps between two decays)")
        if self.step_size is not None:
            _integer("step_size", self.step_size, 1)
        if self.clip_norm is not None:
            _number("clip_norm", self.clip_norm, low=0.0, open_low=True)

    def _reads(self, key: OptimizerKey) -> bool:
        return self.name in key.optimizers and self.schedule in key.schedules

    def _unread(self, key: OptimizerKey) -> str:
        if self.name not in key.optimizers:
            return (
                f"{key.name}: optimizer {self.name} does not read it (only "
                f"{', '.join(key.optimizers)}); leave it out"
            )
        return (
            f"{key.name}: schedule {self.schedule} does not read it (only "
            f"{', '.join(key.schedules)}); leave it out"
        )

    @classmethod
    def from_keys(cls, keys: Mapping[str, Any]) -> Self:
        """The optimizer the given keys describe (the ``[optimizer]`` table, the flags that
        were given); the others keep their defaults. A key that is not one of
        :data:`OPTIMIZER_KEYS`, or that the chosen optimizer or schedule does not read, is a
        ``ValueError`` naming it."""
        for key in keys:
            if key not in OPTIMIZER_KEYS:
                raise ValueError(f"{key}: unknown key; allowed: {', '.join(OPTIMIZER_KEYS)}")
        name = keys.get("name", cls.name)
        schedule = keys.get("schedule", cls.schedule)
        probe = cls(
            name=name if name in LOCAL_OPTIMIZERS else cls.name,
            schedule=schedule if schedule in SCHEDULES else cls.schedule,
            step_size=1 if schedule == "step" else None,
        )
        if name in LOCAL_OPTIMIZERS and schedule in SCHEDULES:
            for key in keys:
                if not probe._reads(OPTIMIZER_KEYS[key]):
                    raise ValueError(probe._unread(OPTIMIZER_KEYS[key]))
        return cls(**keys)

    def for_run(self, total_steps: int | None) -> Self:
        """This optimizer for a run of ``total_steps`` optimizer steps (None: until
        stopped): a cosine schedule without ``decay_steps`` decays over the steps after the
        warm-up (at least 1). Without a step count it needs ``decay_steps``."""
        if self.schedule != "cosine" or self.decay_steps is not None:
            return self
        if total_steps is None:
            raise ValueError(
                "decay_steps: the cosine schedule needs it when the run has no step count"
            )
        return dataclasses.replace(self, decay_steps=max(1, total_steps - self.warmup_steps))

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate changes with the step (a warm-up or a decay)."""
        return self.warmup_steps > 0 or self.schedule != "constant"

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0 for the first): the linear warm-up, then
        the schedule (the module's docstring has the formulas). A cosine schedule reaches
        ``min_lr`` at step ``warmup_steps + decay_steps`` and stays there."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step: must be an integer >= 0; got {step!r}")
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        since = step - self.warmup_steps
        if self.schedule == "cosine":
            if self.decay_steps is None:
                raise ValueError(
                    "decay_steps: the cosine schedule needs it (or the run's steps: for_run)"
                )
            done = min(since, self.decay_steps) / self.decay_steps
            return self.min_lr + (self.lr - self.min_lr) * (1 + math.cos(math.pi * done)) / 2
        if self.schedule == "step":
            assert self.step_size is not None  # checked when made
            return self.lr * self.gamma ** (since // self.step_size)
        return self.lr

    def torch_optimizer(
        self, params: Iterable[torch.nn.Parameter] | Iterable[Tensor]
    ) -> torch.optim.Optimizer:
        """One peer's torch optimizer over ``params``, with the schedule and the clipping
        (of those parameters' global gradient norm) run at each ``step()``
        (:func:`attach_schedule`)."""
        optimizer = _torch_optimizer(self, params)
        attach_schedule(optimizer, self)
        return optimizer


def _torch_optimizer(
    settings: LocalOptimizer, params: Iterable[torch.nn.Parameter] | Iterable[Tensor], **more: Any
) -> torch.optim.Optimizer:
    if settings.name == "sgd":
        return torch.optim.SGD(
            params,
            lr=settings.lr,
            momentum=settings.momentum,
            nesterov=settings.nesterov,
            weight_decay=settings.weight_decay,
            **more,
        )
    kind = torch.optim.Adam if settings.name == "adam" else torch.optim.AdamW
    return kind(
        params, lr=settings.lr, betas=settings.betas, eps=settings.eps,
        weight_decay=settings.weight_decay, **more,
    )  # fmt: skip


@torch.no_grad()
def clip_rows_(grads: Tensor, clip_norm: float) -> Tensor:
    """Clip each row of ``grads [*, d]`` in place to L2 norm ``clip_norm``:
    ``g_i <- g_i · min(1, c / (‖g_i‖₂ + 10⁻⁶))`` (one peer per row; a ``[d]`` tensor is one
    peer); returns ``grads``. Vectorized over the rows."""
    norms = torch.linalg.vector_norm(grads, dim=-1, keepdim=True)
    return grads.mul_((clip_norm / (norms + CLIP_EPSILON)).clamp_(max=1.0))


def attach_schedule(
    optimizer: torch.optim.Optimizer,
    settings: LocalOptimizer,
    *,
    rows: bool = False,
    start: int = 0,
) -> torch.optim.Optimizer:
    """Run ``settings``' clipping and schedule at each ``optimizer.step()`` (a step
    pre-hook): clip the gradients, set every group's lr to ``settings.lr_at(t)``, count the
    step. ``t`` starts at ``start`` and is kept in the param group (:data:`SCHEDULE_STEP`),
    so it is saved and restored with the optimizer's state. ``rows``: each parameter is a
    stacked ``[n, d]`` leaf of n peers, clipped per row (the simulator); otherwise the
    optimizer is one peer's, clipped by the global norm of all its gradients. Nothing is
    attached when there is neither a schedule nor clipping. Returns ``optimizer``."""
    if not settings.scheduled and settings.clip_norm is None:
        return optimizer
    if settings.schedule == "cosine" and settings.decay_steps is None:
        settings.lr_at(settings.warmup_steps)  # raises: naming decay_steps
    for group in optimizer.param_groups:
        group[SCHEDULE_STEP] = start

    def before_step(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        clip = settings.clip_norm
        if clip is not None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if rows:  # each a stacked leaf (one per optimizer in the simulator): per row
                for param in params:
                    if param.grad is not None:
                        clip_rows_(param.grad, clip)
            else:
                torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], clip)
        for group in optimizer.param_groups:
            step = int(group.get(SCHEDULE_STEP, start))
            if settings.scheduled:
                group["lr"] = settings.lr_at(step)
            group[SCHEDULE_STEP] = step + 1

    optimizer.register_step_pre_hook(before_step)
    return optimizer
