"""Finished sweep runs on disk, so that a sweep can resume (``sim.sweep``).

Each finished run is one JSON file, ``FOLDER/runs/KEY.json``, where ``KEY`` is
:func:`sim.sweep.run_key`, a hash of the run's resolved configuration. The file holds the
format, the key, the grid values, the experiment tables the run was built from and its
records (NaN written as null). It is written to a temporary file in the same folder and
renamed into place (``os.replace``), so a file either holds a finished run or does not
exist: a run interrupted midway leaves no file and is redone. A file that cannot be read
back (truncated by a full disk, edited by hand, another key inside) counts as missing.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FORMAT = "gossipnet-sweep-run/1"
"""The ``format`` field of a stored run; a file with another one is not read."""


def json_safe(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Records as plain JSON values: NaN and infinities become None (null), nested mappings
    and sequences are copied through. Fresh and resumed runs then give the same rows."""
    return [{key: _safe(value) for key, value in record.items()} for record in records]


def _safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(key): _safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(item) for item in value]
    return value


class RunStore:
    """The finished runs of one sweep, under ``folder/runs``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder) / "runs"

    def path(self, key: str) -> Path:
        """Where the run with ``key`` is (or will be) stored."""
        return self.folder / f"{key}.json"

    def load(self, key: str) -> list[dict[str, Any]] | None:
        """The stored records of run ``key``, or None when it has not finished (no file, or a
        file that does not read back as this run)."""
        try:
            content = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(content, dict) or content.get("format") != FORMAT:
            return None
        records = content.get("records")
        if content.get("key") != key or not isinstance(records, list):
            return None
        if not all(isinstance(record, dict) for record in records):
            return None
        return records

    def save(
        self,
        key: str,
        *,
        values: Mapping[str, Any],
        data: Mapping[str, Any],
        records: Sequence[Mapping[str, Any]],
    ) -> Path:
        """Store a finished run atomically (temporary file, then rename)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        content = {
            "format": FORMAT,
            "key": key,
            "grid": dict(values),
            "experiment": dict(data),
            "records": json_safe(records),
        }
        text = json.dumps(content, indent=1, default=str, allow_nan=False)
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            target = self.path(key)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return target
