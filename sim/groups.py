"""Named groups of peers, and what an experiment file says through them.

A ``[groups]`` table names sets of peers once; partitions (``workload.label_sets``), the
choice of Byzantine peers (``byzantine.groups``) and the per-group metrics
(:mod:`sim.group_metrics`) refer to them by name::

    [groups]
    clique1 = [0, 1, 2, 3, 4]      # a list of ids and ranges: [0, "2-4", 9]
    clique2 = "5-9"                # or one string: "5-9", "0-2+7", "1, 3, 5-6"

Members use the id-set grammar of ``workloads.partition.parse_id_set``. A name is a letter
or ``_`` followed by letters, digits, ``_`` or ``-`` (it becomes part of metric column names,
``group/clique1/accuracy``). Groups may overlap; a group may not be empty. Every function here
raises ``ValueError`` whose message starts with the field (``groups.clique1``,
``workload.label_sets.clique2``) and says what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from workloads.partition import parse_id_set

__all__ = [
    "GROUP_NAME",
    "group_classes",
    "members_of",
    "parse_groups",
    "peer_label_sets",
]

#: What a group name may look like.
GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _ids(value: Any, where: str, peers: int) -> tuple[int, ...]:
    """Peer ids of ``value`` (id-set grammar), each in ``0 .. peers-1``."""
    try:
        ids = parse_id_set(value, where)
    except ValueError as error:
        raise ValueError(str(error)) from None
    if ids[-1] >= peers:
        raise ValueError(f"{where}: peer {ids[-1]} is outside 0..{peers - 1} (workload.peers)")
    return ids


def parse_groups(table: Mapping[str, Any], peers: int) -> dict[str, tuple[int, ...]]:
    """The ``[groups]`` table as ``name -> ascending peer ids``, checked against ``peers``."""
    if not isinstance(table, Mapping):
        raise ValueError(
            f"groups: must be a table of name = peer ids ([groups] clique1 = [0, 1, 2]), "
            f"got {table!r}"
        )
    groups: dict[str, tuple[int, ...]] = {}
    for name, value in table.items():
        if not isinstance(name, str) or GROUP_NAME.fullmatch(name) is None:
            raise ValueError(
                f"groups.{name}: a group name is a letter or '_' followed by letters, digits, "
                "'_' or '-'"
            )
        groups[name] = _ids(value, f"groups.{name}", peers)
    return groups


def members_of(
    names: Sequence[str], groups: Mapping[str, tuple[int, ...]], where: str
) -> tuple[int, ...]:
    """The union of the named groups' members; an unknown name lists the known ones."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValueError(f"{where}: must be a list of group names, got {names!r}")
    members: set[int] = set()
    for name in names:
        if name not in groups:
            known = ", ".join(groups) or "none (the experiment has no [groups] table)"
            raise ValueError(f"{where}: unknown group {name!r}; allowed: {known}")
        members.update(groups[name])
    return tuple(sorted(members))


def peer_label_sets(
    table: Mapping[str, Any], groups: Mapping[str, tuple[int, ...]], peers: int
) -> list[tuple[int, ...]]:
    """Each peer's label set from ``workload.label_sets``: keys are group names or peer ids.

    ``{clique1 = "0-4", clique2 = "5-9"}`` gives every member of clique1 the classes 0-4;
    a key that is a number (``"3" = [1, 2]``) is one peer. Every peer must be given exactly
    one set (a peer in two keyed groups, or in none, is an error naming it).
    """
    if not isinstance(table, Mapping) or not table:
        raise ValueError(
            "workload.label_sets: must be a non-empty table of group name (or peer id) = "
            'labels, e.g. {clique1 = "0-4", clique2 = "5-9"}'
        )
    owner: dict[int, str] = {}
    sets: dict[int, tuple[int, ...]] = {}
    for key, value in table.items():
        where = f"workload.label_sets.{key}"
        if isinstance(key, str) and key in groups:
            members = groups[key]
        elif isinstance(key, str) and key.strip().isdigit():
            members = _ids(int(key), where, peers)
        else:
            known = "".join(f"{group}, " for group in groups)
            raise ValueError(
                f"{where}: got {key!r}, neither a group name nor a peer id; "
                f"allowed: {known}0..{peers - 1}"
            )
        labels = parse_id_set(value, where)
        for peer in members:
            if peer in owner:
                raise ValueError(
                    f"{where}: peer {peer} already takes its labels from "
                    f"workload.label_sets.{owner[peer]}; give every peer one set"
                )
            owner[peer] = str(key)
            sets[peer] = labels
    missing = [peer for peer in range(peers) if peer not in sets]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise ValueError(
            f"workload.label_sets: peers {shown} are given no label set; every peer needs one "
            "(name a group that holds them, or their ids)"
        )
    return [sets[peer] for peer in range(peers)]


def group_classes(
    groups: Mapping[str, tuple[int, ...]], peer_labels: Sequence[tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """Each group's class set: the union of its members' label sets."""
    return {
        name: tuple(sorted({label for peer in members for label in peer_labels[peer]}))
        for name, members in groups.items()
    }
