"""A sweep's figure: the final test accuracy of every grid cell, drawn for its grid's shape
(for a language model's cells, the final validation bits per byte instead, lower is better).

- one axis: horizontal bars, one per value, the accuracy written at each bar's end;
- two axes: a heatmap, rows the first axis and columns the second, the accuracy written in
  every cell;
- three or more: small multiples, one panel per combination of all axes but the last, one
  line per value of the last, test accuracy against rounds (for three axes the panels form
  a grid, rows the first axis and columns the second).

Accuracy is drawn on its whole range, 0 to 1, with one perceptually uniform colour map
(viridis) and a labelled colour bar, so a colour neither hides nor exaggerates a difference;
the numbers are written anyway. A cell without a result says why (``invalid``, ``failed``,
``not run``) instead of being drawn as 0. Nothing is drawn on a log axis. Tick labels are
rotated and the figure grows with the longest label, so labels fit. matplotlib is imported
inside :func:`draw_sweep` only.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Cell = Sequence[Mapping[str, Any]] | str
"""A cell's records (plain dicts, in round order), or why it has none."""

METRIC = "test_accuracy"
METRIC_LABEL = "final test accuracy of the honest peers' average model"
LANGUAGE_METRIC = "test_bits_per_byte"
"""A language model's records' headline (:data:`sim.metrics.LANGUAGE_MODEL_COLUMNS`): the
figure shows it instead of accuracy, which it never draws for a language model."""


@dataclass(frozen=True)
class _Shown:
    """What a sweep's figure shows: the record key, its words, and the value axis's top."""

    key: str
    label: str
    word: str
    top: float


def _shown(cells: Mapping[tuple[str, ...], Cell]) -> _Shown:
    """Accuracy (0 to 1) for classifiers; bits per byte (0 to the largest value) when the
    cells are a language model's."""
    values = [
        final_accuracy(cell, LANGUAGE_METRIC)
        for cell in cells.values()
        if not isinstance(cell, str) and cell and LANGUAGE_METRIC in cell[-1]
    ]
    finite = [v for v in values if math.isfinite(v)]
    if not values:
        return _Shown(METRIC, METRIC_LABEL, "test accuracy", 1.0)
    return _Shown(
        LANGUAGE_METRIC,
        "final validation bits per byte of the honest peers' average model (lower is better)",
        "validation bits per byte",
        max(finite, default=8.0) * 1.05,
    )


def final_accuracy(cell: Cell | None, key: str = METRIC) -> float:
    """The last finite test accuracy (or other ``key``) of a cell's records; NaN for a cell
    without one."""
    if cell is None or isinstance(cell, str):
        return math.nan
    for record in reversed(cell):
        value = record.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return math.nan


def _readable_on(rgba: Sequence[float]) -> str:
    """Black or white, whichever contrasts more with the colour ``rgba`` (WCAG relative
    luminance; the two contrasts are equal at a luminance of about 0.18)."""
    channels = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    luminance = 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]
    return "black" if luminance > 0.179 else "white"


def _why(cell: Cell | None) -> str:
    return cell if isinstance(cell, str) else "not run" if cell is None else "no value"


