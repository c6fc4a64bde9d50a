"""Figure logic (sim.figures): the axis a figure chooses for its data, the points it leaves out
of a log axis, limits that contain the data, heatmap text that reads, labels that do not
collide. These check the figure objects, not pixels."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.figures import (
    FigureError,
    axis_limits,
    choose_scale,
    contrast_ratio,
    draw_runs,
    drawable,
    heatmap,
    heatmap_extend,
    label_points,
    plot,
    target_accuracy,
    text_colour,
    time_to_target,
)
from sim.metrics import Record

matplotlib = pytest.importorskip("matplotlib")


def record(name: str, round_: int, **values: float) -> Record:
    """A record with the given values; every other required metric NaN."""
    required = [f for f in fields(Record) if f.default is MISSING and f.default_factory is MISSING]
    row: dict[str, Any] = {f.name: math.nan for f in required}
    row.update(algorithm=name, round=round_, steps=round_, bytes_busiest=0.0)
    row.update(values)
    return Record(**row)


def run(
    name: str,
    seconds_per_round: float,
    *,
    rounds: int = 40,
    every: int = 10,
    distance: float = 0.5,
    bytes_per_round: float = 1e6,
) -> list[Record]:
    """A run that learns from 0.1 to 0.6 over ``rounds``, evaluated every ``every`` rounds;
    consensus distance 0 at the start, then ``distance``."""
    return [
        record(
            name,
            r,
            time=r * seconds_per_round,
            bytes_total=r * bytes_per_round,
            test_accuracy=0.1 + 0.5 * r / rounds,
            consensus_distance=0.0 if r == 0 else distance * r / rounds,
        )
        for r in range(0, rounds + 1, every)
    ]


def latency_bound() -> dict[str, list[Record]]:
    """The issue's case: all-reduce's 620 s next to gossip's few seconds; exact averaging
    has a consensus distance of 0 throughout."""
    return {
        "dpsgd": run("dpsgd", 0.12),
        "ad-psgd": run("ad-psgd", 0.11, distance=2.0),
        "allreduce": run("allreduce", 15.5, distance=0.0),
    }


# --- choose_scale ----------------------------------------------------------------------------

positive = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False)


@given(st.lists(positive, min_size=1, max_size=12))
def test_log_exactly_when_the_positive_values_span_the_ratio(values: list[float]) -> None:
    expected = "log" if max(values) / min(values) >= 10.0 else "linear"
    assert choose_scale(values) == expected
    # zeros, negatives and non-finite values change nothing
    assert choose_scale([*values, 0.0, -3.0, math.nan, math.inf]) == expected


@given(st.lists(positive, min_size=2, max_size=12), st.floats(min_value=1e-3, max_value=1e3))
def test_the_scale_does_not_depend_on_the_unit(values: list[float], factor: float) -> None:
    ratio = max(values) / min(values)
    if abs(math.log10(ratio) - 1.0) < 1e-9:  # on the boundary rounding may go either way
        return
    assert choose_scale([v * factor for v in values]) == choose_scale(values)


def test_the_issue_case_is_log_and_close_runs_are_linear() -> None:
    assert choose_scale([4.6, 620.0, 9.4]) == "log"  # gossip against all-reduce
    assert choose_scale([3.6, 6.6]) == "linear"
    assert choose_scale([0.0, 5.0]) == "linear"  # one positive value: nothing to compare
    assert choose_scale([]) == "linear"
    with pytest.raises(FigureError, match="span"):
        choose_scale([1.0, 2.0], span=1.0)
    assert isinstance(FigureError("x"), ValueError)


# --- drawable and axis_limits --------------------------------------------------------------

maybe = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.just(0.0), st.just(math.nan)
)


@given(st.lists(st.tuples(maybe, maybe), max_size=20))
def test_no_point_left_on_a_log_axis_is_zero_negative_or_not_finite(
    points: list[tuple[float, float]],
) -> None:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    for x_scale in ("linear", "log"):
        for y_scale in ("linear", "log"):
            kept_x, kept_y = drawable(xs, ys, x_scale=x_scale, y_scale=y_scale)  # type: ignore[arg-type]
            assert all(math.isfinite(v) for v in kept_x + kept_y)
            if x_scale == "log":
                assert all(v > 0 for v in kept_x)
            if y_scale == "log":
                assert all(v > 0 for v in kept_y)
            # exactly the points that exist on those axes are kept, in order
            expected = [
                (x, y)
                for x, y in points
                if math.isfinite(x)
                and math.isfinite(y)
                and (x_scale == "linear" or x > 0)
                and (y_scale == "linear" or y > 0)
            ]
            assert list(zip(kept_x, kept_y)) == expected
    with pytest.raises(FigureError, match="same length"):
        drawable([1.0], [])


@given(st.lists(maybe, max_size=20), st.booleans())
def test_limits_contain_every_drawable_value(values: list[float], from_zero: bool) -> None:
    for scale in ("linear", "log"):
        low, high = axis_limits(values, scale, from_zero=from_zero)  # type: ignore[arg-type]
        assert math.isfinite(low) and math.isfinite(high) and low < high
        shown, _ = drawable(values, values, x_scale=scale)  # type: ignore[arg-type]
        assert all(low <= v <= high for v in shown)
        if scale == "log":
            assert low > 0.0  # a log axis never starts at 0
        elif from_zero and shown and min(shown) >= 0:
            assert low == 0.0  # time and bytes start at 0


# --- time to target ------------------------------------------------------------------------


def test_time_to_target_is_the_first_evaluation_at_or_above_it() -> None:
    records = run("dpsgd", 0.5)  # accuracies 0.1, 0.225, 0.35, 0.475, 0.6 at 0, 5, ... 20 s
    assert time_to_target(records, 0.35) == 10.0
    assert time_to_target(records, 0.34) == 10.0
    assert time_to_target(records, 0.05) == 0.0
    assert time_to_target(records, 0.61) is None
    runs = {"a": records, "b": run("b", 1.0, rounds=20)}  # b ends at 0.6 as well
    assert target_accuracy(runs, 0.5) == pytest.approx(0.3)
    with pytest.raises(FigureError, match="fraction"):
        target_accuracy(runs, 0.0)


# --- the run figure ------------------------------------------------------------------------


def panels(figure: Any) -> dict[str, Any]:
    """The figure's axes by what they show (from their labels), colour bars excluded."""
    found = {}
    for axis in figure.axes:
        x, y = axis.get_xlabel(), axis.get_ylabel()
        if x.startswith("bytes"):
            found["bytes"] = axis
        elif y.startswith("consensus"):
            found["distance"] = axis
        elif x.startswith("simulated time to reach"):
            found["target"] = axis
        elif x.startswith("simulated time"):
            found["time"] = axis
    return found


