"""Figures of simulator runs, with axes chosen for the data they show.

:func:`plot` (and :func:`draw_runs`, which returns the figure unsaved) draws, for a mapping
``name -> records``, one panel each of: test accuracy against simulated time, test accuracy
against bytes sent, consensus distance against time and, for two runs or more, the simulated
time each run took to reach a common accuracy target. For a language model's runs the
headline is validation bits per byte instead of accuracy (lower is better; the target is the
best final bits per byte over the fraction), and accuracy is not drawn. The rules that keep them truthful:

- **Log or linear is chosen from the data** (:func:`choose_scale`): a time or byte axis is
  logarithmic when the runs' extents differ by :data:`LOG_SPAN` or more (on a linear axis the
  shortest run would fill less than a tenth of the width: ring all-reduce's 620 s next to
  gossip's 5 s), and linear, from 0, otherwise.
- **Nothing is drawn where it is not** (:func:`drawable`): a point with a value <= 0 on a log
  axis (a consensus distance of exactly 0, the evaluation at t = 0) or a non-finite value is
  left out, never clamped to a tiny stand-in; the legend says what was left out, run by run.
- **Limits contain the data** (:func:`axis_limits`), and a linear time or byte axis starts
  at 0.
- Colours follow the run across panels; the title names the run's rounds.

:func:`heatmap` draws a grid of numbers with a colour scale the caller sets from the data, the
number written in every cell (in black or white, whichever reads on that colour, see
:func:`text_colour`) and missing cells greyed out; :func:`label_points` places point labels
that neither overlap nor leave the axes.

matplotlib is imported inside the drawing functions only: importing this module (and
``sim.metrics``, which re-exports :func:`plot`) costs nothing on a machine without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # matplotlib and the records are only named in annotations here
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage
    from matplotlib.text import Annotation

    from sim.metrics import Record

Scale = Literal["linear", "log"]

LOG_SPAN = 10.0
"""Largest-to-smallest ratio of the runs' extents from which an axis becomes logarithmic."""

TARGET_FRACTION = 0.9
"""The time-to-target panel's target: this fraction of the best final accuracy of the runs."""

ACCURACY_LABEL = "test accuracy\n(honest peers' average model)"
BITS_PER_BYTE_LABEL = "validation bits per byte\n(honest peers' average model)"
DISTANCE_LABEL = r"consensus distance $\frac{1}{m}\sum_i \Vert x_i - \bar{x} \Vert^2$"


class FigureError(ValueError):
    """Bad input to a figure; the message names the argument and what it accepts."""


# --- choosing axes -------------------------------------------------------------------------


def _finite(values: Iterable[float]) -> list[float]:
    return [float(v) for v in values if math.isfinite(v)]


def _flatten(values: Iterable[Any]) -> list[float]:
    """The finite numbers of a grid, or of several grids (nested sequences or arrays)."""
    import numpy as np

    parts = [np.ravel(np.asarray(part, dtype=np.float64)) for part in values]
    return _finite(np.concatenate(parts).tolist()) if parts else []


def choose_scale(values: Iterable[float], *, span: float = LOG_SPAN) -> Scale:
    """``"log"`` when the positive finite ``values`` span a ratio of at least ``span``
    (largest / smallest), else ``"linear"``; zeros, negatives and non-finite values do not
    count.

    Pass what decides readability: for a time or byte axis the extent of each run (its
    largest value), so that a run ``span`` times shorter than the longest still gets more
    than a sliver of the axis; for a quantity such as the consensus distance, every value.
    """
    if not span > 1.0:
        raise FigureError(f"span: must be > 1, got {span!r}")
    positive = [v for v in _finite(values) if v > 0.0]
    if len(positive) < 2:
        return "linear"
    return "log" if max(positive) / min(positive) >= span else "linear"


ROUNDING_FLOOR = 1e-9
"""A run whose consensus distance stays below this (and above 0) has replicas that agree up
to float rounding: it is drawn as agreeing (its legend says so), not as a curve of noise."""


def _agrees_to_rounding(records: Sequence[Record]) -> bool:
    """Whether a run's consensus distance stays in (0, ROUNDING_FLOOR): rounding noise."""
    finite = _finite(r.consensus_distance for r in records)
    return bool(finite) and 0.0 < max(finite) < ROUNDING_FLOOR


