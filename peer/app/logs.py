"""Logging for the ``gossipnet peer`` process: stderr, as text or one JSON object per line.

``--log-level`` picks the level and ``--log-json`` the format (:func:`configure_logging`);
a JSON line holds ``time``, ``level``, ``logger``, ``message`` (and ``exception``), for
log collectors that parse lines.

A log line is never glued onto a live status line or table: while one is drawn (rich's
``Live``, registered with :func:`above_live`), the handler prints the line through the live
display's console, which clears the live lines, writes the log line whole on a line of its
own (never wrapped: a JSON line stays one line) and draws them again below it. Otherwise it
writes to ``sys.stderr`` as it is at that moment.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_LIVE: list[Console] = []
"""The consoles of the live displays being drawn, innermost last."""


@contextmanager
def above_live(console: Console) -> Iterator[None]:
    """While the block runs, log lines go above the live display drawn on ``console``
    (cleared, the line, drawn again) instead of onto its last line."""
    _LIVE.append(console)
    try:
        yield
    finally:
        _LIVE.remove(console)


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


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on ``sys.stderr`` as it is at each record, not as it was when the
    handler was made; above the live display while one is drawn (:func:`above_live`)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        if not _LIVE:
            super().emit(record)
            return
        from rich.text import Text

        try:
            _LIVE[-1].print(Text(self.format(record)), soft_wrap=True)
        except Exception:  # as StreamHandler.emit: a broken log line never stops the peer
            self.handleError(record)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """``StreamHandler.__init__`` and ``setStream`` set it; the current one always wins."""


def configure_logging(level: str, as_json: bool) -> None:
    """Log to stderr at ``level``, as text or one JSON object per line (through a live
    display while one is drawn: :class:`CurrentStderrHandler`)."""
    handler = CurrentStderrHandler()
    handler.setFormatter(
        JsonFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
