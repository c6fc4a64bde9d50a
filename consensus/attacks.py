"""Byzantine attacks: what a Byzantine node sends, from what it may observe.

Every attack is called as::

    attack(own, honest=None, *, honest_mask=None, target=None,
           honest_weights=None, byzantine_weight=None, generator=None) -> [*, d]

``own [*, d]`` is the vector the Byzantine node would have sent if honest,
``honest [*, h, d]`` the honest messages it can see (those arriving at its
target; ``honest_mask [*, h]`` marks padding), ``target [*, d]`` the target's
own vector and ``honest_weights [*, h]`` / ``byzantine_weight [*]`` the
target's mixing weights on its honest and on its Byzantine neighbours (only
the dissensus attack needs those). The leading batch ``*`` lets the simulator
compute all Byzantine messages in one call. Randomness comes from an explicit
``torch.Generator``: the one passed in, else the attack's own, seeded by its
``seed`` parameter (``reset()`` rewinds it).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from consensus.base import check_float, check_int
from consensus.registry import Entry, Parameter, describe, parse_component


@runtime_checkable
class Attack(Protocol):
    """What a Byzantine node sends; see the module docstring for the arguments.

    ``needs_honest`` says whether the attack reads the honest messages (an omniscient
    attack, sent once per receiver) or only the sender's own message (sent per edge).
    ``for_neighbourhood(n, f)`` is the attack to run against one receiver whose
    neighbourhood holds n vectors (own included) of which f come from Byzantine
    neighbours; :mod:`consensus.injection` calls it so that attacks whose formula depends
    on (n, f) (ALIE) see each receiver's real neighbourhood.
    """

    needs_honest: ClassVar[bool]

    def for_neighbourhood(self, n: int, f: int) -> Attack: ...

    def __call__(
        self,
        own: Tensor,
        honest: Tensor | None = None,
        *,
        honest_mask: Tensor | None = None,
        target: Tensor | None = None,
        honest_weights: Tensor | None = None,
        byzantine_weight: Tensor | float | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor: ...


def alie_z(n: int, f: int) -> float:
    """ALIE's z = Phi^-1((n - f - s) / (n - f)) with s = floor(n/2 + 1) - f (Baruch et al. 2019).

    0.253 at (n, f) = (25, 5), 0.157 at (20, 4), 0 at (16, 2).
    """
    n = check_int("alie", "n", n, 1)
    f = check_int("alie", "f", f, 0)
    if f >= n:
        raise ValueError(f"alie needs 0 <= f < n, got n={n}, f={f}")
    s = math.floor(n / 2 + 1) - f
    p = (n - f - s) / (n - f)
    if not 0.0 < p < 1.0:
        raise ValueError(
            f"alie needs 0 < (n-f-s)/(n-f) < 1 with s = floor(n/2+1)-f, got {p:.4g} at n={n}, f={f}"
        )
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64, device="cpu")))


class AttackBase:
    """Input checks shared by every attack; subclasses implement ``_send``."""

    name: ClassVar[str] = ""
    needs_honest: ClassVar[bool] = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_int(self.name, "seed", seed, 0)
        self._generator = torch.Generator().manual_seed(self.seed)

    def reset(self) -> None:
        self._generator.manual_seed(self.seed)

    def for_neighbourhood(self, n: int, f: int) -> Attack:
        """The attack against a receiver with n = own + present neighbours, f of them Byzantine.

        Most attacks do not depend on (n, f) and return themselves; see
        :meth:`ALittleIsEnough.for_neighbourhood`.
        """
        n = check_int(self.name, "n", n, 1)
        f = check_int(self.name, "f", f, 0)
        if f >= n:
            raise ValueError(f"{self.name}: needs 0 <= f < n for a neighbourhood, got n={n}, f={f}")
        return self

    def __call__(
        self,
        own: Tensor,
        honest: Tensor | None = None,
        *,
        honest_mask: Tensor | None = None,
        target: Tensor | None = None,
        honest_weights: Tensor | None = None,
        byzantine_weight: Tensor | float | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        if not isinstance(own, Tensor) or not own.is_floating_point() or own.ndim < 1:
            raise ValueError(f"{self.name}: own must be a floating-point tensor of shape [*, d]")
        if honest is not None:
            if (
                honest.ndim != own.ndim + 1
                or honest.shape[:-2] != own.shape[:-1]
                or (honest.shape[-1] != own.shape[-1])
            ):
                raise ValueError(
                    f"{self.name}: honest must have shape [*, h, d] matching own "
                    f"{list(own.shape)}, got {list(honest.shape)}"
                )
            h = honest.shape[-2]
            if honest_mask is None:
                honest_mask = torch.ones(honest.shape[:-1], dtype=torch.bool, device=own.device)
            elif honest_mask.shape != honest.shape[:-1] or honest_mask.dtype != torch.bool:
                raise ValueError(
                    f"{self.name}: honest_mask must be a bool tensor of shape "
                    f"{[*own.shape[:-1], h]}, got {honest_mask.dtype} {list(honest_mask.shape)}"
                )
            if bool((honest_mask.sum(-1) == 0).any()):
                raise ValueError(f"{self.name}: every node needs at least one honest message")
        elif self.needs_honest:
            raise ValueError(f"{self.name} needs the honest messages (honest [*, h, d])")
        return self._send(
            own,
            honest,
            honest_mask,
            target=target,
            honest_weights=honest_weights,
            byzantine_weight=byzantine_weight,
            generator=self._generator if generator is None else generator,
        )

    def _send(
        self,
        own: Tensor,
        honest: Tensor | None,
        honest_mask: Tensor | None,
        *,
        target: Tensor | None,
        honest_weights: Tensor | None,
        byzantine_weight: Tensor | float | None,
        generator: torch.Generator,
    ) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


def honest_statistics(honest: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Coordinate-wise mean and (unbiased, 0 for one message) standard deviation over present rows.

    Absent rows may hold anything, NaN included: they are selected away, not multiplied by 0.
    """
    present = mask[..., None]
    count = mask.to(honest.dtype).sum(-1, keepdim=True)
    mean = torch.where(present, honest, 0.0).sum(-2) / count
    spread = torch.where(present, honest - mean.unsqueeze(-2), 0.0)
    var = (spread**2).sum(-2) / (count - 1).clamp_min(1)
    return mean, var.sqrt()


