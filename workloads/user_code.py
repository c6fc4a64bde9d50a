"""Your own model or data set code, named on a command line as ``MODULE:FACTORY``.

``--model mymodel.py:MyNet``, ``--model mypkg.models:make_net`` and
``--dataset mypkg.data:load`` all name a *factory*: a callable in a Python file or an
importable module. This module tells such a spec apart from a registry spec
(``mlp:hidden=64``), finds the factory and checks it, before anything is trained:

- ``MODULE`` is a file path ending in ``.py`` (absolute, or relative to the current
  directory) or a dotted module name (``mypkg.models``; the current directory is on the
  import path, as with ``python -m``).
- ``FACTORY`` is a Python identifier, or a dotted attribute path (``Builders.small``);
  it never holds ``=``, which is what a registry spec's ``key=value`` always holds.
- A registered name before the colon (``mlp:hidden``) is always a registry spec, so a
  typo in a registry spec is reported as one, not as a missing module.

The split is at the *last* colon, so a Windows path (``C:\\\\models\\\\net.py:Net``) works.
Every failure is a :class:`UserCodeError` (a ``ValueError``) whose message says what is
wrong in one line: the file does not exist, the module raised while importing (the
exception and its line), the attribute is missing (with the callables the module has),
or it is not callable. Loading runs the user's code: it is the user's own file, named on
their own command line, and it never travels between peers.

    >>> parse_code_spec("mymodel.py:MyNet")
    CodeSpec(module='mymodel.py', attribute='MyNet', is_file=True)
    >>> parse_code_spec("mlp:hidden=64") is None
    True
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["CodeSpec", "UserCodeError", "call_factory", "load_factory", "parse_code_spec"]

Role = Literal["model", "dataset"]

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*")


class UserCodeError(ValueError):
    """A ``MODULE:FACTORY`` spec that cannot be used; ``role`` says whether it was given as
    the model or the data set (a command line names the flag from it)."""

    def __init__(self, role: Role, message: str) -> None:
        super().__init__(message)
        self.role = role


@dataclass(frozen=True)
class CodeSpec:
    """A parsed ``MODULE:FACTORY``: the module as written, the attribute path, and whether
    the module is a file path (else a dotted module name)."""

    module: str
    attribute: str
    is_file: bool

    def __str__(self) -> str:
        return f"{self.module}:{self.attribute}"


def parse_code_spec(spec: object, registered: Collection[str] = ()) -> CodeSpec | None:
    """The :class:`CodeSpec` that ``spec`` names, or ``None`` when it is not user code.

    ``spec`` is user code when it has a colon, the text after the last colon is a
    (dotted) identifier, and the text before it is a path ending in ``.py`` or a dotted
    module name that is not one of the ``registered`` names.
    """
    if not isinstance(spec, str):
        return None
    module, colon, attribute = spec.strip().rpartition(":")
    module, attribute = module.strip(), attribute.strip()
    if not colon or not module or _DOTTED.fullmatch(attribute) is None:
        return None
    if module.endswith(".py"):
        return CodeSpec(module, attribute, is_file=True)
    if module in registered or _DOTTED.fullmatch(module) is None:
        return None
    return CodeSpec(module, attribute, is_file=False)


def load_factory(spec: CodeSpec, role: Role) -> Callable[..., Any]:
    """Import ``spec.module`` and return its callable ``spec.attribute``.

    Raises :class:`UserCodeError` naming what is wrong: a missing file, an import that
    failed (its exception and the line that raised), a missing attribute, or one that is
    not callable.
    """
    module = _import_file(spec, role) if spec.is_file else _import_module(spec, role)
    value: Any = module
    for part in spec.attribute.split("."):
        if not hasattr(value, part):
            callables = sorted(
                name
                for name, item in vars(module).items()
                if callable(item) and not name.startswith("_")
                and getattr(item, "__module__", None) == module.__name__
            )  # fmt: skip
            have = ", ".join(callables) if callables else "(none defined there)"
            raise UserCodeError(
                role, f"{spec.module} has no attribute {spec.attribute!r}; allowed: {have}"
            )
        value = getattr(value, part)
    if not callable(value):
        raise UserCodeError(
            role,
            f"{spec} is a value of type {type(value).__name__}, not callable; allowed: a class or "
            f"function that returns {_WANTED[role]}",
        )
    return value  # type: ignore[no-any-return]


def call_factory(
    factory: Callable[..., Any], spec: CodeSpec, role: Role, *args: Any, **kwargs: Any
) -> Any:
    """``factory(*args, **kwargs)``; an exception it raises becomes a :class:`UserCodeError`
    that names the spec, the exception and the line of the user's file that raised."""
    try:
        return factory(*args, **kwargs)
    except Exception as error:
        module = sys.modules.get(getattr(factory, "__module__", "") or "")
        path = getattr(module, "__file__", None)
        where = str(Path(path).resolve()) if isinstance(path, str) else ""
        raise UserCodeError(role, f"calling {spec} failed: {_failure(error, where)}") from error


_WANTED: dict[Role, str] = {
    "model": "a torch.nn.Module",
    "dataset": "a workloads.Dataset or a mapping of arrays x_train, y_train, x_test, y_test",
}


def _failure(error: BaseException, where: str) -> str:
    """``TypeName: message (file.py, line N)`` of the innermost frame in ``where``."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == where]
    at = f" (line {frames[-1].lineno})" if frames else ""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}{at}" if text else f"{type(error).__name__}{at}"


def _import_file(spec: CodeSpec, role: Role) -> Any:
    path = Path(spec.module).expanduser()
    if not path.is_file():
        raise UserCodeError(
            role, f"file {spec.module} does not exist (looked in {Path.cwd()}); allowed: an "
            "existing .py file, or a dotted module name"
        )  # fmt: skip
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = f"_gossipnet_user_code.{re.sub(r'[^A-Za-z0-9_]', '_', resolved.stem)}_{digest}"
    if name in sys.modules:  # the same file, loaded for the model and the data set
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise UserCodeError(role, f"file {spec.module} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and typing look a module up while it runs
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise UserCodeError(
            role, f"importing {spec.module} failed: {_failure(error, str(resolved))}"
        ) from error
    return module


def _import_module(spec: CodeSpec, role: Role) -> Any:
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)  # as `python -m` would: the current directory's packages
    try:
        return importlib.import_module(spec.module)
    except ModuleNotFoundError as error:
        if error.name is not None and spec.module.startswith(error.name):
            raise UserCodeError(
                role, f"no module named {spec.module!r} (from {here}); allowed: a file path "
                "ending in .py, or a module importable from the current directory or PYTHONPATH"
            ) from error  # fmt: skip
        raise UserCodeError(
            role, f"importing {spec.module} failed: {_failure(error, '')}"
        ) from error
    except Exception as error:
        raise UserCodeError(
            role, f"importing {spec.module} failed: {_failure(error, _origin(spec.module))}"
        ) from error


def _origin(module: str) -> str:
    """The file a module was (or would be) loaded from, for the line of a failure."""
    try:
        found = importlib.util.find_spec(module)
    except Exception:  # its parent package failed to import: no file to point at
        return ""
    return (found.origin if found is not None else None) or ""