def drawable(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    x_scale: Scale = "linear",
    y_scale: Scale = "linear",
) -> tuple[list[float], list[float]]:
    """The points ``(x, y)`` that exist on these axes: both finite, and > 0 on a log axis.

    Nothing is clamped: a consensus distance of 0 is not drawn at 1e-30 on a log axis, it is
    not drawn at all (the caller says so in the legend).
    """
    if len(xs) != len(ys):
        raise FigureError(f"xs, ys: must have the same length, got {len(xs)} and {len(ys)}")

    def exists(value: float, scale: Scale) -> bool:
        return math.isfinite(value) and (scale == "linear" or value > 0.0)

    kept = [(x, y) for x, y in zip(xs, ys) if exists(x, x_scale) and exists(y, y_scale)]
    return [float(x) for x, _ in kept], [float(y) for _, y in kept]


def axis_limits(
    values: Iterable[float], scale: Scale, *, from_zero: bool = False, room: float = 0.04
) -> tuple[float, float]:
    """Limits that contain every drawable value with a margin of ``room`` (a fraction of the
    axis length, on the log of the values for a log axis).

    A log axis starts at a positive value below the smallest positive one; a linear axis
    starts at 0 when ``from_zero`` (time and bytes start there) and never above the data.
    With no drawable value the limits are (0, 1), or (1, 10) on a log axis.
    """
    if room < 0.0:
        raise FigureError(f"room: must be >= 0, got {room!r}")
    finite = _finite(values)
    if scale == "log":
        positive = [v for v in finite if v > 0.0]
        if not positive:
            return 1.0, 10.0
        low, high = math.log10(min(positive)), math.log10(max(positive))
        pad = max(high - low, 0.2) * room + 0.02
        return 10.0 ** (low - pad), 10.0 ** (high + pad)
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if from_zero:
        low = min(low, 0.0)
    starts_at_zero = from_zero and low == 0.0
    width = high - low
    if width == 0.0:  # one value (0 only when from_zero)
        if starts_at_zero:
            return 0.0, 1.0
        pad = 0.5 * (abs(high) or 1.0)
        return low - pad, high + pad
    return (0.0 if starts_at_zero else low - width * room), high + width * room


# --- the headline metric -------------------------------------------------------------------


def _language(runs: Mapping[str, Sequence[Record]]) -> bool:
    """Whether ``runs`` are a language model's: their headline is bits per byte (lower is
    better), not accuracy (:attr:`sim.metrics.Record.headline`)."""
    return any(r.test_bits_per_byte is not None for rs in runs.values() for r in rs)


def _metric_word(language: bool) -> str:
    return "bits per byte" if language else "accuracy"


# --- time to target ------------------------------------------------------------------------


def target_accuracy(
    runs: Mapping[str, Sequence[Record]], fraction: float = TARGET_FRACTION
) -> float:
    """``fraction`` of the best final test accuracy among ``runs`` (runs whose last accuracy
    is not finite do not count; NaN when none is). For a language model's runs, whose
    headline is bits per byte (lower is better), the best final bits per byte divided by
    ``fraction``."""
    if not 0.0 < fraction <= 1.0:
        raise FigureError(f"fraction: must lie in (0, 1], got {fraction!r}")
    finals = _finite(records[-1].headline for records in runs.values() if records)
    if not finals:
        return math.nan
    from workloads.task import CLASSIFICATION, LANGUAGE_MODEL, TASKS

    task = TASKS[LANGUAGE_MODEL if _language(runs) else CLASSIFICATION]
    best = task.best(finals)  # the direction is the task's (workloads.task)
    return fraction * best if task.higher_is_better else best / fraction


def time_to_target(records: Sequence[Record], target: float) -> float | None:
    """Simulated time of the first evaluation whose test accuracy is >= ``target`` (bits per
    byte <= ``target``, for a language model); ``None`` when the run never reached it."""
    from workloads.task import TASKS

    for record in records:
        value = record.headline
        if value == target or TASKS[record.task].better(value, target):
            return float(record.time)
    return None