def draw_sweep(
    names: Sequence[str],
    labels: Sequence[Sequence[str]],
    cells: Mapping[tuple[str, ...], Cell],
    *,
    title: str,
) -> Any:
    """The figure (unsaved) for a grid of axes ``names`` with value ``labels`` per axis;
    ``cells`` maps one label per axis to the cell's records or to why it has none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(names) != len(labels) or not names:
        raise ValueError(
            f"names: one per axis of labels ({len(labels)}), at least one; got {len(names)}"
        )
    if len(names) == 1:
        return _bars(plt, names[0], labels[0], cells, title)
    if len(names) == 2:
        return _heatmap(plt, names, labels, cells, title)
    return _small_multiples(plt, names, labels, cells, title)


def plot_sweep(
    names: Sequence[str],
    labels: Sequence[Sequence[str]],
    cells: Mapping[tuple[str, ...], Cell],
    path: str | Path,
    *,
    title: str,
) -> Path:
    """:func:`draw_sweep`, saved as a PNG at ``path``."""
    figure = draw_sweep(names, labels, cells, title=title)  # selects the Agg backend first
    import matplotlib.pyplot as plt

    out = Path(path)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def _longest(labels: Sequence[str]) -> int:
    return max((len(label) for label in labels), default=1)


def _title(figure: Any, title: str, width_inches: float, second: str) -> None:
    characters = max(40, int(width_inches * 11))
    lines = textwrap.wrap(title, characters) + textwrap.wrap(second, characters)
    figure.suptitle("\n".join(lines), fontsize=11)


def _bars(plt: Any, name: str, labels: Sequence[str], cells: Mapping, title: str) -> Any:
    shown = _shown(cells)
    values = [final_accuracy(cells.get((label,)), shown.key) for label in labels]
    width = 7.0 + 0.07 * _longest(labels)
    height = 1.6 + 0.45 * len(labels)
    figure, axis = plt.subplots(figsize=(width, height), layout="constrained")
    positions = list(range(len(labels)))
    drawn = [0.0 if math.isnan(v) else v for v in values]
    axis.barh(positions, drawn, color="#3b6ea8", height=0.6)
    for position, value, label in zip(positions, values, labels):
        if math.isnan(value):
            text, x, align, colour = _why(cells.get((label,))), 0.01, "left", "#555555"
        elif value > 0.85 * shown.top:
            text, x, align, colour = f"{value:.3f}", value - 0.01 * shown.top, "right", "white"
        else:
            text, x, align, colour = f"{value:.3f}", value + 0.01 * shown.top, "left", "black"
        axis.text(x, position, text, va="center", ha=align, color=colour, fontsize=10)
    axis.set_yticks(positions, labels=labels)
    axis.invert_yaxis()  # the first value on top, as written on the command line
    axis.set_xlim(0.0, shown.top)
    axis.set_xlabel(shown.label)
    axis.set_ylabel(name)
    axis.grid(axis="x", alpha=0.3)
    _title(figure, title, width, "")
    return figure


def _heatmap(
    plt: Any, names: Sequence[str], labels: Sequence[Sequence[str]], cells: Mapping, title: str
) -> Any:
    import numpy as np

    rows, columns = labels
    shown = _shown(cells)
    matrix = np.array(
        [
            [final_accuracy(cells.get((row, column)), shown.key) for column in columns]
            for row in rows
        ]
    )
    rotate = _longest(columns) > 6
    width = 2.6 + 0.08 * _longest(rows) + max(1.0, 0.075 * _longest(columns)) * len(columns)
    width = max(width, 6.0)
    height = 2.2 + 0.55 * len(rows) + (0.06 * _longest(columns) if rotate else 0.0)
    figure, axis = plt.subplots(figsize=(width, height), layout="constrained")
    language = shown.key == LANGUAGE_METRIC  # lower is better: the scale reversed
    colours = plt.get_cmap("viridis_r" if language else "viridis").with_extremes(bad="#e4e4e4")
    image = axis.imshow(
        np.ma.masked_invalid(matrix), cmap=colours, vmin=0.0, vmax=shown.top, aspect="auto"
    )
    size = 10 if len(columns) <= 8 else 8
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            value = matrix[i, j]
            if math.isnan(value):
                text, colour = _why(cells.get((row, column))), "#555555"
            else:
                text, colour = f"{value:.3f}", _readable_on(colours(value / shown.top))
            axis.text(j, i, text, ha="center", va="center", color=colour, fontsize=size)
    axis.set_xticks(range(len(columns)), labels=columns)
    if rotate:
        plt.setp(axis.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")
    axis.set_yticks(range(len(rows)), labels=rows)
    axis.set_xlabel(names[1])
    axis.set_ylabel(names[0])
    bar = figure.colorbar(image, ax=axis, fraction=0.05, pad=0.02)
    bar.set_label(f"final {shown.word}" if language else "final test accuracy (0 to 1)")
    _title(figure, title, width, shown.label)
    return figure


def _small_multiples(
    plt: Any, names: Sequence[str], labels: Sequence[Sequence[str]], cells: Mapping, title: str
) -> Any:
    panels = list(itertools.product(*labels[:-1]))
    lines = labels[-1]
    count = len(panels)
    # three axes: a grid, rows the first axis and columns the second; more: rows of four
    columns = len(labels[1]) if len(names) == 3 and len(labels[1]) <= 6 else min(4, count)
    rows = math.ceil(count / columns)
    width = 1.5 + 3.6 * columns + 0.07 * _longest(lines)
    height = 1.6 + 2.8 * rows
    figure, axes = plt.subplots(
        rows, columns, figsize=(width, height), squeeze=False, sharey=True, layout="constrained"
    )
    colours = plt.get_cmap("tab10")
    shown = _shown(cells)
    key = shown.key
    for index, panel in enumerate(panels):
        axis = axes[index // columns][index % columns]
        missing = []
        for position, line in enumerate(lines):
            cell = cells.get((*panel, line))
            if cell is None or isinstance(cell, str) or math.isnan(final_accuracy(cell, key)):
                missing.append(f"{line} ({_why(cell)})")
                continue
            points = [
                (r["round"], r[key])
                for r in cell
                if isinstance(r.get(key), int | float) and math.isfinite(r[key])
            ]
            axis.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="o",
                markersize=3,
                color=colours(position % 10),
                label=line,
            )
        if missing:
            axis.text(
                0.02,
                0.02,
                textwrap.fill("no result: " + ", ".join(missing), 40),
                transform=axis.transAxes,
                fontsize=8,
                color="#555555",
                va="bottom",
            )
        header = ", ".join(f"{n}={v}" for n, v in zip(names[:-1], panel))
        axis.set_title(textwrap.fill(header, 45), fontsize=9)
        axis.set_ylim(0.0, shown.top)
        axis.grid(alpha=0.3)
        if index // columns == rows - 1 or index + columns >= count:
            axis.set_xlabel("round")
        if index % columns == 0:
            axis.set_ylabel(shown.word)
    for index in range(count, rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    handles = [
        plt.Line2D([], [], color=colours(position % 10), marker="o", markersize=3, label=line)
        for position, line in enumerate(lines)
    ]
    figure.legend(handles=handles, title=names[-1], loc="outside right upper", fontsize=9)
    _title(figure, title, width, f"{shown.word} of the honest peers' average model against rounds")
    return figure
