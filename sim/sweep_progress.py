"""A sweep's progress and an estimate of the time left, on a terminal or in a log.

Work is counted in rounds: a run of R rounds is R units (at least 1), reused runs count as
done. The estimate is the work left divided by the rate measured since the sweep started
(units done / seconds elapsed), so it includes the workers' start-up and whatever
parallelism the executor gives; it reads ``estimating`` until some work is done.

On a terminal (``stream.isatty()``) a rich progress bar is drawn on ``stream`` (stderr by
default) and cleared at the end. Otherwise plain lines go to ``stream``, one when the sweep
starts, one per finished or failed run, and one every ``interval`` seconds in between::

    sweep: 8 runs, 2 already done, 6 to run on 2 local processes
    sweep: 3/8 runs done, ~2m10s left
    sweep: run aggregator=krum:f=1, attack=alie failed: ...
    sweep: run optimizer.lr=10 diverged at round 12
    sweep: 8/8 runs done (1 diverged) in 4m02s
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO


def format_duration(seconds: float) -> str:
    """``45s``, ``2m10s``, ``1h05m``: whole seconds, two units at most."""
    total = max(0, math.ceil(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class SweepProgress:
    """Counts finished runs and rounds, estimates the time left, and shows both.

    Args:
        stream: where to write (default: stderr).
        live: draw a bar (default: when ``stream`` is a terminal).
        quiet: show nothing (the counts and the estimate still work).
        interval: seconds between two plain lines while nothing finishes.
        label: the word each plain line starts with.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        live: bool | None = None,
        quiet: bool = False,
        interval: float = 30.0,
        label: str = "sweep",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.live = (not quiet) and (
            live if live is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        )
        self.interval = interval
        self.label = label
        self.clock = clock
        self.units: dict[str, int] = {}
        self.progress: dict[str, int] = {}
        self.total_runs = 0
        self.finished = 0
        self.failed = 0
        self.diverged = 0
        self.started = clock()
        self.last_line = self.started
        self._bar: Any = None
        self._task: Any = None

    def start(self, work: Mapping[str, int], *, reused: int, where: str) -> None:
        """The runs to do (key -> rounds) and how many were already finished."""
        self.units = {key: max(1, rounds) for key, rounds in work.items()}
        self.progress = dict.fromkeys(self.units, 0)
        self.total_runs = len(self.units) + reused
        self.finished = reused
        self.started = self.last_line = self.clock()
        if self.quiet:
            return
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[left]}"),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                self._runs(), total=sum(self.units.values()) or 1, left=""
            )
        todo = len(self.units)
        already = f", {reused} already done" if reused else ""
        self._print(
            f"{self.label}: {self.total_runs} run{'s' if self.total_runs != 1 else ''}"
            f"{already}, {todo} to run" + (f" on {where}" if todo else "")
        )

    def round_done(self, key: str, round_: int) -> None:
        if key in self.progress:
            self.progress[key] = min(max(self.progress[key], round_), self.units[key])
            self._refresh()

    def run_done(self, key: str) -> None:
        if key in self.progress:
            self.progress[key] = self.units[key]
        self.finished += 1
        self._refresh()
        if not self.live and self.finished < self.total_runs:  # close() writes the last line
            self._print(self.status())

    def run_failed(self, key: str, label: str, message: str) -> None:
        """A failed run counts as done work (nothing is left to do for it)."""
        if key in self.progress:
            self.progress[key] = self.units[key]
        self.failed += 1
        self._print(f"{self.label}: run {label} failed: {message}")
        self._refresh()

    def run_diverged(self, key: str, label: str, round_: int) -> None:
        """A run that ended early because its models stopped being finite (it still counts
        as finished: its records up to then are kept); call before :meth:`run_done`."""
        self.diverged += 1
        self._print(f"{self.label}: run {label} diverged at round {round_}")

    def tick(self) -> None:
        if self.live:
            self._refresh()
        elif self.clock() - self.last_line >= self.interval:
            self._print(self.status())

    def close(self) -> None:
        """Stop the bar and write the final line."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elapsed = format_duration(self.clock() - self.started)
        failed = f", {self.failed} failed" if self.failed else ""
        diverged = f" ({self.diverged} diverged)" if self.diverged else ""
        self._print(
            f"{self.label}: {self.finished}/{self.total_runs} runs done{diverged}{failed} "
            f"in {elapsed}"
        )

    def done_units(self) -> int:
        return sum(self.progress.values())

    def seconds_left(self) -> float | None:
        """The estimate, or None until some work is done."""
        total, done = sum(self.units.values()), self.done_units()
        if done >= total:
            return 0.0
        elapsed = self.clock() - self.started
        if done == 0 or elapsed <= 0:
            return None
        return (total - done) * elapsed / done

    def _left(self) -> str:
        left = self.seconds_left()
        return "estimating time left" if left is None else f"~{format_duration(left)} left"

    def _runs(self) -> str:
        failed = f" ({self.failed} failed)" if self.failed else ""
        return f"{self.label}: {self.finished}/{self.total_runs} runs done{failed}"

    def status(self) -> str:
        """``sweep: 3/8 runs done, ~2m10s left``."""
        return f"{self._runs()}, {self._left()}"

    def _refresh(self) -> None:
        if self._bar is not None:
            self._bar.update(
                self._task, completed=self.done_units(), description=self._runs(), left=self._left()
            )

    def _print(self, line: str) -> None:
        self.last_line = self.clock()
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(line, highlight=False, markup=False)
        else:
            print(line, file=self.stream, flush=True)