# --- the run figure ------------------------------------------------------------------------


def _colours(count: int) -> list[Any]:
    from matplotlib import colormaps

    palette = colormaps["tab10" if count <= 10 else "tab20"]
    return [palette(i % palette.N) for i in range(count)]


def _rounds_text(runs: Mapping[str, Sequence[Record]]) -> str:
    rounds = sorted({records[-1].round for records in runs.values()})
    text = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]}–{rounds[-1]}"
    text += " rounds"
    if len(runs) == 1:
        return f"{next(iter(runs))}, {text}"
    return f"{len(runs)} runs, {text}"


def _tick_text(value: float) -> str:
    return f"{value:g}"


def _log_tick_labels(ticks: Any, low: float, high: float) -> None:
    """Plain numbers on a log axis (0.1, 1, 10 rather than 10^-1 ...), with labels at 2, 3 and
    5 times each power of ten when the axis spans less than two decades, and at every minor
    tick under one decade (else one labelled tick, or none, might be all there is)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ticks.set_major_formatter(FuncFormatter(lambda value, _: _tick_text(value)))
    decades = math.log10(high / low)
    if decades >= 2.0:
        ticks.set_minor_formatter(NullFormatter())
        return
    labelled = (2.0, 3.0, 5.0) if decades >= 1.0 else tuple(float(m) for m in range(2, 10))

    def minor(value: float, _: Any) -> str:
        mantissa = round(value / 10.0 ** math.floor(math.log10(value) + 1e-9), 6)
        return _tick_text(value) if mantissa in labelled else ""

    ticks.set_minor_formatter(FuncFormatter(minor))


def plain_log_ticks(axis: Axes) -> None:
    """Plain numbers (0.006, 0.01, 0.02 rather than 6x10^-3 ...) on whichever of ``axis``'s
    x and y axes is logarithmic, for its current limits (set them first)."""
    if axis.get_xscale() == "log":
        _log_tick_labels(axis.xaxis, *sorted(axis.get_xlim()))
    if axis.get_yscale() == "log":
        _log_tick_labels(axis.yaxis, *sorted(axis.get_ylim()))


def _set_axis(axis: Axes, which: str, scale: Scale, values: Iterable[float], label: str) -> None:
    """Scale, limits and label of the x or y axis of ``axis``."""
    limits = axis_limits(values, scale, from_zero=True)
    text = f"{label} (log scale)" if scale == "log" else label
    ticks: Any
    if which == "x":
        axis.set_xscale(scale)
        axis.set_xlim(limits)
        axis.set_xlabel(text)
        ticks = axis.xaxis
    else:
        axis.set_yscale(scale)
        axis.set_ylim(limits)
        axis.set_ylabel(text)
        ticks = axis.yaxis
    if scale == "log":
        _log_tick_labels(ticks, *limits)


def _bytes_axis(axis: Axes, scale: Scale, values: Iterable[float]) -> None:
    from matplotlib.ticker import EngFormatter, NullFormatter

    _set_axis(axis, "x", scale, values, "bytes sent by all peers")
    axis.xaxis.set_major_formatter(EngFormatter(unit="B"))
    if scale == "log":
        axis.xaxis.set_minor_formatter(NullFormatter())


def draw_time_to_target(
    axis: Axes,
    runs: Mapping[str, Sequence[Record]],
    *,
    fraction: float = TARGET_FRACTION,
    colours: Sequence[Any] | None = None,
) -> None:
    """On ``axis``, the simulated time each run took to reach ``fraction`` of the best final
    accuracy among ``runs`` (:func:`target_accuracy`), one row per run, the first on top:
    bars from 0 on a linear axis, dots on a log one (a bar's length means nothing there),
    the time written next to each; a run that never got there says so."""
    if not runs:
        raise FigureError("runs: must name at least one run (name -> records)")
    colours = list(colours) if colours is not None else _colours(len(runs))
    if len(colours) != len(runs):
        raise FigureError(
            f"colours: must give one colour per run ({len(runs)}), got {len(colours)}"
        )
    target = target_accuracy(runs, fraction)
    names = list(runs)
    reached = {name: time_to_target(runs[name], target) for name in names}
    times = [t for t in reached.values() if t is not None and t > 0.0]
    scale = choose_scale(times)
    ends = [max(_finite(r.time for r in runs[name]), default=0.0) for name in names]
    low, high = axis_limits(times or ends, scale, from_zero=True, room=0.08)
    high = high * 2.5 if scale == "log" else high + 0.25 * (high - low)  # room for the labels
    rows = list(range(len(names)))[::-1]  # the first run on top, as in the legend
    for row, name, colour, end in zip(rows, names, colours, ends):
        time = reached[name]
        if time is None:
            axis.text(low, row, f"  not reached (run ends at {end:.3g} s)", va="center")
            continue
        if time <= 0.0:
            axis.text(low, row, "  reached at t = 0 (initial model)", va="center")
            continue
        if scale == "log":
            axis.plot([time], [row], "o", color=colour, markersize=8)
        else:
            axis.barh(row, time, color=colour, height=0.6)
        axis.annotate(
            f"{time:.3g} s", (time, row), xytext=(6, 0), textcoords="offset points", va="center"
        )
    axis.set_xscale(scale)
    axis.set_xlim(low, high)
    if scale == "log":
        _log_tick_labels(axis.xaxis, low, high)
    axis.set_ylim(-0.6, len(names) - 0.4)
    axis.set_yticks(rows, names)
    label = "simulated time to reach the target (s)"
    axis.set_xlabel(f"{label} (log scale)" if scale == "log" else label)
    shown = "never reached by any run" if math.isnan(target) else f"{target:.3f}"
    if _language(runs):
        title = f"time to the best final bits per byte / {fraction:.2g}: {shown}"
    else:
        title = f"time to {fraction:.0%} of the best final accuracy: {shown}"
    axis.set_title(title, fontsize=10)
    axis.grid(axis="x", alpha=0.3)


def draw_runs(
    runs: Mapping[str, Sequence[Record]],
    *,
    title: str | None = None,
    target_fraction: float = TARGET_FRACTION,
) -> Figure:
    """The figure :func:`plot` saves, unsaved (tests and notebooks can inspect its axes).

    Panels: accuracy against simulated time, accuracy against bytes sent, consensus distance
    against time and (two runs or more) time to ``target_fraction`` of the best final
    accuracy. Each axis's scale comes from :func:`choose_scale`; points that do not exist on
    a log axis are left out (:func:`drawable`) and the legend says which.
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if not runs:
        raise FigureError("runs: must name at least one run (name -> records)")
    empty = [name for name, records in runs.items() if not records]
    if empty:
        raise FigureError(f"runs: every run needs at least one record; empty: {', '.join(empty)}")
    if not 0.0 < target_fraction <= 1.0:
        raise FigureError(f"target_fraction: must lie in (0, 1], got {target_fraction!r}")

    several = len(runs) >= 2
    language = _language(runs)
    word = _metric_word(language)
    figure = Figure(figsize=(13, 9) if several else (16, 5), layout="constrained")
    grid = figure.subplots(2, 2) if several else figure.subplots(1, 3)[None, :]
    accuracy_time, accuracy_bytes = grid[0, 0], grid[0, 1]
    distance_time = grid[1, 0] if several else grid[0, 2]
    colours = _colours(len(runs))

    time_scale = choose_scale(max(_finite(r.time for r in rs), default=0.0) for rs in runs.values())
    bytes_scale = choose_scale(
        max(_finite(r.bytes_total for r in rs), default=0.0) for rs in runs.values()
    )
    distance_scale = choose_scale(
        r.consensus_distance for rs in runs.values() if not _agrees_to_rounding(rs) for r in rs
    )

    handles: list[Any] = []
    labels: list[str] = []
    for (name, records), colour in zip(runs.items(), colours):
        time = [r.time for r in records]
        accuracy = [r.headline for r in records]
        distance = [r.consensus_distance for r in records]
        style: dict[str, Any] = {
            "color": colour,
            "marker": "." if len(records) <= 40 else None,
            "lw": 1.6,
        }
        accuracy_time.plot(*drawable(time, accuracy, x_scale=time_scale), **style)
        sent = [r.bytes_total for r in records]
        accuracy_bytes.plot(*drawable(sent, accuracy, x_scale=bytes_scale), **style)
        notes = []
        rounding = _agrees_to_rounding(records)
        if rounding:
            # replicas that agree up to float rounding (every node took the same step,
            # summed in its own order): noise, not a disagreement worth a log axis
            notes.append(f"consensus distance below {ROUNDING_FLOOR:g} throughout (rounding)")
            distance = [0.0 if math.isfinite(d) else d for d in distance]
        xs, ys = drawable(time, distance, x_scale=time_scale, y_scale=distance_scale)
        distance_time.plot(xs, ys, **style)
        bad_accuracy = sum(not math.isfinite(a) for a in accuracy)
        if bad_accuracy:
            notes.append(f"{word} not finite at {bad_accuracy} of {len(records)}, not drawn")
        on_axis = [d for t, d in zip(time, distance) if time_scale == "linear" or t > 0.0]
        zeros = sum(d <= 0.0 for d in on_axis) if distance_scale == "log" and not rounding else 0
        if zeros and zeros == len(on_axis):
            notes.append("consensus distance 0 throughout, not drawn on the log axis")
        elif zeros:
            notes.append(f"consensus distance 0 at {zeros} of {len(on_axis)}, not drawn")
        bad_distance = sum(not math.isfinite(d) for d in on_axis)
        if bad_distance:
            notes.append(f"consensus distance not finite at {bad_distance}, not drawn")
        handles.append(Line2D([], [], **style))
        labels.append(f"{name}  ({'; '.join(notes)})" if notes else name)

    every = [r for rs in runs.values() for r in rs]
    _set_axis(accuracy_time, "x", time_scale, (r.time for r in every), "simulated time (s)")
    _bytes_axis(accuracy_bytes, bytes_scale, (r.bytes_total for r in every))
    _set_axis(distance_time, "x", time_scale, (r.time for r in every), "simulated time (s)")
    shown = [
        r.consensus_distance if not _agrees_to_rounding(rs) else 0.0
        for rs in runs.values()
        for r in rs
        if time_scale == "linear" or r.time > 0.0
    ]
    _set_axis(distance_time, "y", distance_scale, shown, DISTANCE_LABEL)
    finite_shown = _finite(shown)
    if finite_shown and max(finite_shown) <= 0.0:  # exact averages: an empty-looking panel
        distance_time.text(
            0.5,
            0.5,
            "consensus distance 0 (or rounding) in every run:\nthe replicas are equal",
            transform=distance_time.transAxes,
            ha="center",
            va="center",
            color="0.35",
        )
    for axis in (accuracy_time, accuracy_bytes):
        axis.set_ylabel(BITS_PER_BYTE_LABEL if language else ACCURACY_LABEL)
    for axis in (accuracy_time, accuracy_bytes, distance_time):
        axis.grid(alpha=0.3)

    # evaluations at t = 0 (or 0 bytes) have no place on a log axis: name them in the legend,
    # and when they are one common start (same seed, same initial model) draw its accuracy
    off_axes = [("t = 0", time_scale, "time"), ("0 bytes", bytes_scale, "bytes_total")]
    off = [text for text, scale, _ in off_axes if scale == "log"]
    hidden = [
        r
        for r in every
        if any(scale == "log" and getattr(r, field) <= 0.0 for _, scale, field in off_axes)
    ]
    if hidden:
        starts = {r.headline for r in hidden}
        where = " and ".join(off)
        if len(starts) == 1 and math.isfinite(start := next(iter(starts))):
            line: dict[str, Any] = {"color": "0.45", "ls": ":", "lw": 1.2}
            if time_scale == "log":
                accuracy_time.axhline(start, **line)
            if bytes_scale == "log":
                accuracy_bytes.axhline(start, **line)
            handles.append(Line2D([], [], **line))
            labels.append(f"initial model ({where}: off the log axis), {word} {start:.3f}")
        else:
            handles.append(Line2D([], [], color="none"))
            labels.append(f"{len(hidden)} evaluations at {where} are off the log axis, not drawn")

    if several:
        draw_time_to_target(grid[1, 1], runs, fraction=target_fraction, colours=colours)
    long = max(len(label) for label in labels) > 45
    figure.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=1 if long else min(len(labels), 4),
        frameon=False,
    )
    run_text = _rounds_text(runs)
    figure.suptitle(f"{title} — {run_text}" if title else run_text, fontsize=13)
    return figure


