"""Paths an experiment file names resolve from the file's own folder.

An experiment file names the user's things by path: a graph (``[graph] file``), a model's
code (``workload.model = "mymodel.py:Net"``), a data set's code or arrays
(``workload.dataset = "data.npz"``, ``"npz:path=data.npz"``, ``"mnist:path=mnist/"``,
``"load.py:make"``) and the data cache (``workload.cache_dir``, or ``cache_dir=`` in the data
set's spec). A relative path among them means "next to the experiment file", wherever the
command runs from, so an experiment folder can be moved or run from anywhere. ``~`` is
expanded; absolute paths, registry names (``mlp``, ``mnist1d``) and dotted module names
(``mypkg.models:make_net``, found on the import path) are left as written. The ``[output]``
paths are not inputs: they stay relative to the working directory, like the command line's
``--csv``.

:func:`resolve_experiment_paths` rewrites the tables before they are validated
(:func:`sim.config.experiment_from_dict` calls it with the file's folder); a spec it cannot
parse is left unchanged for the validation to report.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workloads.datasets import DATASETS
from workloads.models import MODELS
from workloads.user_code import parse_code_spec

#: Registry parameters of a data set spec that name a file or folder.
PATH_PARAMETERS = ("path", "cache_dir")


def resolve_path(text: str, base_dir: Path) -> str:
    """``text`` with ``~`` expanded, under ``base_dir`` when it is relative."""
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else base_dir / path)


def resolve_code_spec(spec: str, registered: Mapping[str, Any], base_dir: Path) -> str | None:
    """A ``FILE.py:FACTORY`` spec with its file under ``base_dir``; ``None`` when ``spec``
    is not a file spec (a registry spec, or a dotted module found on the import path)."""
    code = parse_code_spec(spec, registered)
    if code is None or not code.is_file:
        return None
    return f"{resolve_path(code.module, base_dir)}:{code.attribute}"


def resolve_model_spec(spec: Any, base_dir: Path) -> Any:
    """``workload.model`` with a ``FILE.py:FACTORY`` file under ``base_dir``."""
    if not isinstance(spec, str):
        return spec
    resolved = resolve_code_spec(spec, MODELS, base_dir)
    return spec if resolved is None else resolved


def resolve_dataset_spec(spec: Any, base_dir: Path) -> Any:
    """``workload.dataset`` with its file or folder under ``base_dir``: ``FILE.py:FACTORY``,
    ``FILE.npz``, and the ``path=`` / ``cache_dir=`` parameters of a registry spec."""
    if not isinstance(spec, str) or not spec.strip():
        return spec
    resolved = resolve_code_spec(spec, DATASETS, base_dir)
    if resolved is not None:
        return resolved
    text = spec.strip()
    name, colon, rest = text.partition(":")
    if text.lower().endswith(".npz") and name.strip() not in DATASETS:
        return resolve_path(text, base_dir)  # FILE.npz is short for npz:path=FILE.npz
    if not colon or name.strip() not in DATASETS:
        return spec
    items = []
    for item in rest.split(","):
        key, equals, value = item.partition("=")
        if not equals:
            return spec  # not key=value: the data set's own check says what is wrong
        if key.strip() in PATH_PARAMETERS and value.strip():
            value = resolve_path(value.strip(), base_dir)
        items.append(f"{key.strip()}={value.strip()}")
    return f"{name.strip()}:{','.join(items)}"


def resolve_experiment_paths(data: Mapping[str, Any], base_dir: str | Path) -> dict[str, Any]:
    """A copy of an experiment's tables with every input path under ``base_dir``: the
    ``[graph]`` file, ``workload.model``, ``workload.dataset`` and ``workload.cache_dir``.
    Values of the wrong type are left for the validation to report."""
    base = Path(base_dir)
    top = dict(data)
    graph = top.get("graph")
    if isinstance(graph, Mapping) and isinstance(graph.get("file"), str):
        top["graph"] = {**graph, "file": resolve_path(graph["file"], base)}
    workload = top.get("workload")
    if isinstance(workload, Mapping):
        table = dict(workload)
        if "model" in table:
            table["model"] = resolve_model_spec(table["model"], base)
        if "dataset" in table:
            table["dataset"] = resolve_dataset_spec(table["dataset"], base)
        if isinstance(table.get("cache_dir"), str) and table["cache_dir"].strip():
            table["cache_dir"] = resolve_path(table["cache_dir"], base)
        top["workload"] = table
    return top