def _required(name: str, honest: Tensor | None, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    if honest is None or mask is None:
        raise ValueError(f"{name} needs the honest messages (honest [*, h, d])")
    return honest, mask


def _noise(shape: torch.Size, like: Tensor, generator: torch.Generator) -> Tensor:
    # drawn where the (seeded) generator lives, then moved: the same noise on every device
    noise = torch.randn(shape, generator=generator, dtype=like.dtype, device=generator.device)
    return noise.to(like.device)


class SignFlip(AttackBase):
    """Sign flip, spec name ``sign-flip``: send -x_own (Allen-Zhu et al. 2021, "Byzantine-resilient non-convex SGD")."""

    name = "sign-flip"

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **_: Any
    ) -> Tensor:
        return -own


class GaussianNoise(AttackBase):
    """Gaussian noise, spec name ``gaussian:sigma=S``: send x_own + sigma * xi, xi ~ N(0, I).

    Blanchard et al. (NeurIPS 2017) use Gaussian Byzantine vectors.
    """

    name = "gaussian"

    def __init__(self, sigma: float = 1.0, seed: int = 0) -> None:
        self.sigma = check_float(self.name, "sigma", sigma, 0.0)
        super().__init__(seed)

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **kw: Any
    ) -> Tensor:
        return own + self.sigma * _noise(own.shape, own, kw["generator"])


class Scaling(AttackBase):
    """Scaling, spec name ``scaling:scale=LAMBDA``: send lambda * x_own (Bhagoji et al. 2019, boosting)."""

    name = "scaling"

    def __init__(self, scale: float = 10.0) -> None:
        if (
            isinstance(scale, bool)
            or not isinstance(scale, int | float)
            or not math.isfinite(scale)
        ):
            raise ValueError(f"scaling: parameter scale must be a finite number, got {scale!r}")
        self.scale = float(scale)
        super().__init__()

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **_: Any
    ) -> Tensor:
        return self.scale * own


