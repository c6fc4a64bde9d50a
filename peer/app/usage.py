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

A configuration error carries its field (:class:`~gossip.settings.ConfigurationError`);
:func:`flag_namer` names that field by the flag that sets it, read from the parser itself,
and :func:`add_setting_flags` adds one flag per algorithm setting as
:data:`gossip.settings.SETTINGS` declares it (type, choices, help).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NoReturn

__all__ = [
    "DeprecatedFlag",
    "OneLineParser",
    "UsageError",
    "add_setting_flags",
    "exit_with",
    "flag_namer",
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
    shows the usage), and whose flags are only taken by their whole names. With ``raise_errors=True`` an error raises :class:`UsageError`
    instead, so that a caller (``launch`` checking ``--peer-args``) can report it itself."""

    def __init__(self, *args: Any, raise_errors: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a flag is its whole name, never a prefix
        super().__init__(*args, **kwargs)
        self.raise_errors = raise_errors
        self.origins: dict[str, str] = {}
        """Flag -> where its value came from (``gossipnet launch EXPERIMENT.toml``: the
        file's key); an error about such a flag names that first: ``KEY (--flag): ...``."""

    def error(self, message: str) -> NoReturn:
        message = one_line(message)
        flag, colon, rest = message.partition(":")
        if colon and flag in self.origins:
            message = f"{self.origins[flag]} ({flag}):{rest}"
        if self.raise_errors:
            raise UsageError(message)
        exit_with(self.prog, message)


class DeprecatedFlag(argparse.Action):
    """The old name of a flag, kept working: it stores its value as the new flag does
    (same ``dest``) and says once per process, on stderr, that it is deprecated and which
    flag to use (``instead``)."""

    warned: ClassVar[set[str]] = set()

    def __init__(self, option_strings: Sequence[str], dest: str, *, instead: str, **kwargs: Any):
        self.instead = instead
        kwargs.setdefault("help", f"deprecated: the old name of {instead}, which it still sets")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        name = option_string or self.option_strings[0]
        if name not in DeprecatedFlag.warned:
            DeprecatedFlag.warned.add(name)
            print(
                f"{parser.prog}: warning: {name} is deprecated; use {self.instead} (same meaning)",
                file=sys.stderr,
                flush=True,
            )
        setattr(namespace, self.dest, values)


def _switch(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert`` with its ValueError as argparse's own error, so the flag's line says what
    was wrong (``must be true or false, got 'maybe'``), not argparse's "invalid value"."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def add_setting_flags(group: Any) -> None:
    """One flag per algorithm setting (:data:`gossip.settings.SETTINGS`) on ``group`` (a
    parser or an argument group): ``--consensus-step GAMMA``, its type and choices, and a
    help line with what it does, the allowed values, the default and who reads it. Each
    defaults to ``None``: the algorithm's own default."""
    from gossip.settings import SETTINGS  # here: gossipnet status must not load torch

    for item in SETTINGS:
        # a boolean setting is a switch (--secure-sum) that also takes true/false, which is
        # how launch passes it through to its peers
        switch: dict[str, Any] = (
            {"nargs": "?", "const": True, "type": _switch(item.convert), "metavar": "true|false"}
            if item.type is bool
            else {"type": item.type, "metavar": item.metavar}
        )
        group.add_argument(
            item.flag,
            dest=item.name,
            choices=item.choices or None,
            default=None,
            help=f"{item.help}; allowed: {item.allowed}; default {item.default_text()}; "
            f"read by {', '.join(item.readers)}",
            **switch,
        )


def flag_namer(parser: argparse.ArgumentParser, **extra: str) -> Callable[[str], str]:
    """A function that names a configuration field by the long flag of ``parser`` that
    sets it (``consensus_step`` -> ``--consensus-step``, ``peer_id`` -> ``--id``);
    ``extra`` adds fields that a flag sets indirectly (``peer_list="--peers-file"``). A
    field no flag sets is written as it is."""
    flags: dict[str, str] = {}
    for action in parser._actions:  # the parser's own table of flags, dest -> option
        longs = [option for option in action.option_strings if option.startswith("--")]
        if longs and action.dest not in flags:
            flags[action.dest] = longs[0]
    flags.update(extra)
    return lambda field: flags.get(field, field)
