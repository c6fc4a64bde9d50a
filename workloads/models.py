"""Small models that torch.func can batch over peers, and a check for user models.

Built in (``MODELS``; ``build_model("mlp:hidden=128", input_shape, num_classes)``):

- ``logistic``: Flatten, Linear. MNIST-1D: 410 parameters.
- ``mlp``: Flatten, (Linear, ReLU) x ``depth``, Linear. MNIST-1D, hidden=128, depth=2: 23,050.
- ``mlp-100k``: ``mlp`` with hidden=291, depth=2. MNIST-1D: 99,823 (the simulator's benchmark).
- ``cnn1d``: 3 x (Conv1d k5 stride 2, GroupNorm, ReLU), Linear. MNIST-1D, channels=32: 12,298.
- ``cnn2d``: 2 x (Conv2d k3, GroupNorm, ReLU, MaxPool 2), Linear. channels=32:
  CIFAR-10 30,762; MNIST 25,386.
- ``he2022-cnn``: the CNN of He, Karimireddy & Jaggi 2022's code (conv 32, conv 64, max-pool,
  dropout, Linear 128, dropout, Linear), 1-D or 2-D by input shape. MNIST-1D: 155,210;
  MNIST: 1,199,882.

Normalisation is GroupNorm (Wu & He 2018), never BatchNorm: BatchNorm's running
statistics are updated in place during training, which ``torch.func.vmap``
cannot batch, and its batch statistics would mix peers. :func:`check_batchable`
says which submodule of a user model stands in the way.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from workloads._registry import Entry, Param, lookup, parse_spec
from workloads.user_code import CodeSpec, UserCodeError, call_factory, load_factory, parse_code_spec

__all__ = [
    "MLP",
    "MODELS",
    "CNN1d",
    "CNN2d",
    "He2022CNN",
    "LogisticRegression",
    "NotBatchableError",
    "build_model",
    "check_batchable",
    "check_model_spec",
    "layer_chain",
    "parameter_count",
    "register_model",
]


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(channels, 8), channels)


def _features(input_shape: Sequence[int]) -> int:
    return math.prod(input_shape)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: logits = W vec(x) + b."""

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(_features(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.flatten(x))


class MLP(nn.Module):
    """Multi-layer perceptron: ``depth`` hidden layers of width ``hidden`` with ReLU."""

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, hidden: int = 128, depth: int = 2
    ) -> None:
        super().__init__()
        if hidden < 1:
            raise ValueError(f"mlp: hidden must be >= 1, got {hidden}")
        if depth < 1:
            raise ValueError(f"mlp: depth must be >= 1, got {depth}")
        widths = [_features(input_shape)] + [hidden] * depth
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in itertools.pairwise(widths):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class CNN1d(nn.Module):
    """A small 1-D CNN for signals such as MNIST-1D: 3 x (Conv1d k5 stride 2, GroupNorm, ReLU), Linear.

    ``input_shape`` is ``(length,)`` (one channel is added) or ``(channels, length)``.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, channels: int = 32) -> None:
        super().__init__()
        if len(input_shape) not in (1, 2):
            raise ValueError(
                f"cnn1d: input_shape must be (length,) or (channels, length), got {tuple(input_shape)}"
            )
        if channels < 1:
            raise ValueError(f"cnn1d: channels must be >= 1, got {channels}")
        in_channels, length = (1, input_shape[0]) if len(input_shape) == 1 else input_shape
        self.unsqueeze = len(input_shape) == 1
        layers: list[nn.Module] = []
        for width_in in (in_channels, channels, channels):
            layers += [
                nn.Conv1d(width_in, channels, kernel_size=5, stride=2, padding=2),
                _group_norm(channels),
                nn.ReLU(),
            ]
            length = (length - 1) // 2 + 1
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unsqueeze:
            x = x.unsqueeze(-2)
        return self.head(self.features(x).flatten(-2))


class CNN2d(nn.Module):
    """A small 2-D CNN: 2 x (Conv2d k3, GroupNorm, ReLU, MaxPool 2), Linear; input (C, H, W)."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, channels: int = 32) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(
                f"cnn2d: input_shape must be (channels, height, width), got {tuple(input_shape)}"
            )
        in_channels, height, width = input_shape
        if height < 4 or width < 4:
            raise ValueError(f"cnn2d: height and width must be >= 4, got {height}x{width}")
        if channels < 1:
            raise ValueError(f"cnn2d: channels must be >= 1, got {channels}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, kernel_size=3, padding=1),
            _group_norm(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, kernel_size=3, padding=1),
            _group_norm(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(channels * (height // 4) * (width // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(-3))


class He2022CNN(nn.Module):
    """The CNN of He, Karimireddy & Jaggi 2022's code (ClippedGossip; the network of PyTorch's
    MNIST example without its ReLU after the second convolution): conv 3x3 32, ReLU, conv
    3x3 64, max-pool 2, dropout 0.25, Linear 128, ReLU, dropout 0.5, Linear.

    ``input_shape`` ``(length,)`` or ``(channels, length)`` takes 1-D convolutions (MNIST-1D),
    ``(channels, height, width)`` 2-D ones (MNIST: 1,199,882 parameters, as in the paper).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        shape = tuple(input_shape)
        if len(shape) not in (1, 2, 3):
            raise ValueError(
                "he2022-cnn: input_shape must be (length,), (channels, length) or "
                f"(channels, height, width), got {shape}"
            )
        self.unsqueeze = len(shape) == 1
        if self.unsqueeze:
            shape = (1, *shape)
        channels, *spatial = shape
        if any(size < 6 for size in spatial):
            raise ValueError(f"he2022-cnn: every spatial size must be >= 6, got {shape}")
        conv: type[nn.Conv1d] | type[nn.Conv2d] = nn.Conv1d if len(spatial) == 1 else nn.Conv2d
        pool: type[nn.MaxPool1d] | type[nn.MaxPool2d] = (
            nn.MaxPool1d if len(spatial) == 1 else nn.MaxPool2d
        )
        self.features = nn.Sequential(
            conv(channels, 32, 3),
            nn.ReLU(),
            conv(32, 64, 3),
            pool(2),
            nn.Dropout(0.25),
            nn.Flatten(-len(shape)),
        )
        self.head = nn.Sequential(
            nn.Linear(64 * math.prod((size - 4) // 2 for size in spatial), 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unsqueeze:
            x = x.unsqueeze(-2)
        return self.head(self.features(x))


def _mlp_100k(input_shape: Sequence[int], num_classes: int) -> MLP:
    return MLP(input_shape, num_classes, hidden=291, depth=2)


MODELS: dict[str, Entry[nn.Module]] = {
    "logistic": Entry("logistic", LogisticRegression, {}, "multinomial logistic regression"),
    "mlp": Entry(
        "mlp",
        MLP,
        {
            "hidden": Param(int, 128, "width of each hidden layer"),
            "depth": Param(int, 2, "number of hidden layers"),
        },
        "multi-layer perceptron with ReLU",
    ),
    "mlp-100k": Entry(
        "mlp-100k", _mlp_100k, {}, "MLP 291x2: 99,823 parameters on MNIST-1D (benchmark preset)"
    ),
    "cnn1d": Entry(
        "cnn1d",
        CNN1d,
        {"channels": Param(int, 32, "channels of each convolution")},
        "1-D CNN with GroupNorm (MNIST-1D)",
    ),
    "cnn2d": Entry(
        "cnn2d",
        CNN2d,
        {"channels": Param(int, 32, "channels of each convolution")},
        "2-D CNN with GroupNorm (MNIST, CIFAR-10)",
    ),
    "he2022-cnn": Entry(
        "he2022-cnn",
        He2022CNN,
        {},
        "the CNN of He et al. 2022's code, with dropout (1-D or 2-D by input shape)",
    ),
}


ModelFactory = Callable[..., nn.Module]


def layer_chain(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The modules ``model``'s forward applies one after the other, with their qualified
    names, or None when its forward is not known to be such a chain.

    Known chains: an ``nn.Sequential`` (nested ones are unrolled), :class:`MLP` and
    :class:`LogisticRegression`, by exact type (a subclass may override ``forward``). A
    module with forward hooks is not a chain: the hooks could change what flows through it.
    The simulator uses this to run such models with hand-derived batched kernels
    (``sim.linear_chain``) instead of ``torch.func``.
    """
    if _has_hooks(model):
        return None
    if type(model) is nn.Sequential:
        chain: list[tuple[str, nn.Module]] = []
        # Sequential's forward runs every entry of _modules, a module listed twice too
        # (named_children() would skip the repeat)
        for name, child in model._modules.items():
            if child is None:
                continue
            inner = layer_chain(child) if type(child) is nn.Sequential else None
            if inner is not None:
                chain += [(f"{name}.{sub}", module) for sub, module in inner]
            elif type(child) is nn.Sequential or _has_hooks(child):
                return None
            else:
                chain.append((name, child))
        modules = [id(module) for _, module in chain]
        if len(set(modules)) != len(modules):
            return None  # a module applied twice shares its weights: not a plain chain
        return chain
    if type(model) is MLP:
        inner = layer_chain(model.layers)
        return None if inner is None else [(f"layers.{name}", m) for name, m in inner]
    if type(model) is LogisticRegression:
        if _has_hooks(model.flatten) or _has_hooks(model.linear):
            return None
        return [("flatten", model.flatten), ("linear", model.linear)]
    return None


def _has_hooks(module: nn.Module) -> bool:
    from torch.nn.modules import module as module_globals

    global_hooks = (
        getattr(module_globals, "_global_forward_hooks", None),
        getattr(module_globals, "_global_forward_pre_hooks", None),
        getattr(module_globals, "_global_backward_hooks", None),
    )
    return any(global_hooks) or bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
    )


def register_model(
    name: str,
    factory: ModelFactory,
    params: Mapping[str, Param] | None = None,
    doc: str = "",
    *,
    replace: bool = False,
) -> None:
    """Add a user model to ``MODELS`` so that specs, configs and CLIs can name it.

    ``factory(input_shape, num_classes, **params) -> nn.Module``; ``params``
    declares its spec parameters (``Param(type, default, doc)``). Check it with
    :func:`check_batchable` before handing it to the simulator.
    """
    if not isinstance(name, str) or not name or ":" in name or "," in name:
        raise ValueError(f"model name must be a non-empty string without ':' or ',', got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory for model {name!r} must be callable")
    if name in MODELS and not replace:
        raise ValueError(f"model {name!r} is already registered; pass replace=True to override")
    MODELS[name] = Entry(name, factory, dict(params or {}), doc)


def build_model(
    name: str | ModelFactory,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int = 0,
    **params: Any,
) -> nn.Module:
    """Build a model with a seeded initialisation: a registered name, your own code, or any
    factory.

    ``name`` may carry parameters (``"mlp:hidden=64"``); keyword ``params``
    override them. A callable ``name`` is called as
    ``name(input_shape, num_classes, **params)``. ``"MODULE:FACTORY"`` (``"mymodel.py:MyNet"``,
    ``"mypkg.models:make_net"``; :mod:`workloads.user_code`) loads your factory and calls it
    as ``FACTORY(input_shape, num_classes, **params)``, or ``FACTORY(**params)`` when it takes
    no shape; it must return an ``nn.Module`` (else :class:`~workloads.user_code.UserCodeError`).
    The initialisation draws from a forked CPU RNG seeded with ``seed``, so the caller's
    global torch RNG is left untouched and the same seed gives bit-identical weights.
    """
    code = None
    if callable(name):
        factory, resolved = name, dict(params)
    elif (code := parse_code_spec(name, MODELS)) is not None:
        factory, resolved = _user_model(code, params), dict(params)
    else:
        base, given = parse_spec(name, "model")
        entry = lookup(MODELS, base, "model")
        factory, resolved = entry.factory, entry.resolve({**given, **params})
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {shape}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(
            f"num_classes (the outputs per sample: classes, vocabulary or a regression's "
            f"targets) must be an int >= 1, got {num_classes!r}"
        )
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = factory(shape, num_classes, **resolved)
    if not isinstance(model, nn.Module):
        if code is not None:
            raise UserCodeError(
                "model",
                f"{code} returned a value of type {type(model).__name__}; allowed: a torch.nn.Module",
            )
        raise ValueError(f"model factory returned {type(model).__name__}, not an nn.Module")
    return model


def _takes_shape(factory: Callable[..., Any], code: CodeSpec, params: Mapping[str, Any]) -> bool:
    """Whether a user factory is called with ``(input_shape, num_classes)`` (else with its
    keyword parameters alone); a factory that takes neither is refused up front."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (a builtin): pass the shape
        return True
    for arguments, takes in (((None, None), True), ((), False)):
        try:
            signature.bind(*arguments, **params)
        except TypeError:
            continue
        return takes
    given = f" and keyword arguments {', '.join(params)}" if params else ""
    raise UserCodeError(
        "model",
        f"{code} cannot be called with (input_shape, num_classes){given} nor without them; "
        f"allowed: a callable taking (input_shape, num_classes) or no arguments",
    )


def _user_model(code: CodeSpec, params: Mapping[str, Any]) -> ModelFactory:
    """The user's factory, called the way its signature asks, its errors named."""
    factory = load_factory(code, "model")
    takes_shape = _takes_shape(factory, code, params)

    def build(input_shape: tuple[int, ...], num_classes: int, **kwargs: Any) -> nn.Module:
        arguments = (input_shape, num_classes) if takes_shape else ()
        built: nn.Module = call_factory(factory, code, "model", *arguments, **kwargs)
        return built

    return build


def check_model_spec(spec: str) -> None:
    """Check a model spec without building the model: a registered name with known, well
    typed parameters, or ``MODULE:FACTORY`` whose module imports and whose factory is a
    callable with a usable signature. Raises ``ValueError`` (a
    :class:`~workloads.user_code.UserCodeError` for user code) saying what is wrong."""
    code = parse_code_spec(spec, MODELS)
    if code is not None:
        _takes_shape(load_factory(code, "model"), code, {})
        return
    base, given = parse_spec(spec, "model")
    lookup(MODELS, base, "model").resolve(given)


def parameter_count(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- batchability


class NotBatchableError(ValueError):
    """A model cannot be trained under ``torch.func.vmap``; ``module_name`` names the culprit."""

    def __init__(self, module_name: str, reason: str) -> None:
        self.module_name = module_name
        where = f"submodule {module_name!r}" if module_name else "the model itself"
        super().__init__(f"{where} cannot be batched with torch.func.vmap in training: {reason}")


_RANDOM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.RReLU,
)


def _static_check(model: nn.Module, randomness: str) -> None:
    for name, module in model.named_modules():
        kind = type(module).__name__
        if (
            isinstance(module, nn.modules.batchnorm._BatchNorm)
            and module.track_running_stats
            and module.training
        ):
            raise NotBatchableError(
                name,
                f"{kind} updates its running statistics in place; use GroupNorm, or "
                "track_running_stats=False, or torch.func.replace_all_batch_norm_modules_",
            )
        if (
            isinstance(module, nn.modules.instancenorm._InstanceNorm)
            and module.track_running_stats
            and module.training
        ):
            raise NotBatchableError(
                name, f"{kind}(track_running_stats=True) updates running statistics in place"
            )
        if randomness == "error" and isinstance(module, _RANDOM_LAYERS) and module.training:
            raise NotBatchableError(
                name,
                f"{kind} draws random numbers; vmap needs randomness='different' or 'same'",
            )


def check_batchable(
    model: nn.Module,
    example_input: torch.Tensor | None = None,
    *,
    randomness: str = "error",
) -> None:
    """Raise :class:`NotBatchableError` if ``model`` cannot be trained under vmap(grad(...)).

    Static checks: BatchNorm / InstanceNorm with running statistics in training
    mode (in-place buffer updates), and random layers (Dropout, RReLU) unless
    ``randomness`` is ``"different"`` or ``"same"`` (vmap's argument). With
    ``example_input`` (one batch ``[B, *input_shape]``) it also runs one
    forward pass through ``functional_call`` on copies of the buffers and names
    any submodule whose buffers changed (in-place updates), then runs
    ``vmap(grad(loss))`` over two stacked copies of the parameters and, if that
    fails, names the innermost submodule that was executing.
    """
    if randomness not in {"error", "different", "same"}:
        raise ValueError(f"randomness must be 'error', 'different' or 'same', got {randomness!r}")
    _static_check(model, randomness)
    if example_input is None:
        return
    from torch.func import functional_call, grad, vmap

    parameters = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    try:
        with torch.no_grad():
            functional_call(model, {**parameters, **buffers}, (example_input,))
    except Exception as error:
        raise ValueError(
            f"check_batchable: the model's own forward pass fails on example_input of shape "
            f"{tuple(example_input.shape)} (one batch [B, *input_shape] is expected): "
            f"{type(error).__name__}: {error}"
        ) from error
    for key, value in model.named_buffers():
        if not torch.equal(value, buffers[key]):
            module_name = key.rpartition(".")[0]
            raise NotBatchableError(
                module_name, f"its forward pass updates buffer {key!r} in place"
            )

    stack: list[str] = []  # names of the modules whose forward is running
    hooks = []

    def enter(name: str) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            stack.append(name)

        return hook

    def leave(*_: Any) -> None:
        if stack:
            stack.pop()

    for name, module in model.named_modules():
        hooks.append(module.register_forward_pre_hook(enter(name)))
        hooks.append(module.register_forward_hook(leave))

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, {**params, **buffers}, (x,)).float().square().mean()

    stacked = {k: torch.stack([v, v]) for k, v in parameters.items()}
    try:
        vmap(grad(loss), randomness=randomness)(stacked, torch.stack([example_input] * 2))
    except NotBatchableError:
        raise
    except Exception as error:  # whatever vmap raised, reported against the innermost module
        culprit = stack[-1] if stack else ""
        raise NotBatchableError(culprit, f"{type(error).__name__}: {error}") from error
    finally:
        for handle in hooks:
            handle.remove()
