"""Logging for the ``gossipnet peer`` process: stderr, as text or one JSON object per line.

``--log-level`` picks the level and ``--log-json`` the format (:func:`configure_logging`);
a JSON line holds ``time``, ``level``, ``logger``, ``message`` (and ``exception``), for
log collectors that parse lines.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and exception text)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, as_json: bool) -> None:
    """Log to stderr at ``level``, as text or one JSON object per line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
