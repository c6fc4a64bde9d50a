"""A sweep: one experiment file run over a grid of values, resumable (``gossipnet sim sweep``).

A grid is the Cartesian product of axes, each one field of the experiment file and its
values::

    --grid aggregator=mean,trimmed-mean:b=4 --grid attack=sign-flip,alie

gives four runs. A field is a short name (:data:`FIELD_ALIASES`: ``algorithm``,
``aggregator``, ``attack``, ``topology``, ``compressor``, ``peers``, ``seed``) or any dotted
path into the file's tables (``optimizer.lr``, ``algorithm.topology_params.degree``,
``rounds``). A value that reads as a TOML number or boolean (``0.1``, ``8``, ``true``) is
one; anything else is a string, and a TOML string in quotes (``'"8"'``) forces a string. A
spec's own parameters may follow a comma: in ``krum:f=1,m=2`` the piece ``m=2`` continues
the spec before it.

Each grid point is the file's raw tables (:func:`sim.config.load_experiment_data`) with the
point's values written in, built and validated by :func:`sim.config.experiment_from_dict`
and checked by :func:`sim.build.build_algorithm` (a robust rule the topology cannot feed, an
unknown attack), all before anything runs. Setting ``algorithm`` keeps only the
``[algorithm]`` keys that algorithm reads, as :meth:`ExperimentConfig.with_algorithm` does,
and is applied first, so the other values of the point land on that algorithm.

A finished run is stored under the output folder keyed by :func:`run_key`, a hash of its
fully resolved configuration (:mod:`sim.sweep_store`): running the same sweep again redoes
nothing that finished, and a run that was interrupted is redone. Runs execute on local
processes or on Ray (:mod:`sim.sweep_executors`); progress is :mod:`sim.sweep_progress`,
the results table :mod:`sim.sweep_table`, the figure :mod:`sim.sweep_figure`. See
docs/sweeps.md.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossip.configuration import GOSSIP_ALGORITHMS, GOSSIP_SETTINGS
from sim.build import build_algorithm
from sim.config import (
    AlgorithmConfig,
    ConfigError,
    ExperimentConfig,
    experiment_from_dict,
    load_experiment_data,
    named_runs,
)
from sim.metrics import Record
from sim.sweep_executors import Executor, RoundDone, RunDone, RunFailed, Task
from sim.sweep_figure import Cell, plot_sweep
from sim.sweep_progress import SweepProgress
from sim.sweep_store import RunStore, json_safe
from sim.sweep_table import parquet_available, table, write_csv, write_parquet

__all__ = [
    "FIELD_ALIASES",
    "GridAxis",
    "InvalidPoint",
    "SweepError",
    "SweepOutcome",
    "SweepPlan",
    "SweepPoint",
    "execute",
    "figure_cells",
    "parse_axis",
    "parse_value",
    "plan_sweep",
    "result_table",
    "run_key",
    "split_values",
    "write_outputs",
]

FIELD_ALIASES: dict[str, str] = {
    "algorithm": "algorithm.name",
    "aggregator": "algorithm.aggregator",
    "attack": "byzantine.attack",
    "topology": "algorithm.topology",
    "compressor": "algorithm.compressor",
    "peers": "workload.peers",
    "seed": "seed",
}
"""Short grid field names and the dotted path each one stands for."""

_ALGORITHM_NAME = ("algorithm", "name")
_TOP_LEVEL = tuple(f.name for f in dataclasses.fields(ExperimentConfig))
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")
_CONTINUATION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*=")
_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(Record))
_KEY_FORMAT = "gossipnet-sweep-run/1"


class SweepError(ValueError):
    """Bad sweep input; the message names the flag (``--grid``) and the allowed values."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class GridAxis:
    """One field of the experiment file and the values a sweep gives it.

    ``name`` is the field as the user wrote it (``aggregator``, ``optimizer.lr``); ``path``
    the keys it sets in the file's tables; ``column`` its column in the results table: the
    name, or the dotted path where the name is already a :class:`~sim.metrics.Record` field
    (``algorithm`` is written ``algorithm.name``, beside the record's own ``algorithm``).
    """

    name: str
    path: tuple[str, ...]
    values: tuple[Any, ...]

    @property
    def column(self) -> str:
        return ".".join(self.path) if self.name in _RECORD_FIELDS else self.name

    def labels(self) -> tuple[str, ...]:
        """The values as the user would write them (booleans in TOML spelling)."""
        return tuple(value_label(value) for value in self.values)


