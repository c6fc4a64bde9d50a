"""A log line is never glued onto a live status line: while rich draws one (the peer's live
line, the launcher's live table), the live lines are cleared, the log line is written on a
line of its own, and the live lines are drawn again (:mod:`peer.app.logs`)."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest
from rich.console import Console
from rich.live import Live
from rich.text import Text

from peer.app.logs import above_live, configure_logging

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    """What a terminal would be sent, as text."""

    def isatty(self) -> bool:
        return True


def screen_lines(sent: str) -> list[str]:
    """The lines a terminal would show segment by segment: escape codes dropped, a carriage
    return or a line feed starts a new one."""
    return [line for line in re.split(r"[\r\n]", ANSI.sub("", sent)) if line.strip()]


@pytest.mark.parametrize("as_json", [False, True])
def test_a_warning_during_a_live_line_is_a_line_of_its_own(
    as_json: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    configure_logging("WARNING", as_json)  # before the live line, as gossipnet peer does
    console = Console(stderr=True, force_terminal=True, width=60)
    live = Live(Text("peer a  step 1"), console=console, auto_refresh=False)
    with live, above_live(console):
        live.update(Text("peer a  step 2"), refresh=True)
        logging.getLogger("peer.node").warning("peer a: no exchange in 5 rounds, training alone")
        live.update(Text("peer a  step 3"), refresh=True)
    lines = screen_lines(terminal.getvalue())
    logged = [line for line in lines if "training alone" in line]
    assert len(logged) == 1, lines
    assert "step" not in logged[0], lines
    assert logged[0].endswith("training alone" + ('"}' if as_json else "")), lines  # whole
    assert lines[-1] == "peer a  step 3", lines  # the live line drawn again, last
