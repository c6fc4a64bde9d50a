"""The reliability suite's quick subset (``make test``): real peers, real attacks, small doses.

A few hundred hostile requests against a live peer with its model digest and membership
checked, forged and replayed signed requests (one replayed to another peer of the swarm),
a hostile neighbour beside one real peer of an open swarm, and one small slow-body flood.
``make chaos`` runs every attack at full strength (``tests/chaos/run.py``,
docs/reliability.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from .flood import slow_body_flood
from .fuzz import fuzz_peer
from .neighbour import hostile_neighbour
from .processes import PeerGroup, PeerProcess
from .replay import forged_and_replayed
from .table import Row

pytestmark = pytest.mark.timeout(180)

SECRET = b"chaos-quick-swarm-secret-0123456789"
HOLD = ["--steps", "1", "--hold"]


def explain(row: Row) -> str:
    return "\n".join([*row.failures, *row.notes])


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PeerProcess]]:
    """Two peers that share a secret and do not train (``--steps 1 --hold``): their models
    change only through exchanges they accept."""
    directory: Path = tmp_path_factory.mktemp("chaos-quick")
    secret_file = directory / "secret"
    secret_file.write_bytes(SECRET)
    with PeerGroup(directory) as group:
        first = group.add("first", [*HOLD, "--secret-file", str(secret_file)])
        second = group.add("second", [*HOLD, "--secret-file", str(secret_file)])
        asyncio.run(group.wait_all())
        yield {"first": first, "second": second}


@pytest.mark.slow
def test_hostile_forged_replayed_and_slow_requests_change_nothing(
    peers: dict[str, PeerProcess],
) -> None:
    """Three attacks against the same two peer processes, in one test (with ``--dist load``
    tests sharing the module's peers would each start them on their own worker): hostile
    requests, forged and replayed signed ones, and slow bodies that must not starve signed
    exchanges."""
    fuzzed = asyncio.run(
        fuzz_peer(
            "quick fuzz",
            peers["first"],
            peer_id="first",
            secret=SECRET,
            requests=300,
            seed=11,
            training=False,
        )
    )
    assert fuzzed.requests == 300
    assert fuzzed.passed, explain(fuzzed)
    replayed = asyncio.run(
        forged_and_replayed(
            "quick replay",
            first=peers["first"],
            first_id="first",
            second=peers["second"],
            second_id="second",
            secret=SECRET,
            restart=False,
        )
    )
    assert any("(other peer)" in note for note in replayed.notes)
    assert replayed.passed, explain(replayed)
    flooded = asyncio.run(
        slow_body_flood(
            "quick flood",
            target=peers["second"],
            target_id="second",
            caller=None,
            caller_id=None,
            secret=SECRET,
            endpoint="exchange",
            connections=8,
            signature="forged",
            hold_s=3.0,
            rounds=1,
            seed=12,
            settle_s=5.0,
        )
    )
    assert flooded.requests == 8
    assert flooded.passed, explain(flooded)


@pytest.mark.slow
def test_hostile_neighbour_is_survived(tmp_path: Path) -> None:
    row = asyncio.run(
        hostile_neighbour(
            "quick hostile neighbour", tmp_path, peers=1, steps=1000, secret=None, seed=13
        )
    )
    assert row.requests > 0, "the real peers never called the hostile neighbour"
    assert row.passed, explain(row)