def value_label(value: Any) -> str:
    """A grid value as text: ``true`` for True, ``0.1`` for 0.1, strings as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_value(text: str) -> Any:
    """A grid value: a TOML number or boolean where the text reads as one, a quoted TOML
    string without its quotes, else the text itself (``trimmed-mean:b=4``)."""
    text = text.strip()
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text
    return value if isinstance(value, bool | int | float | str) else text


def split_values(text: str) -> list[str]:
    """Split ``v1,v2,...`` on commas, keeping a spec's own parameters with it: a piece of the
    form ``key=value`` after a spec with a ``:`` continues that spec
    (``mean,krum:f=1,m=2`` -> ``mean``, ``krum:f=1,m=2``)."""
    values: list[str] = []
    for piece in (part.strip() for part in text.split(",")):
        follows_spec = bool(values) and ":" in values[-1]
        if follows_spec and ":" not in piece and _CONTINUATION.match(piece):
            values[-1] = f"{values[-1]},{piece}"
        else:
            values.append(piece)
    return values


def _field_path(name: str, flag: str) -> tuple[str, ...]:
    allowed = (
        f"allowed: {', '.join(FIELD_ALIASES)}, or a dotted path into the file under "
        f"{', '.join(_TOP_LEVEL)} (optimizer.lr)"
    )
    if not _FIELD.fullmatch(name):
        raise SweepError(flag, f"{name!r} is not a field name; {allowed}")
    path = tuple(FIELD_ALIASES.get(name, name).split("."))
    if path[0] not in _TOP_LEVEL:
        raise SweepError(flag, f"unknown field {name!r}; {allowed}")
    return path


def parse_axis(text: str, *, flag: str = "--grid") -> GridAxis:
    """``FIELD=v1,v2,...`` -> a :class:`GridAxis`; :class:`SweepError` names ``flag``."""
    name, equals, rest = text.partition("=")
    name = name.strip()
    if not equals or not name:
        raise SweepError(flag, f"expected FIELD=VALUE1,VALUE2,...; got {text!r}")
    path = _field_path(name, flag)
    pieces = split_values(rest)
    if any(not piece for piece in pieces):
        raise SweepError(flag, f"{name}: empty value in {rest!r}; write FIELD=VALUE1,VALUE2")
    values = tuple(parse_value(piece) for piece in pieces)
    labels = [value_label(value) for value in values]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise SweepError(flag, f"{name}: value {repeated[0]!r} is given twice")
    return GridAxis(name, path, values)


def parse_setting(text: str, *, flag: str = "--set") -> tuple[tuple[str, ...], Any]:
    """``FIELD=VALUE`` -> (path, value): one value for every run, not a grid column."""
    axis = parse_axis(text, flag=flag)
    if len(axis.values) != 1:
        raise SweepError(flag, f"{axis.name}: takes one value; use --grid for several")
    return axis.path, axis.values[0]


def _assign(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    table = data
    for depth, key in enumerate(path[:-1]):
        inner = table.setdefault(key, {})
        if not isinstance(inner, dict):
            where = ".".join(path[: depth + 1])
            raise ConfigError(f"{where}: is {inner!r}, not a table; cannot set {'.'.join(path)}")
        table = inner
    table[path[-1]] = value
    if path == _ALGORITHM_NAME:
        _keep_read_keys(data)


def _keep_read_keys(data: dict[str, Any]) -> None:
    """What :meth:`ExperimentConfig.with_algorithm` does, on the raw tables: keep only the
    ``[algorithm]`` keys the new algorithm reads, and drop the ``[graph]`` for a baseline
    (only gossip algorithms read it). The experiment keeps its name."""
    table = data["algorithm"]
    try:
        reads = AlgorithmConfig(name=table["name"]).reads()
    except ConfigError:
        return  # an unknown name: the point is refused when it is validated
    data["algorithm"] = {key: value for key, value in table.items() if key in ("name", *reads)}
    if table["name"] not in GOSSIP_ALGORITHMS:
        data.pop("graph", None)


NAMED_RUN_PATH = ("compare",)
"""The path of :func:`named_runs_axis`: its values are labels of the file's ``[compare]``."""


