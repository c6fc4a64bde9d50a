"""Draw a topology to a PNG. matplotlib is imported inside :func:`draw` only (lazily), so the
rest of the package works on machines without the plotting stack."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import networkx as nx
import numpy as np


def _layout(graph: nx.Graph, layout: str, seed: int) -> np.ndarray:
    n = graph.number_of_nodes()
    if layout == "circular":
        angle = 2.0 * np.pi * np.arange(n) / n
        return np.stack([np.cos(angle), np.sin(angle)], axis=1)
    if layout == "spring":
        positions = nx.spring_layout(graph, seed=seed)
        return np.array([positions[i] for i in range(n)], dtype=np.float64)
    raise ValueError(f"layout={layout!r} is not one of: circular, spring")


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
    xy = _layout(graph, layout, seed)
    edges = np.asarray(list(graph.edges()), dtype=np.int64).reshape(-1, 2)
    figure = Figure(figsize=(6, 6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.add_collection(
        LineCollection(list(xy[edges]), colors="0.55", linewidths=0.6, alpha=0.8, zorder=1)
    )
    size = max(4.0, 120.0 / max(1.0, np.sqrt(graph.number_of_nodes())))
    axes.scatter(xy[:, 0], xy[:, 1], s=size * 4, c="tab:blue", zorder=2)
    if graph.number_of_nodes() <= 32:
        for node, (x, y) in enumerate(xy):
            axes.annotate(str(node), (x, y), ha="center", va="center", fontsize=7, color="white")
    axes.set_aspect("equal")
    axes.set_axis_off()
    if title:
        axes.set_title(title)
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