def plot(
    runs: Mapping[str, Sequence[Record]],
    path: str | Path,
    *,
    title: str | None = None,
    target_fraction: float = TARGET_FRACTION,
    dpi: int = 110,
) -> Path:
    """Draw ``runs`` (name -> records, one line per run) with :func:`draw_runs` and save the
    figure to ``path`` (the format from its suffix, PNG by default); returns the path."""
    figure = draw_runs(runs, title=title, target_fraction=target_fraction)
    out = Path(path)
    figure.savefig(out, dpi=dpi)
    return out


# --- heatmaps and point labels -------------------------------------------------------------


def _luminance(rgba: Sequence[float]) -> float:
    """Relative luminance of an sRGB colour (WCAG 2.x)."""

    def linear(channel: float) -> float:
        return channel / 12.92 if channel <= 0.04045 else ((channel + 0.055) / 1.055) ** 2.4

    red, green, blue = (linear(float(c)) for c in rgba[:3])
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def contrast_ratio(first: Sequence[float], second: Sequence[float]) -> float:
    """WCAG contrast ratio (1 to 21) between two RGB(A) colours with channels in [0, 1]."""
    a, b = sorted((_luminance(first), _luminance(second)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def text_colour(background: Sequence[float]) -> str:
    """``"black"`` or ``"white"``: whichever contrasts more with ``background`` (RGB(A) in
    [0, 1]), so a number written on a heatmap cell reads on every colour of the scale."""
    black = contrast_ratio(background, (0.0, 0.0, 0.0))
    white = contrast_ratio(background, (1.0, 1.0, 1.0))
    return "black" if black >= white else "white"


def colour_range(
    values: Iterable[Any], *, floor: float | None = None, minimum_span: float = 0.0
) -> tuple[float, float]:
    """``(vmin, vmax)`` for a heatmap of ``values`` (a grid, or several on one scale):
    from ``floor`` (say, chance accuracy; else the smallest finite value) to the largest
    finite value, and never narrower than ``minimum_span``.

    The span keeps noise from looking like a result: two cells that differ by less than a
    test set can resolve must not get opposite ends of the scale because nothing else in the
    grid differs more.
    """
    if minimum_span < 0.0 or not math.isfinite(minimum_span):
        raise FigureError(f"minimum_span: must be a finite number >= 0, got {minimum_span!r}")
    flat = _flatten(values)
    if floor is not None and not math.isfinite(floor):
        raise FigureError(f"floor: must be finite or None, got {floor!r}")
    low = floor if floor is not None else min(flat, default=0.0)
    high = max([*flat, low])
    span = max(high - low, minimum_span)
    if span == 0.0:
        span = abs(low) or 1.0
    return low, low + span


def heatmap(
    axis: Axes,
    values: Sequence[Sequence[float]],
    rows: Sequence[str],
    columns: Sequence[str],
    *,
    vmin: float,
    vmax: float,
    cmap: str = "viridis",
    number_format: str = "{:.2f}",
    missing: str = "n/a",
    fontsize: float = 9,
) -> AxesImage:
    """Draw ``values`` (``len(rows)`` x ``len(columns)``) as coloured cells with each number
    written in it; returns the image (pass it to ``figure.colorbar``).

    The colour range ``[vmin, vmax]`` is the caller's, chosen for the data (for accuracies,
    chance to the best cell, say): values outside it take the end colours, and a colour bar
    drawn with ``extend=heatmap_extend(values, vmin, vmax)`` shows that. Non-finite cells are
    grey, not a colour of the scale, and read ``missing``. Column labels are rotated so long
    names do not collide; use a constrained layout so nothing is clipped.
    """
    import numpy as np
    from matplotlib import colormaps

    grid = np.asarray(values, dtype=np.float64)
    if grid.ndim != 2 or grid.shape != (len(rows), len(columns)):
        raise FigureError(
            f"values: must be {len(rows)} rows x {len(columns)} columns (one per label), "
            f"got shape {grid.shape}"
        )
    if not (math.isfinite(vmin) and math.isfinite(vmax) and vmin < vmax):
        raise FigureError(f"vmin, vmax: must be finite with vmin < vmax, got {vmin!r}, {vmax!r}")
    palette = colormaps[cmap].with_extremes(bad="0.85")
    image = axis.imshow(
        np.ma.masked_invalid(grid), cmap=palette, vmin=vmin, vmax=vmax, aspect="auto"
    )
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            value = grid[i, j]
            if math.isfinite(value):
                position: Any = image.norm(value)
                colour = text_colour(palette(float(position)))
                label = number_format.format(value)
            else:
                colour, label = "black", missing
            axis.text(j, i, label, ha="center", va="center", color=colour, fontsize=fontsize)
    axis.set_xticks(
        range(len(columns)), list(columns), rotation=30, ha="right", rotation_mode="anchor"
    )
    axis.set_yticks(range(len(rows)), list(rows))
    axis.tick_params(length=0)
    return image


def heatmap_extend(
    values: Iterable[Any], vmin: float, vmax: float
) -> Literal["neither", "min", "max", "both"]:
    """The colour bar's ``extend`` for ``values`` (a grid, or several grids drawn on one
    scale) on ``[vmin, vmax]``: an arrow at each end that some finite value lies beyond."""
    flat = _flatten(values)
    below = any(v < vmin for v in flat)
    above = any(v > vmax for v in flat)
    if below and above:
        return "both"
    return "min" if below else "max" if above else "neither"


_OFFSETS = ((5, 4), (5, -4), (-5, 4), (-5, -4), (0, 8), (0, -8), (12, 0), (-12, 0))


def label_points(
    axis: Axes,
    xs: Sequence[float],
    ys: Sequence[float],
    labels: Sequence[str],
    *,
    fontsize: float = 8,
) -> list[Annotation]:
    """Write ``labels[i]`` next to the point ``(xs[i], ys[i])``, each where it overlaps no
    label placed before it and stays inside the axes (the first such of eight positions
    around the point; the least overlapping one when none is free).

    Lay the figure out first (``figure.draw_without_rendering()``) so the axes have their
    final size; the labels take no part in the layout afterwards.
    """
    if not len(xs) == len(ys) == len(labels):
        raise FigureError(
            f"xs, ys, labels: must have the same length, got {len(xs)}, {len(ys)}, {len(labels)}"
        )
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.transforms import Bbox

    figure: Any = axis.figure
    canvas = figure.canvas
    if not isinstance(canvas, FigureCanvasAgg):  # a bare Figure(): measure text with Agg
        canvas = FigureCanvasAgg(figure)
    renderer = canvas.get_renderer()
    frame = axis.get_window_extent(renderer)
    half = 4.0  # a marker's half width in pixels: labels do not cover the points either
    placed: list[Any] = [
        Bbox.from_bounds(px - half, py - half, 2 * half, 2 * half)
        for px, py in axis.transData.transform(list(zip(xs, ys)))
    ]
    annotations: list[Annotation] = []
    for x, y, text in zip(xs, ys, labels):
        candidates: list[tuple[float, Annotation]] = []
        for dx, dy in _OFFSETS:
            note = axis.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha="left" if dx > 0 else "right" if dx < 0 else "center",
                va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                fontsize=fontsize,
            )
            note.set_in_layout(False)
            box = note.get_window_extent(renderer)
            overlap = sum(_overlap_area(box, other) for other in placed)
            outside = box.width * box.height - _overlap_area(box, frame)
            candidates.append((overlap + outside, note))
            if candidates[-1][0] == 0.0:
                break
        chosen = min(candidates, key=lambda candidate: candidate[0])[1]
        for _, note in candidates:
            if note is not chosen:
                note.remove()
        placed.append(chosen.get_window_extent(renderer))
        annotations.append(chosen)
    return annotations


def _overlap_area(first: Any, second: Any) -> float:
    width = min(first.x1, second.x1) - max(first.x0, second.x0)
    height = min(first.y1, second.y1) - max(first.y0, second.y0)
    return max(width, 0.0) * max(height, 0.0)
