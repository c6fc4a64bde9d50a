"""Drawing a topology: node markers sized from the layout's spacing (they do not merge into a
blob on large graphs, nor shrink to dots on small ones), numbers only where they fit."""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from topologies.plot import (
    LARGEST_NODE,
    SMALLEST_NODE,
    draw,
    label_size,
    node_diameter,
    node_positions,
    node_spacing,
)


@given(st.integers(min_value=2, max_value=3000))
def test_spacing_on_a_circle_is_the_chord_between_consecutive_nodes(n: int) -> None:
    xy = node_positions(nx.cycle_graph(n), "circular", seed=0)
    assert node_spacing(xy) == pytest.approx(2 * math.sin(math.pi / n), rel=1e-6)


@given(
    st.floats(min_value=1e-6, max_value=10.0),
    st.floats(min_value=1.0, max_value=1e4),
)
def test_markers_stay_apart_unless_at_the_smallest_size(spacing: float, scale: float) -> None:
    diameter = node_diameter(spacing, scale)
    assert SMALLEST_NODE <= diameter <= LARGEST_NODE
    if diameter > SMALLEST_NODE:
        assert diameter < spacing * scale  # a gap is left between neighbouring markers


@given(st.integers(min_value=2, max_value=200), st.floats(min_value=1.0, max_value=20.0))
def test_node_numbers_fit_inside_their_marker(nodes: int, diameter: float) -> None:
    size = label_size(nodes, diameter)
    if size is None:
        return
    assert nodes <= 64 and size >= 5.0
    widest = len(str(nodes - 1)) * 0.62 * size
    assert widest <= diameter


def test_spring_layout_spacing_is_the_median_nearest_neighbour_distance() -> None:
    xy = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [10.0, 10.0]])
    # nearest distances 1, 1, 2, ~12.8: the median is 1.5 whatever the outlier
    assert node_spacing(xy) == pytest.approx(1.5)
    assert node_spacing(xy[:1]) == 1.0


@pytest.mark.parametrize(
    ("graph", "layout"),
    [
        (nx.cycle_graph(1000), "circular"),
        (nx.random_regular_graph(4, 60, seed=0), "spring"),
        (nx.empty_graph(1), "circular"),
    ],
)
def test_draw_handles_large_small_and_single_node_graphs(
    graph: nx.Graph, layout: str, tmp_path: Path
) -> None:
    out = draw(graph, tmp_path / "g.png", title="t", layout=layout)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_layout_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="layout='grid' is not one of: circular, spring"):
        draw(nx.cycle_graph(4), tmp_path / "g.png", layout="grid")