def named_runs_axis(experiment: str | Path) -> GridAxis:
    """The axis of the file's named runs (``sim compare EXP.toml`` with no other choice):
    one value per ``[compare.NAME]`` entry, each replacing the sections it gives."""
    entries = named_runs(load_experiment_data(experiment))
    if not entries:
        raise SweepError(
            "compare",
            "give --algorithms or --over, or name the runs in the file's [compare] table "
            "(docs/sweeps.md)",
        )
    return GridAxis("run", NAMED_RUN_PATH, tuple(entries))


def apply(
    data: Mapping[str, Any], assignments: Iterable[tuple[tuple[str, ...], Any]]
) -> dict[str, Any]:
    """A deep copy of ``data`` with each (path, value) written in; the algorithm's name goes
    first, so the other values land on that algorithm's table."""
    result = copy.deepcopy(dict(data))
    ordered = sorted(assignments, key=lambda item: item[0] != _ALGORITHM_NAME)
    for path, value in ordered:
        _assign(result, path, value)
    return result


def run_key(config: ExperimentConfig) -> str:
    """The hash a finished run is stored under: every setting of ``config`` with the
    algorithm's defaults filled in (``aggregator = "mean"`` written or left out is one run),
    except ``[output]``, which changes no result. An edge list counts by its edges."""
    resolved = dataclasses.asdict(config)
    resolved.pop("output", None)
    if resolved.get("privacy") is None:  # runs stored before [privacy] keep their keys
        resolved.pop("privacy", None)
    algorithm = resolved["algorithm"]
    if config.algorithm.name in GOSSIP_ALGORITHMS:
        gossip = config.algorithm.gossip
        algorithm.update({key: getattr(gossip, key) for key in GOSSIP_SETTINGS})
        algorithm["topology"] = config.algorithm.topology or "ring"
    else:
        algorithm.update({key: config.algorithm.setting(key) for key in config.algorithm.reads()})
    text = json.dumps(
        {"format": _KEY_FORMAT, "config": resolved}, sort_keys=True, default=_plain
    ).encode()
    return hashlib.sha256(text).hexdigest()[:20]


