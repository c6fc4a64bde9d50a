"""``OneLineParser``: argparse whose errors are one line, for ``gossipnet peer``, ``launch``
and ``status``.

A bad flag prints ``PROG: error: MESSAGE (see PROG --help)`` on stderr and exits 2, without
argparse's usage block in front of the line that matters; ``--help`` still shows the usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose :meth:`error` prints one line and exits with code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