class ALittleIsEnough(AttackBase):
    """ALIE, spec name ``alie:f=F,n=N,z=Z``: send mu - z sigma (coordinate-wise over honest messages).

    Baruch, Baruch & Goldberg, "A little is enough: circumventing defenses
    for distributed learning" (NeurIPS 2019): z = Phi^-1((n-f-s)/(n-f)),
    s = floor(n/2+1) - f, see :func:`alie_z`. n defaults, per node, to the
    number of present honest messages plus f; ``z`` overrides the formula,
    which gives z ~ 0 for small n.
    """

    name = "alie"
    needs_honest = True

    def __init__(self, f: int = 1, n: int | None = None, z: float | None = None) -> None:
        self.f = check_int(self.name, "f", f, 0)
        self.n = None if n is None else check_int(self.name, "n", n, 1)
        if z is not None and (
            isinstance(z, bool) or not isinstance(z, int | float) or not math.isfinite(z)
        ):
            raise ValueError(f"alie: parameter z must be a finite number, got {z!r}")
        self.z = None if z is None else float(z)
        if self.n is not None and self.z is None:
            alie_z(self.n, self.f)
        super().__init__()

    def for_neighbourhood(self, n: int, f: int) -> Attack:
        """ALIE with z from this receiver's real neighbourhood: ``ALittleIsEnough(f=f, n=n)``.

        Baruch et al. (2019) set z from the number of nodes n and Byzantine nodes f; against
        one gossip receiver those are its own neighbourhood (n = own + present neighbours)
        and its Byzantine neighbours. Returns ``self`` when ``z`` is fixed, and where the
        formula is undefined at (n, f) (a Byzantine majority at the receiver, s <= 0): the
        attack then runs as configured.
        """
        super().for_neighbourhood(n, f)
        if self.z is not None:
            return self
        try:
            alie_z(n, f)
        except ValueError:  # (n - f - s) / (n - f) outside (0, 1): no z at this receiver
            return self
        return ALittleIsEnough(f=f, n=n)

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **_: Any
    ) -> Tensor:
        honest, honest_mask = _required(self.name, honest, honest_mask)
        mean, std = honest_statistics(honest, honest_mask)
        if self.z is not None:
            return mean - self.z * std
        if self.n is not None:
            return mean - alie_z(self.n, self.f) * std
        # n = the honest messages this node sees plus the f Byzantine ones, per node
        sizes = honest_mask.sum(-1) + self.f
        distinct = sizes.unique()
        z = torch.tensor([alie_z(int(n), self.f) for n in distinct.tolist()], device=mean.device)
        per_node = z[torch.searchsorted(distinct, sizes)]
        return mean - per_node.to(mean.dtype).unsqueeze(-1) * std


class InnerProductManipulation(AttackBase):
    """IPM, spec name ``ipm:epsilon=E``: send -epsilon * mean(honest).

    Xie, Koyejo & Gupta, "Fall of empires: breaking Byzantine-tolerant SGD by
    inner product manipulation" (UAI 2019).
    """

    name = "ipm"
    needs_honest = True

    def __init__(self, epsilon: float = 0.1) -> None:
        self.epsilon = check_float(self.name, "epsilon", epsilon, 0.0)
        super().__init__()

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **_: Any
    ) -> Tensor:
        honest, honest_mask = _required(self.name, honest, honest_mask)
        mean, _std = honest_statistics(honest, honest_mask)
        return -self.epsilon * mean


class Dissensus(AttackBase):
    """Dissensus, spec name ``dissensus:epsilon=E``.

    x_byz = x_i - epsilon * sum_{j honest} W_ij (x_j - x_i) / sum_{b Byzantine} W_ib:
    every Byzantine neighbour of target i sends this, pushing i away from its
    honest neighbours' average. He, Karimireddy & Jaggi, "Byzantine-robust
    decentralized learning via ClippedGossip" (2022). Needs ``target``,
    ``honest_weights`` and ``byzantine_weight`` (> 0).
    """

    name = "dissensus"
    needs_honest = True

    def __init__(self, epsilon: float = 1.0) -> None:
        self.epsilon = check_float(self.name, "epsilon", epsilon, 0.0)
        super().__init__()

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **kw: Any
    ) -> Tensor:
        honest, honest_mask = _required(self.name, honest, honest_mask)
        target, weights, byzantine = kw["target"], kw["honest_weights"], kw["byzantine_weight"]
        if target is None or weights is None or byzantine is None:
            raise ValueError(
                "dissensus needs target [*, d], honest_weights [*, h] and byzantine_weight [*]"
            )
        if target.shape != own.shape or weights.shape != honest_mask.shape:
            raise ValueError(
                f"dissensus: target must have shape {list(own.shape)} and honest_weights "
                f"{list(honest_mask.shape)}, got {list(target.shape)} and {list(weights.shape)}"
            )
        byzantine = torch.as_tensor(byzantine, dtype=own.dtype, device=own.device)
        if not bool((byzantine > 0).all()):
            raise ValueError(
                "dissensus: byzantine_weight must be > 0 (the target's weight on Byzantine neighbours)"
            )
        w = torch.where(honest_mask, weights.to(own.dtype), 0.0)
        away = torch.where(honest_mask.unsqueeze(-1), honest - target.unsqueeze(-2), 0.0)
        pull = torch.matmul(w.unsqueeze(-2), away).squeeze(-2)
        return target - self.epsilon * pull / byzantine.unsqueeze(-1)


