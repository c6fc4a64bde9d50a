"""Explicit label sets: every peer holds only its classes, shares are even, the set grammar."""

from __future__ import annotations

import pytest
import torch

from workloads import partition
from workloads.partition import label_sets, label_sets_from_spec, parse_id_set

LABELS = torch.arange(1003) % 10  # classes 0-2 have 101 samples, the others 100


def _classes(labels: torch.Tensor, part: torch.Tensor) -> set[int]:
    return set(labels[part].tolist())


def test_each_peer_holds_exactly_its_classes_and_every_sample_one_owner() -> None:
    sets = [[0, 1, 2, 3, 4]] * 5 + [[5, 6, 7, 8, 9]] * 5
    parts = label_sets(LABELS, 10, sets, seed=3)
    assert [_classes(LABELS, part) for part in parts] == [set(s) for s in sets]
    every = torch.cat(parts)
    assert sorted(every.tolist()) == list(range(len(LABELS)))  # disjoint, covering
    assert all(bool((part[1:] > part[:-1]).all()) for part in parts)  # ascending
    # equal shares of each class among its holders (±1), and totals within ±1 too
    for c in range(10):
        counts = [int((LABELS[part] == c).sum()) for part, s in zip(parts, sets) if c in s]
        assert len(counts) == 5 and max(counts) - min(counts) <= 1
    sizes = [len(part) for part in parts]
    assert max(sizes[:5]) - min(sizes[:5]) <= 1 and max(sizes[5:]) - min(sizes[5:]) <= 1


def test_overlapping_sets_split_a_shared_class_among_its_holders() -> None:
    parts = label_sets(LABELS, 3, [[0, 1, 2, 3, 4, 5], [5, 6, 7, 8, 9], [9]], seed=0)
    assert _classes(LABELS, parts[2]) == {9}
    assert int((LABELS[parts[0]] == 5).sum()) == 50 and int((LABELS[parts[1]] == 5).sum()) == 50
    assert int((LABELS[parts[2]] == 9).sum()) == 50  # class 9: peers 1 and 2


def test_same_seed_same_partition_other_seed_other_samples() -> None:
    sets = [[0, 1], [0, 1], [2, 3, 4, 5, 6, 7, 8, 9]]
    first = label_sets(LABELS, 3, sets, seed=7)
    again = label_sets(LABELS, 3, sets, seed=7)
    other = label_sets(LABELS, 3, sets, seed=8)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    assert torch.equal(first[2], other[2])  # a class held by one peer goes to it whole


def test_the_spec_form_gives_blocks_of_peers_their_sets() -> None:
    assert label_sets_from_spec("0-4|5-9", 4) == [(0, 1, 2, 3, 4)] * 2 + [(5, 6, 7, 8, 9)] * 2
    assert label_sets_from_spec("0-9", 3) == [tuple(range(10))] * 3
    assert label_sets_from_spec("0|1|2", 3) == [(0,), (1,), (2,)]
    by_spec = partition("label-sets:sets=0-4|5-9", LABELS, 6, seed=2)
    direct = label_sets(LABELS, 6, label_sets_from_spec("0-4|5-9", 6), seed=2)
    assert all(torch.equal(a, b) for a, b in zip(by_spec, direct, strict=True))
    with pytest.raises(ValueError, match="sets gives 4 label sets for 3 peers"):
        label_sets_from_spec("0|1|2|3", 3)
    with pytest.raises(ValueError, match="parameter 'sets' is required"):
        partition("label-sets", LABELS, 2)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ([[0, 1, 2, 3, 4], [5, 6, 7, 8]], r"class 9 is held by no peer.*\[9\]"),
        ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 12]], r"label 12 is not a class of the training labels"),
        ([[], list(range(10))], "peer 0 holds no label"),
        ([list(range(10))], r"needs one label set per peer \(2\), got 1"),
    ],
)
def test_impossible_sets_are_refused_naming_the_class_or_peer(
    sets: list[list[int]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        label_sets(LABELS, 2, sets)


def test_a_class_with_fewer_samples_than_holders_is_refused() -> None:
    labels = torch.tensor([0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match="class 0 has 2 samples for 3 peers holding it"):
        label_sets(labels, 3, [[0, 1], [0, 1], [0, 1]])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, (3,)),
        ("0-4", (0, 1, 2, 3, 4)),
        ("0-2+7", (0, 1, 2, 7)),
        ("1, 3, 5-6", (1, 3, 5, 6)),
        ([9, "0-1", 1], (0, 1, 9)),
        ((4, 2), (2, 4)),
    ],
)
def test_the_id_set_grammar(value: object, expected: tuple[int, ...]) -> None:
    assert parse_id_set(value, "labels") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4-2", r"range '4-2' is empty"),
        ("a-b", r"'a-b' is not an id 'a' or a range 'a-b'"),
        ("-3", r"'-3' is not an id"),
        ([1.5], r"expected ids and ranges"),
        ([True], r"ids are non-negative integers, got True"),
        (-1, r"ids are non-negative integers, got -1"),
        ([], "the set is empty"),
        ("", "the set is empty"),
    ],
)
def test_bad_id_sets_name_the_field(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^labels: {message}"):
        parse_id_set(value, "labels")