def _plain(value: Any) -> Any:
    """JSON for what ``asdict`` leaves: arrays in full (``str`` would elide a long one),
    sets sorted, anything else as text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


@dataclass(frozen=True)
class SweepPoint:
    """One run of the sweep: the value of each axis, the tables it runs and its key."""

    values: Mapping[str, Any]
    data: Mapping[str, Any]
    config: ExperimentConfig
    key: str
    replaced: tuple[str, ...] = ()
    """The sections and top-level keys a named run (``[compare.NAME]``) replaced."""

    def label(self) -> str:
        return ", ".join(f"{name}={value_label(value)}" for name, value in self.values.items())


@dataclass(frozen=True)
class InvalidPoint:
    """A grid point refused before anything ran, and why (the message names the field)."""

    values: Mapping[str, Any]
    reason: str

    def label(self) -> str:
        return ", ".join(f"{name}={value_label(value)}" for name, value in self.values.items())


@dataclass(frozen=True)
class SweepPlan:
    """Every grid point of a sweep, validated; ``invalid`` holds the refused ones (only when
    the caller asked to skip them)."""

    experiment: Path
    base_dir: Path
    axes: tuple[GridAxis, ...]
    points: tuple[SweepPoint, ...]
    invalid: tuple[InvalidPoint, ...] = ()

    def tasks(self) -> list[Task]:
        """One task per distinct run (two points that resolve to one config run once)."""
        unique = {point.key: point for point in self.points}
        return [
            {"key": key, "data": dict(point.data), "base_dir": str(self.base_dir)}
            for key, point in unique.items()
        ]

    def describe(self) -> str:
        """The settings every run shares, for a title: ``byzantine-sign-flip: dpsgd, 20
        peers (4 Byzantine, sign-flip), 150 rounds``; fields the grid varies are left out."""
        if not self.points:
            return self.experiment.stem
        config = self.points[0].config
        varied = {axis.path for axis in self.axes}
        if NAMED_RUN_PATH in varied:  # what the named runs replace varies too
            replaced = {key for point in self.points for key in point.replaced}
            varied |= {(key,) for key in replaced}
            if "algorithm" in replaced:
                varied.add(_ALGORITHM_NAME)
            if "workload" in replaced:
                varied.add(("workload", "peers"))
        parts = []
        if _ALGORITHM_NAME not in varied:
            parts.append(config.algorithm.name)
        if ("workload", "peers") not in varied:
            peers = f"{config.workload.peers} peers"
            if config.byzantine.count and ("byzantine", "count") not in varied:
                attack = ("byzantine", "attack") not in varied
                peers += f" ({config.byzantine.count} Byzantine"
                peers += f", {config.byzantine.attack})" if attack else ")"
            parts.append(peers)
        if ("rounds",) not in varied:
            parts.append(f"{config.rounds} rounds")
        return f"{config.name}: {', '.join(parts)}" if parts else config.name


def plan_sweep(
    experiment: str | Path,
    axes: Sequence[GridAxis],
    *,
    settings: Sequence[tuple[tuple[str, ...], Any]] = (),
    skip_invalid: bool = False,
    check_device: bool = True,
    flag: str = "--grid",
    skip_flag: str | None = "--skip-invalid",
) -> SweepPlan:
    """Every grid point of ``axes`` on the experiment file, built and validated before
    anything runs.

    ``settings``: (path, value) pairs every run gets (``--set``, ``--rounds``). An invalid
    point raises :class:`SweepError` naming the point and the field, unless
    ``skip_invalid``; then it is listed in :attr:`SweepPlan.invalid` and not run.
    ``check_device``: also check that the config's device exists here (off for Ray, whose
    workers may have devices this machine lacks). ``flag`` names the command's flag that
    gave the axes (``sim compare``'s ``--over`` or ``--algorithms``), ``skip_flag`` the flag
    that skips invalid points, or ``None`` where the command has none.
    """
    names = [axis.name for axis in axes]
    if not axes:
        raise SweepError(flag, "give at least one FIELD=VALUE1,VALUE2,...")
    file = Path(experiment)
    base = load_experiment_data(file)
    entries = named_runs(base)
    paths = [axis.path for axis in axes]
    for position, axis_path in enumerate(paths):
        if axis_path in paths[:position]:
            raise SweepError(flag, f"{names[position]} is given twice; give it once")
    for setting, _ in settings:
        if setting in paths:
            raise SweepError("--set", f"{'.'.join(setting)} is also a {flag} field; give it once")
    points: list[SweepPoint] = []
    invalid: list[InvalidPoint] = []
    for combination in itertools.product(*(axis.values for axis in axes)):
        values = dict(zip(names, combination))
        replaced = [
            ((section,), table)
            for path, label in zip(paths, combination)
            if path == NAMED_RUN_PATH
            for section, table in entries[label].items()
        ]
        assigned = [(path, v) for path, v in zip(paths, combination) if path != NAMED_RUN_PATH]
        assignments = [*replaced, *settings, *assigned]
        try:
            data = apply(base, assignments)
            config = experiment_from_dict(data, base_dir=file.parent)
            build_algorithm(config)
            if check_device:
                from workloads.device import resolve_device

                resolve_device(config.device)
        except (ConfigError, ValueError) as error:
            invalid.append(InvalidPoint(values, str(error)))
            continue
        names_replaced = tuple(path[0] for path, _ in replaced)
        points.append(SweepPoint(values, data, config, run_key(config), names_replaced))
    if invalid and not skip_invalid:
        first = invalid[0]
        more = f" (and {len(invalid) - 1} more)" if len(invalid) > 1 else ""
        skip = f", or pass {skip_flag} to skip such points" if skip_flag else ""
        what = "grid point" if flag == "--grid" else "run"
        raise SweepError(
            flag,
            f"{what} {first.label()} is invalid: {first.reason}{more}; "
            f"change the values of {flag}{skip}",
        )
    return SweepPlan(file, file.parent.resolve(), tuple(axes), tuple(points), tuple(invalid))


@dataclass
class SweepOutcome:
    """What a sweep produced: each finished run's records (plain dicts, NaN as None) by key,
    how many runs ran now and how many were found finished, the failures, and the runs that
    diverged (key -> the round; their records stop there and carry ``diverged_at``)."""

    plan: SweepPlan
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    executed: int = 0
    reused: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    diverged: dict[str, int] = field(default_factory=dict)

    def runs(self) -> dict[str, list[Record]]:
        """Finished runs as :class:`Record` lists, by point label (``sim compare``'s table
        and figure); a value stored as null reads back as NaN, as in ``read_jsonl``."""
        result = {}
        for point in self.plan.points:
            if point.key in self.records:
                result[", ".join(value_label(v) for v in point.values.values())] = [
                    Record.from_dict({k: math.nan if v is None else v for k, v in row.items()})
                    for row in self.records[point.key]
                ]
        return result


def diverged_at(records: Sequence[Mapping[str, Any]]) -> int | None:
    """The round a run diverged at, from its records (``diverged_at``), or None."""
    value = records[-1].get("diverged_at") if records else None
    return None if value is None else int(value)


def execute(
    plan: SweepPlan,
    executor: Executor,
    *,
    store: RunStore | None = None,
    progress: SweepProgress | None = None,
) -> SweepOutcome:
    """Run every point of ``plan`` that ``store`` does not hold yet, storing each as it
    finishes; a failed run is reported and kept out of the store (the next call retries it).
    """
    outcome = SweepOutcome(plan)
    labels = {point.key: point.label() for point in plan.points}
    todo: list[Task] = []
    for task in plan.tasks():
        stored = store.load(task["key"]) if store is not None else None
        if stored is None:
            todo.append(task)
        else:
            outcome.records[task["key"]] = stored
            outcome.reused += 1
            diverged = diverged_at(stored)
            if diverged is not None:
                outcome.diverged[task["key"]] = diverged
    rounds = {point.key: point.config.rounds for point in plan.points}
    progress = progress or SweepProgress(quiet=True)
    progress.start(
        {task["key"]: rounds[task["key"]] for task in todo},
        reused=outcome.reused,
        where=executor.where,
    )
    try:
        for event in executor.run(todo):
            if isinstance(event, RoundDone):
                progress.round_done(event.key, event.round)
            elif isinstance(event, RunDone):
                records = json_safe(event.records)
                if store is not None:
                    point = next(p for p in plan.points if p.key == event.key)
                    store.save(event.key, values=point.values, data=point.data, records=records)
                outcome.records[event.key] = records
                outcome.executed += 1
                diverged = diverged_at(records)
                if diverged is not None:
                    outcome.diverged[event.key] = diverged
                    progress.run_diverged(event.key, labels[event.key], diverged)
                progress.run_done(event.key)
            elif isinstance(event, RunFailed):
                outcome.failed[event.key] = event.message
                progress.run_failed(event.key, labels[event.key], event.message)
            else:
                progress.tick()
    finally:
        progress.close()
    return outcome


def result_table(outcome: SweepOutcome) -> tuple[list[str], list[dict[str, Any]]]:
    """The tidy table (:mod:`sim.sweep_table`): every finished point's records, in grid
    order, under its grid values and key."""
    axes = outcome.plan.axes
    return table(
        (
            {axis.column: point.values[axis.name] for axis in axes},
            point.key,
            outcome.records[point.key],
        )
        for point in outcome.plan.points
        if point.key in outcome.records
    )


def figure_cells(outcome: SweepOutcome) -> dict[tuple[str, ...], Cell]:
    """Each grid cell (one value label per axis) -> its records, or why it has none."""
    cells: dict[tuple[str, ...], Cell] = {}
    for invalid in outcome.plan.invalid:
        cells[tuple(value_label(v) for v in invalid.values.values())] = "invalid"
    for point in outcome.plan.points:
        cell = tuple(value_label(v) for v in point.values.values())
        if point.key in outcome.records:
            cells[cell] = outcome.records[point.key]
        else:
            cells[cell] = "failed" if point.key in outcome.failed else "not run"
    return cells


def write_outputs(
    outcome: SweepOutcome,
    folder: str | Path,
    *,
    parquet: bool | None = None,
    figure: bool = True,
) -> dict[str, Path]:
    """Write ``results.csv``, ``results.parquet`` and ``accuracy.png`` into ``folder``.

    ``parquet``: None writes it when pyarrow is installed, True requires it
    (:class:`~sim.sweep_table.MissingDependency`), False skips it. Returns what was written.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    columns, rows = result_table(outcome)
    written = {"csv": write_csv(columns, rows, out / "results.csv")}
    if parquet or (parquet is None and parquet_available()):
        plan = outcome.plan
        metadata = {
            "gossipnet.sweep": json.dumps(
                {
                    "experiment": str(plan.experiment),
                    "grid": {axis.column: list(axis.values) for axis in plan.axes},
                }
            )
        }
        written["parquet"] = write_parquet(
            columns, rows, out / "results.parquet", metadata=metadata
        )
    if figure:
        axes = outcome.plan.axes
        written["figure"] = plot_sweep(
            [axis.name for axis in axes],
            [axis.labels() for axis in axes],
            figure_cells(outcome),
            out / "accuracy.png",
            title=outcome.plan.describe(),
        )
    return written
