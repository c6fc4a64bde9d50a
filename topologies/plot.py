"""Draw a topology to a PNG. matplotlib is imported inside :func:`draw` only (lazily), so the
rest of the package works on machines without the plotting stack.

Sizes follow the graph: a node's marker is 70 % of the typical distance between neighbouring
nodes (:func:`node_spacing`, :func:`node_diameter`), so a 1,000-node ring is a thin circle of
dots rather than a thick band and 12 nodes are not pin pricks; node numbers are written only
where they fit inside the marker; edges get thinner and fainter as they get more numerous, so
a dense graph does not turn into a grey disc."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import networkx as nx
import numpy as np


def node_positions(graph: nx.Graph, layout: str, seed: int) -> np.ndarray:
    """The nodes' positions ``[n, 2]``: evenly on the unit circle (``"circular"``, node i at
    angle 2 pi i / n) or networkx's spring layout drawn with ``seed`` (``"spring"``)."""
    n = graph.number_of_nodes()
    if layout == "circular":
        angle = 2.0 * np.pi * np.arange(n) / n
        return np.stack([np.cos(angle), np.sin(angle)], axis=1)
    if layout == "spring":
        positions = nx.spring_layout(graph, seed=seed)
        return np.array([positions[i] for i in range(n)], dtype=np.float64)
    raise ValueError(f"layout={layout!r} is not one of: circular, spring")


SMALLEST_NODE = 1.5
"""Diameter (points) under which a node is not drawn smaller, however many there are."""

LARGEST_NODE = 16.0
"""Diameter (points) over which a node is not drawn larger, however few there are."""


def node_spacing(xy: np.ndarray) -> float:
    """The typical distance between neighbouring nodes of the layout ``xy [n, 2]``, in data
    units: the median over nodes of the distance to the nearest other node (a k-d tree, so
    O(n log n); 1 for fewer than two nodes)."""
    from scipy.spatial import cKDTree

    if len(xy) < 2:
        return 1.0
    distances, _ = cKDTree(xy).query(xy, k=2)
    return float(np.median(distances[:, 1]))


def node_diameter(spacing: float, points_per_unit: float) -> float:
    """A node's marker diameter in points: 70 % of the spacing between neighbours (so markers
    do not merge into one blob), within [SMALLEST_NODE, LARGEST_NODE]."""
    return float(np.clip(0.7 * spacing * points_per_unit, SMALLEST_NODE, LARGEST_NODE))


def label_size(nodes: int, diameter: float) -> float | None:
    """The font size (points) at which the widest node number fits inside its marker, or
    None when that would be too small to read (under 5 points) or there are over 64 nodes."""
    if nodes > 64:
        return None
    digits = len(str(nodes - 1))
    size = min(8.0, 0.85 * diameter / (0.62 * digits))  # a digit is about 0.62 em wide
    return size if size >= 5.0 else None


def draw(
    graph: nx.Graph,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    layout: str = "circular",
    seed: int = 0,
) -> Path:
    """Draw ``graph`` (nodes on a circle, or a seeded spring layout) and write a PNG atomically:
    the image goes to a temporary file in the same directory, then replaces ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"directory {str(target.parent)!r} does not exist")
    xy = node_positions(graph, layout, seed)
    n = len(xy)
    edges = np.asarray(list(graph.edges()), dtype=np.int64).reshape(-1, 2)
    figure = Figure(figsize=(6, 6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    figure.subplots_adjust(left=0.04, right=0.96, bottom=0.04, top=0.92)
    extent = float(max(np.ptp(xy, axis=0).max(), 1e-9)) if n > 1 else 1.0
    points_per_unit = 0.92 * 6 * 72 / (1.1 * extent)  # the axes' width in points over the data's
    diameter = node_diameter(node_spacing(xy), points_per_unit)
    # thinner, fainter edges as they get more numerous, so dense graphs do not turn grey
    width = float(np.clip(diameter / 12.0, 0.2, 0.9))
    alpha = float(np.clip(8.0 / np.sqrt(max(len(edges), 1)), 0.08, 0.8))
    axes.add_collection(
        LineCollection(list(xy[edges]), colors="0.45", linewidths=width, alpha=alpha, zorder=1)
    )
    axes.scatter(xy[:, 0], xy[:, 1], s=diameter**2, c="tab:blue", linewidths=0, zorder=2)
    fontsize = label_size(n, diameter)
    if fontsize is not None:
        for node, (x, y) in enumerate(xy):
            axes.annotate(
                str(node), (x, y), ha="center", va="center", fontsize=fontsize, color="white"
            )
    low, high = xy.min(axis=0), xy.max(axis=0)
    middle, half = (low + high) / 2.0, 0.55 * extent
    axes.set_xlim(middle[0] - half, middle[0] + half)
    axes.set_ylim(middle[1] - half, middle[1] + half)
    axes.set_aspect("equal")
    axes.set_axis_off()
    if title:
        axes.set_title(title, fontsize=11)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            figure.savefig(stream, format="png")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
