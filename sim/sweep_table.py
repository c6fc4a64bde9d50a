"""A sweep's tidy results table: one row per (run, evaluation), as CSV and Parquet.

Columns, in order: one per grid axis (:attr:`sim.sweep.GridAxis.column`), ``run`` (the
run's key, the name of its file under ``runs/``), then every field of the run's records
in :class:`~sim.metrics.Record` order. The record columns come from the records themselves
(``Record.as_dict``: the fixed fields, then the per-group metrics under their own
``group/<name>/<metric>`` keys), so a field added to ``Record`` appears without this module
changing; a value that is still a table is flattened into ``field.key`` columns, and one
that is a list is written as JSON text. A value a record lacks (NaN, or a field only some
runs have) is empty in the CSV and null in Parquet.

Parquet needs pyarrow (in the ``dev`` extra); :func:`write_parquet` raises
:class:`MissingDependency` without it. A column whose values mix types (a grid over
``4, ring``) is written as text in Parquet.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


class MissingDependency(ImportError):
    """An optional package an output needs is not installed; the message says which."""


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": 1, "g": {"x": 2}, "l": [1, 2]}`` -> ``{"a": 1, "g.x": 2, "l": "[1, 2]"}``."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def table(
    runs: Iterable[tuple[Mapping[str, Any], str, Sequence[Mapping[str, Any]]]],
) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows for ``runs``: (grid values by column, key, records) each, in
    the order they should appear."""
    columns: dict[str, None] = {}
    rows = []
    for values, key, records in runs:
        for name in values:
            columns.setdefault(name, None)
        columns.setdefault("run", None)
        for record in records:
            row = {**values, "run": key, **flatten(record)}
            for name in row:
                columns.setdefault(name, None)
            rows.append(row)
    return list(columns), rows


def write_csv(columns: Sequence[str], rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """A header of ``columns``, then one line per row (missing and None values empty)."""
    out = Path(path)
    with out.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else _cell(v) for k, v in row.items()})
    return out


def _cell(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def parquet_available() -> bool:
    """Whether pyarrow can be imported here."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def write_parquet(
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """The same table as Parquet (pyarrow), with ``metadata`` in the file's schema."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependency(
            "pyarrow is not installed; install it (pip install pyarrow) for Parquet output"
        ) from None
    arrays = {}
    for name in columns:
        values = [row.get(name) for row in rows]
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            arrays[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
    result = pa.table(arrays)
    if metadata:
        result = result.replace_schema_metadata(dict(metadata))
    out = Path(path)
    pq.write_table(result, out)
    return out
