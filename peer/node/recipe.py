"""What rebuilds a peer's ``nn.Module``: :class:`ModelRecipe` (the model spec, input shape,
classes and seed), recorded in every checkpoint (metadata key :data:`RECIPE_KEY`) and beside
every exported model, so a file can be turned back into a module (``peer.node.model_file``).

The model spec is a ``workloads`` registry spec (``mlp:hidden=64``) or the user's own code
(``mymodel.py:SpiralNet``, ``mypkg.models:make_net``; ``workloads.user_code``). What a file
records carries no path of the machine that wrote it (:meth:`ModelRecipe.to_json`): a code
file or ``.npz`` outside the current directory is recorded by its name, a path inside it
relative to it, and a generated data set's ``cache_dir`` is left out.

Your own code is imported again only from the current directory (:func:`user_code_spec`):
a recorded ``FILE.py`` must be a relative path inside it (no ``..``), a dotted module's
package must be found there. A file therefore never makes us import code from anywhere
else (a standard library module, an absolute path); a moved file is named again with
``factory=`` (``load_model``) or ``--model FILE:FACTORY`` (``gossipnet export``).
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import torch
from torch import nn

from workloads import MODELS, build_model
from workloads.user_code import CodeSpec, load_factory, parse_code_spec

__all__ = ["RECIPE_KEY", "ModelFactory", "ModelRecipe", "portable_spec", "user_code_spec"]

RECIPE_KEY = "recipe"
"""The checkpoint metadata key holding :meth:`ModelRecipe.to_json` (as JSON text)."""
_REGISTRY_SPEC = re.compile(r"[^:,=]+(:\s*[A-Za-z_]\w*\s*=[^:,=]*(,\s*[A-Za-z_]\w*\s*=[^:,=]*)*)?")
"""A registry spec and nothing else: one colon at most, then only KEY=VALUE items, so it can
never be read as ``MODULE:FACTORY`` user code (``workloads.user_code``)."""
_HOW_TO_NAME = "pass factory= to load_model, or --model FILE:FACTORY to gossipnet export"

ModelFactory = Callable[..., nn.Module] | str
"""What rebuilds a model of your own code instead of the recorded spec: a callable
``factory(input_shape, num_classes) -> nn.Module``, or a ``MODULE:FACTORY`` spec
(``"mymodel.py:SpiralNet"``) as ``--model`` takes it."""


def _portable_path(path: str) -> str:
    """``path`` relative to the current directory when it lies inside it, else its name
    (an absolute path elsewhere, or one that climbs out with ``..``)."""
    pure = Path(path).expanduser()
    if not pure.is_absolute():
        relative = PurePath(os.path.normpath(path))
        return pure.name if ".." in relative.parts else relative.as_posix()
    try:
        return pure.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return pure.name


def portable_spec(spec: str | None) -> str | None:
    """A model or data set spec without the machine's paths, as a file records it.

    ``MODULE.py:FACTORY`` and ``FILE.npz`` (and ``path=`` of ``npz:...``) keep a path
    relative to the current directory (or just the file name when it lies outside it);
    ``cache_dir=`` (where a generated data set is cached) is dropped.

        >>> portable_spec("mnist1d:num_samples=400,cache_dir=/home/me/.cache/gossipnet")
        'mnist1d:num_samples=400'
        >>> portable_spec("/elsewhere/mymodel.py:Net")
        'mymodel.py:Net'
    """
    if spec is None:
        return None
    code = parse_code_spec(spec, MODELS)
    if code is not None and code.is_file:
        return f"{_portable_path(code.module)}:{code.attribute}"
    text = spec.strip()
    if text.endswith(".npz") and not text.startswith("npz:"):
        return _portable_path(text)
    name, colon, rest = text.partition(":")
    if not colon:
        return text
    items = []
    for item in rest.split(","):
        key, equals, value = item.partition("=")
        if key.strip() == "cache_dir":
            continue
        items.append(
            f"{key}={_portable_path(value.strip())}" if equals and key.strip() == "path" else item
        )
    return f"{name}:{','.join(items)}" if items else name


def user_code_spec(spec: str) -> CodeSpec | None:
    """The recorded ``spec``'s user code, checked to lie in the current directory, with its
    file resolved there; ``None`` for a registry spec.

    Raises:
        ValueError: the spec names code outside the current directory (an absolute path,
            ``..``, a module not found there) or a file that is not there; the message says
            how to name the code instead.
    """
    code = parse_code_spec(spec, MODELS)
    if code is None:
        return None
    here = Path.cwd().resolve()
    if code.is_file:
        relative = PurePath(code.module)
        if (
            relative.is_absolute()
            or ".." in relative.parts
            or Path(code.module).expanduser().is_absolute()
        ):
            raise ValueError(
                f"your model code is imported only from the current directory; {_HOW_TO_NAME} "
                f"(the spec {spec!r:.80} names a file outside it)"
            )
        path = here / relative
        if not path.is_file():
            raise ValueError(
                f"run where your model code is, or {_HOW_TO_NAME} ({code.module!r:.60} of the "
                f"spec is not in the current directory {here})"
            )
        return CodeSpec(str(path), code.attribute, is_file=True)
    top = code.module.split(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, [str(here)])
    if found is None:
        raise ValueError(
            f"your model code is imported only from the current directory; {_HOW_TO_NAME} "
            f"(module {top!r:.60} of the spec is not in {here})"
        )
    return code


def _import(code: CodeSpec) -> Callable[..., Any]:
    """The factory ``code`` names (a file's module is cached: importing twice is free); a
    dotted module must come from the current directory, not an installed namesake."""
    factory = load_factory(code, "model")
    if not code.is_file:
        origin = getattr(sys.modules.get(code.module), "__file__", None)
        here = Path.cwd().resolve()
        if not isinstance(origin, str) or here not in Path(origin).resolve().parents:
            raise ValueError(
                f"model spec {str(code)!r:.80}: module {code.module!r} was imported from "
                f"{origin}, not the current directory; {_HOW_TO_NAME}"
            )
    return factory


@dataclass(frozen=True)
class ModelRecipe:
    """What ``workloads`` needs to rebuild a peer's ``nn.Module``: the model and data spec.

    Args:
        model: a ``workloads`` model spec, ``NAME[:KEY=VALUE,...]`` (``"mlp:hidden=64"``;
            its name must be registered in ``workloads.MODELS`` when the model is rebuilt),
            or your own code, ``MODULE:FACTORY`` (``"mymodel.py:SpiralNet"``).
        input_shape: one sample's shape (the data set's ``input_shape``).
        num_classes: the data set's number of classes (the output width).
        dataset: the data set spec the model trained on (a record; not needed to rebuild).
        seed: the initialisation seed (the weights are loaded over it anyway).
    """

    model: str
    input_shape: tuple[int, ...]
    num_classes: int
    dataset: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(
                f"ModelRecipe.model must be a workloads model spec such as 'mlp', got {self.model!r:.80}"
            )
        shape = self.input_shape
        if (
            not isinstance(shape, tuple | list)
            or not shape
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)
        ):
            raise ValueError(
                f"ModelRecipe.input_shape must be a non-empty list of integers >= 1, got {shape!r:.80}"
            )
        object.__setattr__(self, "input_shape", tuple(shape))
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int):
            raise ValueError(
                f"ModelRecipe.num_classes must be an integer >= 1, got {self.num_classes!r:.40}"
            )
        if self.num_classes < 1:  # a regression's single output is 1
            raise ValueError(
                f"ModelRecipe.num_classes must be an integer >= 1, got {self.num_classes}"
            )
        if self.dataset is not None and not isinstance(self.dataset, str):
            raise ValueError(
                f"ModelRecipe.dataset must be a data set spec string or null, got {self.dataset!r:.80}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"ModelRecipe.seed must be an integer, got {self.seed!r:.40}")

    @property
    def name(self) -> str:
        """The model's registered name (the spec before ``:``)."""
        return self.model.partition(":")[0].strip()

    def to_json(self) -> dict[str, Any]:
        """``{"model": {"spec", "seed"}, "data": {"dataset", "input_shape", "num_classes"}}``,
        the specs without the machine's paths (:func:`portable_spec`)."""
        return {
            "model": {"spec": portable_spec(self.model), "seed": self.seed},
            "data": {
                "dataset": portable_spec(self.dataset),
                "input_shape": list(self.input_shape),
                "num_classes": self.num_classes,
            },
        }

    @classmethod
    def from_json(cls, obj: object) -> ModelRecipe:
        """The recipe :meth:`to_json` wrote (extra keys around it are ignored); a
        ``ValueError`` naming the field if it is missing or of the wrong type."""
        if not isinstance(obj, Mapping):
            raise ValueError("the model description must be a JSON object with model and data")
        model, data = obj.get("model"), obj.get("data")
        if not isinstance(model, Mapping) or not isinstance(data, Mapping):
            raise ValueError("the model description needs objects 'model' {spec, seed} and 'data'")
        return cls(
            model=model.get("spec"),  # type: ignore[arg-type]  # checked in __post_init__
            input_shape=data.get("input_shape"),  # type: ignore[arg-type]
            num_classes=data.get("num_classes"),  # type: ignore[arg-type]
            dataset=data.get("dataset"),
            seed=model.get("seed", 0),  # type: ignore[arg-type]
        )

    def architecture(self) -> tuple[str, tuple[int, ...], int]:
        """What fixes the module's tensors: the model spec, input shape and classes (two
        recipes with the same architecture give models that can be averaged)."""
        return (self.model, self.input_shape, self.num_classes)

    def build(
        self,
        *,
        device: torch.device | str | None = None,
        factory: ModelFactory | None = None,
    ) -> nn.Module:
        """The module, freshly initialised (on ``device``; ``"meta"`` allocates nothing).

        A registry spec is built by ``workloads``; your own code (``mymodel.py:SpiralNet``) is
        imported again from the current directory (:func:`user_code_spec`). ``factory``
        builds it instead of what the spec names: a callable ``factory(input_shape,
        num_classes) -> nn.Module`` or a ``MODULE:FACTORY`` spec (``--model``), for code
        that moved.

        Raises:
            ValueError: the model is not registered in ``workloads.MODELS`` (names the
                registered ones), your code is not where the spec says (or outside the
                current directory), or ``workloads.build_model`` refuses the spec.
        """
        name: ModelFactory
        if factory is not None:
            if isinstance(factory, str):
                code = parse_code_spec(factory, MODELS)
                if code is None:
                    raise ValueError(
                        f"factory must be your code as MODULE:FACTORY (mymodel.py:MyNet), got "
                        f"{factory!r:.80}"
                    )
                load_factory(code, "model")  # imported here, outside a meta-device context
            name = factory
        elif (code := user_code_spec(self.model)) is not None:
            _import(code)  # imported here, outside a meta-device context
            name = str(code)
        else:
            name = self._registered()
        with torch.device(device or "cpu"):
            return build_model(name, self.input_shape, self.num_classes, seed=self.seed)

    def _registered(self) -> str:
        """The spec, checked to be a registered model's."""
        if _REGISTRY_SPEC.fullmatch(self.model.strip()) is None:
            raise ValueError(
                f"model spec {self.model!r:.80} is not NAME[:KEY=VALUE,...] of a registered "
                f"workloads model nor your MODULE:FACTORY; {_HOW_TO_NAME}"
            )
        if self.name not in MODELS:
            raise ValueError(
                f"model {self.name!r} is not a registered workloads model (registered: "
                f"{', '.join(sorted(MODELS))}); {_HOW_TO_NAME}, or register it with "
                "workloads.register_model"
            )
        return self.model