def assert_every_point_is_on_its_axes(figure: Any) -> None:
    for axis in figure.axes:
        x_low, x_high = sorted(axis.get_xlim())
        y_low, y_high = sorted(axis.get_ylim())
        for line in axis.get_lines():
            xs = [float(v) for v in line.get_xdata()]
            ys = [float(v) for v in line.get_ydata()]
            if line.get_linestyle() == ":" and xs == [0.0, 1.0]:  # axhline: in axes coordinates
                continue
            if axis.get_xscale() == "log":
                assert all(v > 0 for v in xs), axis.get_xlabel()
            if axis.get_yscale() == "log":
                assert all(v > 0 for v in ys), axis.get_ylabel()
            assert all(x_low <= v <= x_high for v in xs), axis.get_xlabel()
            assert all(y_low <= v <= y_high for v in ys), axis.get_ylabel()


def legend_text(figure: Any) -> list[str]:
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def test_runs_that_span_orders_of_magnitude_get_a_log_time_axis() -> None:
    runs = latency_bound()
    figure = draw_runs(runs, title="latency-bound")
    found = panels(figure)
    assert found["time"].get_xscale() == "log"
    assert found["distance"].get_xscale() == "log"
    # dpsgd's whole run (4.8 s) gets a real share of the axis, not the first 1 %
    low, high = found["time"].get_xlim()
    share = (math.log10(4.8) - math.log10(low)) / (math.log10(high) - math.log10(low))
    assert share > 0.2  # on a linear axis it would be 0.8 %
    assert_every_point_is_on_its_axes(figure)
    # the t = 0 evaluations are off the log axis, and the legend says so
    assert any("t = 0" in text and "off the log axis" in text for text in legend_text(figure))
    assert "latency-bound" in figure.get_suptitle() and "40 rounds" in figure.get_suptitle()


def test_the_legend_names_off_axis_evaluations_only_when_there_are_some() -> None:
    runs = {name: records[1:] for name, records in latency_bound().items()}  # no t = 0
    figure = draw_runs(runs)
    assert panels(figure)["time"].get_xscale() == "log"
    assert not any("off the log axis" in text for text in legend_text(figure))
    # starts that differ cannot be one reference line: they are counted instead
    runs = latency_bound()
    runs["allreduce"][0] = record("allreduce", 0, time=0.0, bytes_total=0.0,
                                  test_accuracy=0.2, consensus_distance=0.0)  # fmt: skip
    labels = legend_text(draw_runs(runs))
    assert "3 evaluations at t = 0 are off the log axis, not drawn" in labels