class Mimic(AttackBase):
    """Mimic, spec name ``mimic:index=I``: every Byzantine node copies one honest message.

    Karimireddy, He & Jaggi, "Byzantine-robust learning on heterogeneous
    datasets via bucketing" (ICLR 2022): copying one honest node over-weights
    its data under heterogeneity. Copies the ``index``-th present honest
    message (the last present one if there are fewer).
    """

    name = "mimic"
    needs_honest = True

    def __init__(self, index: int = 0) -> None:
        self.index = check_int(self.name, "index", index, 0)
        super().__init__()

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **_: Any
    ) -> Tensor:
        honest, honest_mask = _required(self.name, honest, honest_mask)
        order = (~honest_mask).to(torch.int8).argsort(dim=-1, stable=True)  # present first
        pick = torch.clamp(honest_mask.sum(-1, keepdim=True) - 1, max=self.index)
        slot = order.gather(-1, pick)
        index = slot.unsqueeze(-1).expand(*slot.shape, honest.shape[-1])
        return honest.gather(-2, index).squeeze(-2)


class Garbage(AttackBase):
    """Garbage, spec name ``garbage:kind=nan|inf|huge|wrong-length``, for exercising input validation.

    nan / inf: x_own with one random coordinate set to NaN / +Inf; huge: every
    coordinate +-value (random signs); wrong-length: x_own with one extra
    coordinate ([*, d+1]).
    """

    name = "garbage"
    kinds = ("nan", "inf", "huge", "wrong-length")

    def __init__(self, kind: str = "nan", value: float = 1e30, seed: int = 0) -> None:
        if kind not in self.kinds:
            raise ValueError(
                f"garbage: parameter kind must be one of {', '.join(self.kinds)}, got {kind!r}"
            )
        self.kind = kind
        self.value = check_float(self.name, "value", value, 0.0)
        super().__init__(seed)

    def _send(
        self, own: Tensor, honest: Tensor | None, honest_mask: Tensor | None, **kw: Any
    ) -> Tensor:
        generator: torch.Generator = kw["generator"]
        if self.kind == "wrong-length":
            return torch.cat([own, own[..., :1]], dim=-1)
        if self.kind == "huge":
            signs = torch.randint(0, 2, own.shape, generator=generator, device=generator.device)
            signs = signs.to(own.device) * 2 - 1
            return signs.to(own.dtype) * self.value
        bad = float("nan") if self.kind == "nan" else float("inf")
        where = torch.randint(
            0, own.shape[-1], (*own.shape[:-1], 1), generator=generator, device=generator.device
        )
        return own.scatter(-1, where.to(own.device), bad)


_SEED = Parameter("seed", "int", 0, "seed of the attack's generator")

ATTACKS: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry("sign-flip", SignFlip, (), "send -x_own"),
        Entry(
            "gaussian",
            GaussianNoise,
            (Parameter("sigma", "float", 1.0, "noise standard deviation"), _SEED),
            "send x_own + sigma * N(0, I)",
        ),
        Entry(
            "scaling", Scaling, (Parameter("scale", "float", 10.0, "factor"),), "send scale * x_own"
        ),
        Entry(
            "alie",
            ALittleIsEnough,
            (
                Parameter("f", "int", 1, "number of Byzantine nodes"),
                Parameter("n", "int|none", None, "number of nodes (default: honest seen + f)"),
                Parameter("z", "float|none", None, "fixed z instead of the formula"),
            ),
            "send mu - z sigma of the honest messages",
        ),
        Entry(
            "ipm",
            InnerProductManipulation,
            (Parameter("epsilon", "float", 0.1, "scale"),),
            "send -epsilon * mean(honest)",
        ),
        Entry(
            "dissensus",
            Dissensus,
            (Parameter("epsilon", "float", 1.0, "strength"),),
            "send x_i - epsilon sum_j W_ij (x_j - x_i) / W_byz",
        ),
        Entry(
            "mimic",
            Mimic,
            (Parameter("index", "int", 0, "which honest message"),),
            "copy one honest message",
        ),
        Entry(
            "garbage",
            Garbage,
            (
                Parameter("kind", "choice", "nan", "what to send", Garbage.kinds),
                Parameter("value", "float", 1e30, "magnitude for kind=huge"),
                _SEED,
            ),
            "NaN / Inf / huge / wrong-length vectors",
        ),
    ]
}


def build_attack(spec: str) -> AttackBase:
    """Build an attack from a spec such as ``alie:f=2``, ``ipm:epsilon=0.5``, ``garbage:kind=inf``."""
    if isinstance(spec, str) and "+" in spec:
        raise ValueError(f"attack spec must be one NAME[:key=value,...], got {spec!r}")
    entry, kwargs = parse_component(spec, ATTACKS, "attack")
    attack: AttackBase = entry.factory(
        **{p.name: kwargs.get(p.name, p.default) for p in entry.parameters}
    )
    return attack


def describe_attacks() -> str:
    """The ``--attack`` help text: every attack with parameters and defaults."""
    return describe(ATTACKS, "attacks (NAME[:key=value,...]):")
