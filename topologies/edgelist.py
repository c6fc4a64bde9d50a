"""A user's graph from a list of edges: an edge-list file or pairs given inline.

The edge-list file format (whitespace- or comma-separated, one edge per line)::

    # 5 honest nodes on a ring, each with two Byzantine neighbours
    0 1
    1 2
    0, 5          # a comma works too; '#' starts a comment
    ...

Each line holds two node ids ``u v``: an undirected edge ``u ~ v``, or, for a directed graph,
``u -> v`` ("u sends to v", the convention of every builder in :mod:`topologies.graphs`).
Blank lines and comments are skipped. Node ids are the integers ``0 .. n-1``; the graph has
exactly ``n`` nodes, so a node that no edge names is still there (and then disconnected, which
:func:`graph_from_edges` refuses).

:func:`read_edge_list` only parses (errors name the file and line); :func:`graph_from_edges`
checks the edges against ``n`` (ids in range, no self-loop, no edge listed twice, ``u v`` and
``v u`` being the same undirected edge) and the result with
:func:`topologies.graphs.from_graph` (connected; strongly connected when directed).

>>> graph = graph_from_edges(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
>>> sorted(graph.edges())
[(0, 1), (0, 3), (1, 2), (2, 3)]
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import networkx as nx
import numpy as np

from topologies.errors import TopologyError
from topologies.graphs import _from_edges, from_graph

__all__ = ["graph_from_edges", "parse_edge_list", "read_edge_list"]

_SEPARATOR = re.compile(r"[\s,]+")


def parse_edge_list(text: str, *, source: str = "edge list") -> np.ndarray:
    """The ``[m, 2]`` int64 array of the edges in ``text`` (the file format above).

    Raises :class:`TopologyError` (parameter ``"file"``) naming ``source`` and the line for a
    line that is not two non-negative integers, and for a text without any edge.
    """
    pairs: list[tuple[int, int]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        items = [item for item in _SEPARATOR.split(body) if item]
        if len(items) != 2 or not all(item.isdigit() for item in items):
            raise TopologyError(
                "file",
                f"{source}, line {number}: expected two node ids 'u v' (non-negative "
                f"integers), got {body!r}",
            )
        pairs.append((int(items[0]), int(items[1])))
    if not pairs:
        raise TopologyError("file", f"{source}: no edges (one 'u v' pair per line)")
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)


def read_edge_list(path: str | Path) -> np.ndarray:
    """Parse the edge-list file at ``path`` (see :func:`parse_edge_list`)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyError("file", f"no such edge-list file {str(file)!r}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TopologyError("file", f"cannot read edge-list file {str(file)!r}: {error}") from None
    return parse_edge_list(text, source=str(file))


def _as_array(edges: Iterable[Sequence[object]] | np.ndarray) -> np.ndarray:
    """``edges`` as an ``[m, 2]`` int64 array; TopologyError naming the first bad pair."""
    rows: list[tuple[int, int]] = []
    for position, pair in enumerate(edges):
        try:
            if isinstance(pair, str | bytes) or not isinstance(pair, Sequence | np.ndarray):
                raise TypeError
            if len(pair) != 2 or any(isinstance(item, bool) for item in pair):
                raise TypeError
            u, v = (operator.index(item) for item in pair)  # type: ignore[arg-type]
        except TypeError:
            raise TopologyError(
                "edges", f"edge {position} must be a pair of node ids [u, v], got {pair!r}"
            ) from None
        rows.append((u, v))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def _size_then_first(part: set[int]) -> tuple[int, int]:
    return len(part), min(part)


def graph_from_edges(
    n: int, edges: Iterable[Sequence[object]] | np.ndarray, *, directed: bool = False
) -> nx.Graph:
    """The graph on nodes ``0 .. n-1`` with these edges, checked.

    Args:
        n: the number of nodes (>= 2).
        edges: pairs ``(u, v)``: ``u ~ v`` undirected, ``u -> v`` ("u sends to v") directed.
        directed: build a :class:`networkx.DiGraph`.

    Raises :class:`TopologyError` (parameter ``"edges"``) naming the first offending edge for:
    a node id outside ``0 .. n-1``, a self-loop (self weights are implicit), an edge listed
    twice (for an undirected graph ``v u`` repeats ``u v``), no edge at all; and, from
    :func:`~topologies.graphs.from_graph`, a graph that is not connected (strongly connected
    when directed), with the number of components.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 2:
        raise TopologyError("n", f"a graph needs n >= 2 nodes, got n={n!r}")
    count = int(n)
    pairs = _as_array(edges) if not isinstance(edges, np.ndarray) else edges.astype(np.int64)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise TopologyError("edges", f"edges must have shape [m, 2], got {list(pairs.shape)}")
    if pairs.shape[0] == 0:
        raise TopologyError("edges", "the graph has no edges")
    outside = np.flatnonzero(((pairs < 0) | (pairs >= count)).any(axis=1))
    if outside.size:
        u, v = pairs[outside[0]].tolist()
        raise TopologyError(
            "edges",
            f"edge {int(outside[0])} ({u}, {v}) names a node outside 0..{count - 1} "
            f"({outside.size} such edge(s))",
        )
    loops = np.flatnonzero(pairs[:, 0] == pairs[:, 1])
    if loops.size:
        node = int(pairs[loops[0], 0])
        raise TopologyError(
            "edges",
            f"edge {int(loops[0])} ({node}, {node}) is a self-loop; self weights are implicit, "
            "remove it",
        )
    key = pairs if directed else np.sort(pairs, axis=1)
    _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
    if (counts > 1).any():
        repeated = key[first[counts > 1][0]]
        copies = np.flatnonzero((key == repeated).all(axis=1))
        u, v = pairs[copies[1]].tolist()
        kind = "directed edge" if directed else "edge"
        raise TopologyError(
            "edges",
            f"edge {int(copies[1])} ({u}, {v}) repeats {kind} {int(copies[0])} "
            f"({', '.join(map(str, pairs[copies[0]].tolist()))}); list each {kind} once",
        )
    graph = _from_edges(count, pairs, directed=directed)
    parts: list[set[int]] = [
        set(part)
        for part in (
            nx.strongly_connected_components(graph) if directed else nx.connected_components(graph)
        )
    ]
    if len(parts) > 1:
        smallest = min(parts, key=_size_then_first)
        cut = sorted(smallest)
        shown = ", ".join(map(str, cut[:10])) + (", ..." if len(cut) > 10 else "")
        kind = "strongly connected" if directed else "connected"
        raise TopologyError(
            "edges",
            f"the graph is not {kind}: it has {len(parts)} components, e.g. nodes [{shown}] "
            "are cut off from the rest; every node must be able to reach every other",
        )
    return from_graph(graph)
