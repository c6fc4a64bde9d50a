"""One row per attack, and the table the suite prints (rich) and writes (markdown).

Columns: requests tried, 4xx, 5xx, crashes (peer processes that exited without being
told to), model changes and membership changes caused by refused input, peak memory
(MiB, the attacked peer's resident set), memory after the abuse against the start (%),
hangs (requests that exceeded their deadline), and the verdict with its reasons.
A value the attack does not measure is ``None`` and shows as ``-``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

COLUMNS = (
    "attack",
    "requests",
    "4xx",
    "5xx",
    "crashes",
    "model changes",
    "membership changes",
    "peak MiB",
    "mem after vs start",
    "hangs",
    "verdict",
)


@dataclass
class Row:
    """The outcome of one attack; ``failures`` lists why its verdict fails (empty: pass)."""

    attack: str
    requests: int = 0
    client_errors: int | None = None
    server_errors: int | None = None
    crashes: int = 0
    model_changes: int | None = None
    membership_changes: int | None = None
    peak_mib: float | None = None
    memory_after_pct: float | None = None
    hangs: int | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail_if(self, condition: bool, reason: str) -> None:
        """Record ``reason`` as a failure when ``condition`` holds."""
        if condition:
            self.failures.append(reason)

    def check_common(self) -> None:
        """The verdicts every attack shares: no crash, no 5xx, no change from refused input,
        no hang, memory back within 10 % of its start."""
        self.fail_if(self.crashes > 0, f"{self.crashes} peer crash(es)")
        self.fail_if(bool(self.server_errors), f"{self.server_errors} 5xx answer(s)")
        self.fail_if(bool(self.model_changes), f"{self.model_changes} model change(s)")
        self.fail_if(
            bool(self.membership_changes), f"{self.membership_changes} membership change(s)"
        )
        self.fail_if(bool(self.hangs), f"{self.hangs} request(s) past their deadline")
        self.fail_if(
            self.memory_after_pct is not None and self.memory_after_pct > 10.0,
            f"memory {self.memory_after_pct:+.0f} % after the abuse (limit +10 %)"
            if self.memory_after_pct is not None
            else "",
        )

    def cells(self) -> list[str]:
        return [
            self.attack,
            str(self.requests),
            _text(self.client_errors),
            _text(self.server_errors),
            str(self.crashes),
            _text(self.model_changes),
            _text(self.membership_changes),
            "-" if self.peak_mib is None else f"{self.peak_mib:.0f}",
            "-" if self.memory_after_pct is None else f"{self.memory_after_pct:+.1f} %",
            _text(self.hangs),
            "pass" if self.passed else "FAIL",
        ]


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)


def print_table(rows: Sequence[Row], *, title: str) -> None:
    """Print the table with rich, then each failing row's reasons and every row's notes."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for name in COLUMNS:
        table.add_column(name, justify="left" if name == "attack" else "right")
    for row in rows:
        cells = row.cells()
        cells[-1] = "[green]pass[/]" if row.passed else "[bold red]FAIL[/]"
        table.add_row(*cells)
    console = Console(width=200)
    console.print(table)
    for row in rows:
        for reason in row.failures:
            console.print(f"[red]FAIL[/] {row.attack}: {reason}", highlight=False)
        for note in row.notes:
            console.print(f"     {row.attack}: {note}", highlight=False, markup=False)


def markdown(rows: Sequence[Row], *, title: str) -> str:
    """The table as GitHub markdown, followed by the failures and notes per attack."""
    lines = [f"### {title}", "", "| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "|".join("---" if c == "attack" else "--:" for c in COLUMNS) + "|")
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    details = [
        f"- {row.attack}: {'FAIL: ' if reason in row.failures else ''}{reason}"
        for row in rows
        for reason in [*row.failures, *row.notes]
    ]
    if details:
        lines += ["", *details]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, rows: Sequence[Row], *, title: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(rows, title=title))
    return path
