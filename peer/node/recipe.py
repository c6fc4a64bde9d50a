"""What rebuilds a peer's ``nn.Module``: :class:`ModelRecipe` (the model spec, input shape,
classes and seed), recorded in every checkpoint (metadata key :data:`RECIPE_KEY`) and beside
every exported model, so a file can be turned back into a module (``peer.node.model_file``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workloads import MODELS, build_model

__all__ = ["RECIPE_KEY", "ModelRecipe"]

RECIPE_KEY = "recipe"
"""The checkpoint metadata key holding :meth:`ModelRecipe.to_json` (as JSON text)."""
_REGISTRY_SPEC = re.compile(r"[^:,=]+(:\s*[A-Za-z_]\w*\s*=[^:,=]*(,\s*[A-Za-z_]\w*\s*=[^:,=]*)*)?")
"""A registry spec and nothing else: one colon at most, then only KEY=VALUE items, so it can
never be read as ``MODULE:FACTORY`` user code (``workloads.user_code``)."""


@dataclass(frozen=True)
class ModelRecipe:
    """What ``workloads`` needs to rebuild a peer's ``nn.Module``: the model and data spec.

    Args:
        model: a ``workloads`` model spec, ``NAME[:KEY=VALUE,...]`` (``"mlp:hidden=64"``);
            its name must be registered in ``workloads.MODELS`` when the model is rebuilt.
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
        """``{"model": {"spec", "seed"}, "data": {"dataset", "input_shape", "num_classes"}}``."""
        return {
            "model": {"spec": self.model, "seed": self.seed},
            "data": {
                "dataset": self.dataset,
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
        factory: Callable[..., nn.Module] | None = None,
    ) -> nn.Module:
        """The module, freshly initialised (on ``device``; ``"meta"`` allocates nothing).

        ``factory`` (``factory(input_shape, num_classes) -> nn.Module``) builds it instead
        of the registered model the spec names: the way to rebuild your own model code
        (``--model mymodel.py:MyNet``), which a file never imports by itself.

        Raises:
            ValueError: the model is not registered in ``workloads.MODELS`` (names the
                registered ones), or ``workloads.build_model`` refuses the spec.
        """
        if factory is not None:
            with torch.device(device or "cpu"):
                return build_model(factory, self.input_shape, self.num_classes, seed=self.seed)
        if _REGISTRY_SPEC.fullmatch(self.model.strip()) is None:
            raise ValueError(
                f"model spec {self.model!r:.80} is not NAME[:KEY=VALUE,...] of a registered "
                "workloads model; pass factory= to load_model for your own model code"
            )
        if self.name not in MODELS:
            raise ValueError(
                f"model {self.name!r} is not a registered workloads model (registered: "
                f"{', '.join(sorted(MODELS))}); pass factory= to load_model, or register it "
                "with workloads.register_model"
            )
        if device is None:
            return build_model(self.model, self.input_shape, self.num_classes, seed=self.seed)
        with torch.device(device):
            return build_model(self.model, self.input_shape, self.num_classes, seed=self.seed)