def test_close_runs_get_a_linear_time_axis_from_zero() -> None:
    runs = {"dpsgd": run("dpsgd", 0.12), "ad-psgd": run("ad-psgd", 0.2)}
    figure = draw_runs(runs)
    found = panels(figure)
    assert found["time"].get_xscale() == "linear"
    assert found["time"].get_xlim()[0] == 0.0
    assert found["bytes"].get_xscale() == "linear"
    assert found["bytes"].get_xlim()[0] == 0.0
    assert_every_point_is_on_its_axes(figure)


def test_a_consensus_distance_of_zero_is_not_drawn_and_the_legend_says_so() -> None:
    runs = latency_bound()
    figure = draw_runs(runs)
    distance = panels(figure)["distance"]
    assert distance.get_yscale() == "log"  # 0.0125 to 2: more than a decade
    assert distance.get_ylim()[0] > 1e-3  # not stretched down to a stand-in for 0
    drawn = [len(line.get_ydata()) for line in distance.get_lines()]
    assert drawn == [4, 4, 0]  # allreduce's line is empty; the others lose only t = 0
    labels = legend_text(figure)
    assert any(t.startswith("allreduce") and "not drawn" in t for t in labels)
    assert not any(t.startswith("dpsgd") and "not drawn" in t for t in labels)


def test_zeros_after_the_start_are_counted_in_the_legend() -> None:
    records = run("dpsgd", 1.0, distance=5.0)
    records[2] = record("dpsgd", 20, time=20.0, bytes_total=2e7, test_accuracy=0.35,
                        consensus_distance=0.0)  # fmt: skip
    figure = draw_runs({"dpsgd": records, "other": run("other", 1.0, distance=0.01)})
    assert panels(figure)["distance"].get_yscale() == "log"
    assert any("0 at 2 of 5" in text for text in legend_text(figure))
    assert_every_point_is_on_its_axes(figure)


def test_replicas_that_agree_up_to_rounding_are_drawn_as_agreeing() -> None:
    """On the complete graph every node takes the same step, summed in its own order: the
    consensus distance is float noise (1e-13 here), not a curve to read on a log axis."""
    figure = draw_runs(
        {
            "dpsgd": run("dpsgd", 1.0, distance=5.0),
            "same step": run("same step", 1.0, distance=3e-13),
        }
    )
    distance = panels(figure)["distance"]
    assert distance.get_yscale() == "linear"  # the noise does not stretch a log axis to 1e-13
    drawn = [list(line.get_ydata()) for line in distance.get_lines()]
    assert not any(0 < y < 1e-9 for y in drawn[1])
    labels = legend_text(figure)
    assert any(t.startswith("same step") and "rounding" in t for t in labels)
    assert not any(t.startswith("same step") and "0 throughout" in t for t in labels)


def test_a_byte_axis_on_a_log_scale_never_starts_at_zero() -> None:
    runs = {
        "top-k": run("top-k", 0.1, bytes_per_round=1e4),
        "dense": run("dense", 0.1, bytes_per_round=1e7),
    }
    figure = draw_runs(runs)
    axis = panels(figure)["bytes"]
    assert axis.get_xscale() == "log"
    assert axis.get_xlim()[0] > 0.0
    assert_every_point_is_on_its_axes(figure)


def test_time_to_target_panel_shows_every_run() -> None:
    runs = latency_bound()
    runs["stuck"] = [
        record("stuck", r, time=r * 0.1, bytes_total=r * 1e6, test_accuracy=0.1,
               consensus_distance=0.1)
        for r in range(0, 41, 10)
    ]  # fmt: skip
    figure = draw_runs(runs)
    axis = panels(figure)["target"]
    rows = zip(axis.get_yticks(), (tick.get_text() for tick in axis.get_yticklabels()))
    assert [name for _, name in sorted(rows, reverse=True)] == list(runs)  # first on top
    assert axis.get_xscale() == "log"  # 4.4 s against 620 s
    texts = [text.get_text() for text in axis.texts]
    assert any("not reached" in text for text in texts)
    assert_every_point_is_on_its_axes(figure)


def test_one_run_has_three_panels_and_names_itself() -> None:
    figure = draw_runs({"dpsgd": run("dpsgd", 0.1, rounds=30)}, title="exp")
    assert len(figure.axes) == 3
    assert figure.get_suptitle() == "exp — dpsgd, 30 rounds"


