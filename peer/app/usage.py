"""One format for every user mistake on the command line, for ``gossipnet peer``, ``launch``,
``status`` and ``export``.

A mistake is one line on stderr and exit code 2, before anything expensive starts::

    gossipnet peer: error: --mode: invalid choice 'gossip'; allowed: async, sync

that is ``PROG: error: FLAG: WHAT`` and, where the values are a known set,
``; allowed: V1, V2, ...`` at the end. No usage block, no traceback. The rule layers
below (``gossip``, ``topologies``, ``consensus``, argparse itself) phrase their lists in
several ways (``choices: a, b``, ``choose one of: a, b``, ``choose one of ['a', 'b']``,
``must be one of (2, 4), got 3``, ``(choose from 'a', 'b')``); :func:`one_line` rewrites
each into the one format, so whatever layer found the mistake, the user reads the same
shape of line.

A renamed flag keeps its old name for one release (:class:`DeprecatedAlias`): it works and
prints one line, ``PROG: warning: --compress is deprecated and goes away in the next
release; use --compressor``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = [
    "DeprecatedAlias",
    "OneLineParser",
    "UsageError",
    "exit_with",
    "one_line",
]


class UsageError(ValueError):
    """A user mistake on a command line; its message is the line after ``PROG: error: ``."""


def _items(listing: str) -> str:
    """``"['a', 'b']"``, ``"(2, 4)"`` or ``"'a', 'b'"`` as ``"a, b"``."""
    text = listing.strip()
    if len(text) >= 2 and text[0] + text[-1] in ("[]", "()", "{}"):
        text = text[1:-1]
    parts = [part.strip().strip("'\"") for part in text.split(",")]
    return ", ".join(part for part in parts if part)


_REWRITES: tuple[tuple[re.Pattern[str], Any], ...] = (
    # argparse: "argument --mode: invalid choice: 'x' (choose from 'a', 'b')"
    (
        re.compile(r"invalid choice: (?P<value>.+?) \(choose from (?P<list>.+)\)$"),
        lambda m: f"invalid choice {m['value']}; allowed: {_items(m['list'])}",
    ),
    # consensus "; choices: a, b", topologies "; choose one of: a, b", gossip "; choose one
    # of ['a', 'b']"
    (
        re.compile(r"; (?:choices|choose one of):? (?P<list>.+)$"),
        lambda m: f"; allowed: {_items(m['list'])}",
    ),
    # "bits must be one of (2, 4, 8), got 3"
    (
        re.compile(r" must be one of (?P<list>\[.*?\]|\(.*?\)|\{.*?\}), got (?P<value>.+)$"),
        lambda m: f": got {m['value']}; allowed: {_items(m['list'])}",
    ),
)


def one_line(message: str) -> str:
    """``message`` in the one format: argparse's ``argument X: `` prefix becomes ``X: ``,
    every way of listing allowed values becomes ``; allowed: a, b``, and only the first line
    is kept."""
    text = (message.strip().splitlines() or [""])[0]
    text = re.sub(r"^argument ([^:]+): ", r"\1: ", text)
    for pattern, replace in _REWRITES:
        text = pattern.sub(replace, text, count=1)
    return text


def exit_with(prog: str, message: str, code: int = 2) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` (in the one format) on stderr and exit."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(code)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line and exit code 2 (``--help`` still
    shows the usage). With ``raise_errors=True`` an error raises :class:`UsageError`
    instead, so that a caller (``launch`` checking ``--peer-args``) can report it itself."""

    def __init__(self, *args: Any, raise_errors: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raise_errors = raise_errors
        self.warned: set[str] = set()

    def error(self, message: str) -> NoReturn:
        if self.raise_errors:
            raise UsageError(one_line(message))
        exit_with(self.prog, message)

    def warn(self, message: str) -> None:
        """One ``PROG: warning: MESSAGE`` line on stderr, once per message."""
        if message not in self.warned and not self.raise_errors:
            self.warned.add(message)
            print(f"{self.prog}: warning: {message}", file=sys.stderr, flush=True)


class DeprecatedAlias(argparse.Action):
    """The old name of a renamed flag: stores its value under the new flag's ``dest`` and
    prints one deprecation line (``add_argument("--compress", action=DeprecatedAlias,
    dest="compressor", new="--compressor")``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any):
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        message = f"{option_string} is deprecated and goes away in the next release; use {self.new}"
        if isinstance(parser, OneLineParser):
            parser.warn(message)
        else:
            print(f"{parser.prog}: warning: {message}", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, values)