def test_diverged_accuracies_are_left_out_and_named() -> None:
    records = run("mean", 0.1)
    records[-1] = record("mean", 40, time=4.0, bytes_total=4e7, test_accuracy=math.nan,
                         consensus_distance=math.nan)  # fmt: skip
    figure = draw_runs({"mean": records, "median": run("median", 0.1)})
    assert any("accuracy not finite at 1 of 5" in text for text in legend_text(figure))
    assert_every_point_is_on_its_axes(figure)


def test_bad_runs_are_refused_naming_the_argument() -> None:
    with pytest.raises(FigureError, match="runs"):
        draw_runs({})
    with pytest.raises(FigureError, match="empty: b"):
        draw_runs({"a": run("a", 1.0), "b": []})
    with pytest.raises(FigureError, match="target_fraction"):
        draw_runs({"a": run("a", 1.0)}, target_fraction=1.5)


def test_plot_writes_the_figure(tmp_path: Path) -> None:
    out = plot(latency_bound(), tmp_path / "runs.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- heatmaps and labels -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["viridis", "RdYlGn", "magma", "coolwarm", "Greys"])
def test_heatmap_text_reads_on_every_colour_of_the_scale(name: str) -> None:
    palette = matplotlib.colormaps[name]
    for i in range(palette.N):
        colour = palette(i)
        chosen = (0.0, 0.0, 0.0) if text_colour(colour) == "black" else (1.0, 1.0, 1.0)
        assert contrast_ratio(colour, chosen) >= 4.5  # WCAG AA for normal text


def test_heatmap_writes_every_number_and_greys_out_missing_cells() -> None:
    from matplotlib.figure import Figure

    figure = Figure(layout="constrained")
    axis = figure.subplots()
    values = [[0.1, 0.37, math.nan], [0.25, 0.05, 0.33]]
    image = heatmap(
        axis, values, ["mean", "median"], ["none", "sign-flip", "dissensus"],
        vmin=0.1, vmax=0.37, missing="diverged",
    )  # fmt: skip
    texts = sorted(text.get_text() for text in axis.texts)
    assert texts == sorted(["0.10", "0.37", "diverged", "0.25", "0.05", "0.33"])
    data = image.get_array()
    assert data is not None and bool(data.mask[0, 2]) and not bool(data.mask[0, 0])
    assert heatmap_extend(values, 0.1, 0.37) == "min"  # 0.05 lies below the scale
    assert heatmap_extend(values, 0.0, 1.0) == "neither"
    with pytest.raises(FigureError, match="values"):
        heatmap(axis, values, ["one row"], ["a", "b", "c"], vmin=0.0, vmax=1.0)
    with pytest.raises(FigureError, match="vmin"):
        heatmap(axis, values, ["a", "b"], ["a", "b", "c"], vmin=1.0, vmax=1.0)


def boxes_overlap(first: Any, second: Any) -> bool:
    return min(first.x1, second.x1) > max(first.x0, second.x0) and min(first.y1, second.y1) > max(
        first.y0, second.y0
    )


def test_point_labels_neither_collide_nor_leave_the_axes() -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 4), layout="constrained")
    axis = figure.subplots()
    # the topology notebook's case: torus and random-regular-4 have almost the same gap
    xs: Sequence[float] = [0.003, 0.037, 0.103, 0.117, 0.29, 0.33, 1.0, 1.0]
    ys: Sequence[float] = [1611, 131, 45, 45, 18, 13, 6, 1]
    names = ["ring", "small-world", "random-regular-4", "torus", "hypercube", "exponential",
             "one-peer-exponential", "complete"]  # fmt: skip
    axis.scatter(xs, ys)
    axis.set(xscale="log", yscale="log")
    figure.draw_without_rendering()
    notes = label_points(axis, xs, ys, names)
    assert [note.get_text() for note in notes] == names
    renderer = figure.canvas.get_renderer()
    boxes = [note.get_window_extent(renderer) for note in notes]
    frame = axis.get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, names[i]
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, names[i]
        for j in range(i):
            assert not boxes_overlap(box, boxes[j]), (names[i], names[j])
    with pytest.raises(FigureError, match="same length"):
        label_points(axis, xs, ys, names[:-1])


@settings(deadline=None, max_examples=25)
@given(st.integers(min_value=1, max_value=6))
def test_a_heatmap_of_any_size_has_one_text_per_cell(size: int) -> None:
    from matplotlib.figure import Figure

    figure = Figure()
    axis = figure.subplots()
    values = [[(i + j) / (2 * size) for j in range(size)] for i in range(size)]
    names = [f"c{i}" for i in range(size)]
    heatmap(axis, values, names, names, vmin=0.0, vmax=1.0)
    assert len(axis.texts) == size * size
