"""``make chaos``: the reliability suite, every attack against real peers, and its table.

Run from the repository root::

    .venv/bin/python -m tests.chaos.run                 # everything (about 10 minutes)
    .venv/bin/python -m tests.chaos.run --only fuzz-open --only replay --requests 2000
    .venv/bin/python -m tests.chaos.run --list

Every attack starts its own ``gossipnet peer`` processes on 127.0.0.1 (their logs stay in
the work directory), attacks them, stops them, and adds rows to the table. The table is
printed (rich) and written as markdown (the path is printed); the exit code is 1 if any
verdict fails, 0 otherwise. Everything random is drawn from ``--seed``. docs/reliability.md
describes each attack.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from .flood import slow_body_flood
from .fuzz import fuzz_peer
from .kills import checkpoint_kills, kill_quarter
from .neighbour import hostile_neighbour
from .openapi_fuzz import openapi_fuzz
from .processes import PeerGroup
from .replay import forged_and_replayed
from .table import Row, print_table, write_markdown

SECRET = b"chaos-suite-swarm-secret-0123456789"
FLOOD_MODEL = "mlp:hidden=1024"
"""A model of about a million parameters (4 MiB): big enough that pinned bodies show."""


@dataclass
class Context:
    """The run's settings and its work directory (one subdirectory per attack)."""

    args: argparse.Namespace
    root: Path

    def directory(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def secret_file(self, directory: Path) -> str:
        path = directory / "secret"
        path.write_bytes(SECRET)
        return str(path)

    def seed(self, offset: int) -> int:
        return self.args.seed * 1000 + offset


HOLD = ["--steps", "1", "--hold"]
"""A peer that takes one step and then only serves: its model changes only by exchanges."""


async def _fuzz(ctx: Context, name: str, *, secret: bool, training: bool, offset: int) -> list[Row]:
    directory = ctx.directory(name)
    flags = ["--steps", "0"] if training else list(HOLD)
    if secret:
        flags += ["--secret-file", ctx.secret_file(directory)]
    with PeerGroup(directory) as group:
        peer = group.add("target", flags)
        await peer.wait_listening()
        what = "training" if training else ("secret" if secret else "open")
        row = await fuzz_peer(
            f"fuzz: {what} peer",
            peer,
            peer_id="target",
            secret=SECRET if secret else None,
            requests=ctx.args.requests,
            seed=ctx.seed(offset),
            training=training,
        )
    return [row]


async def fuzz_open(ctx: Context) -> list[Row]:
    """Hostile requests against an open peer that does not train (digest checked)."""
    return await _fuzz(ctx, "fuzz-open", secret=False, training=False, offset=1)


async def fuzz_secret(ctx: Context) -> list[Row]:
    """Hostile requests against a secret peer, most signed by a member (digest checked)."""
    return await _fuzz(ctx, "fuzz-secret", secret=True, training=False, offset=2)


async def fuzz_training(ctx: Context) -> list[Row]:
    """Hostile requests against an open peer while it trains (exchanges served checked)."""
    return await _fuzz(ctx, "fuzz-training", secret=False, training=True, offset=3)


async def openapi(ctx: Context) -> list[Row]:
    """Schemathesis over peer/openapi.yaml against a live secret peer."""
    directory = ctx.directory("openapi")
    with PeerGroup(directory) as group:
        peer = group.add("target", [*HOLD, "--secret-file", ctx.secret_file(directory)])
        await peer.wait_listening()
        row = await asyncio.to_thread(
            openapi_fuzz,
            "openapi: schemathesis over peer/openapi.yaml",
            peer,
            peer_id="target",
            secret=SECRET,
            examples=ctx.args.openapi_examples,
            seed=ctx.seed(4),
        )
    return [row]


async def neighbour_open(ctx: Context) -> list[Row]:
    """A fake peer answering garbage inside an open swarm of real peers."""
    return [
        await hostile_neighbour(
            "hostile neighbour: open swarm",
            ctx.directory("neighbour-open"),
            peers=ctx.args.neighbour_peers,
            steps=ctx.args.neighbour_steps,
            secret=None,
            seed=ctx.seed(5),
        )
    ]


async def neighbour_member(ctx: Context) -> list[Row]:
    """The same fake peer as a member of a secret swarm, its garbage signed."""
    return [
        await hostile_neighbour(
            "hostile neighbour: member of a secret swarm",
            ctx.directory("neighbour-member"),
            peers=ctx.args.neighbour_peers,
            steps=ctx.args.neighbour_steps,
            secret=SECRET,
            seed=ctx.seed(6),
        )
    ]


async def _flood(
    ctx: Context, name: str, title: str, *, endpoint: str, connections: int, signature: str
) -> list[Row]:
    directory = ctx.directory(name)
    flags = [
        "--steps", "0", "--model", FLOOD_MODEL, "--peers", "2", "--secret-file",
        ctx.secret_file(directory), "--request-timeout-s", "5", "--wait-for-peers", "1",
    ]  # fmt: skip
    with PeerGroup(directory) as group:
        target = group.add("target", [*flags, "--peer-index", "0"])
        await target.wait_listening()
        caller = group.add("caller", [*flags, "--peer-index", "1", "--join", target.address])
        await caller.wait_listening()
        await asyncio.sleep(2.0)  # both train and exchange: the quiet window starts warm
        row = await slow_body_flood(
            title,
            target=target,
            target_id="target",
            caller=caller,
            caller_id="caller",
            secret=SECRET,
            endpoint=endpoint,
            connections=connections,
            signature=signature,
            hold_s=ctx.args.flood_seconds,
            rounds=ctx.args.flood_rounds,
            seed=ctx.seed(7),
        )
    return [row]


async def flood_exchange_forged(ctx: Context) -> list[Row]:
    """8 slow exchange bodies with a forged signature while two peers exchange."""
    return await _flood(
        ctx,
        "flood-exchange-forged",
        "flood: 8 slow exchange bodies, forged signature",
        endpoint="exchange",
        connections=8,
        signature="forged",
    )


async def flood_exchange_unsigned(ctx: Context) -> list[Row]:
    """8 slow exchange bodies without a signature while two peers exchange."""
    return await _flood(
        ctx,
        "flood-exchange-unsigned",
        "flood: 8 slow exchange bodies, no signature",
        endpoint="exchange",
        connections=8,
        signature="none",
    )


async def flood_join(ctx: Context) -> list[Row]:
    """50 stalled /v1/join bodies (forged signature); memory back within 10 %."""
    return await _flood(
        ctx,
        "flood-join",
        "flood: 50 stalled /v1/join bodies",
        endpoint="join",
        connections=50,
        signature="forged",
    )


async def flood_peers(ctx: Context) -> list[Row]:
    """50 stalled /v1/peers bodies (forged signature); memory back within 10 %."""
    return await _flood(
        ctx,
        "flood-peers",
        "flood: 50 stalled /v1/peers bodies",
        endpoint="peers",
        connections=50,
        signature="forged",
    )


async def replay(ctx: Context) -> list[Row]:
    """Wrong-secret, replayed, replayed-to-another-peer and replayed-after-restart requests."""
    directory = ctx.directory("replay")
    secret_file = ctx.secret_file(directory)
    with PeerGroup(directory) as group:
        first = group.add("first", [*HOLD, "--secret-file", secret_file])
        await first.wait_listening()
        second = group.add("second", [*HOLD, "--secret-file", secret_file, "--join", first.address])
        await second.wait_listening()
        row = await forged_and_replayed(
            "forged and replayed requests",
            first=first,
            first_id="first",
            second=second,
            second_id="second",
            secret=SECRET,
        )
    return [row]


async def kill_swarm(ctx: Context) -> list[Row]:
    """SIGKILL a quarter of a live swarm; survivors finish, the killed resume and rejoin."""
    peers = ctx.args.swarm_peers
    return [
        await kill_quarter(
            f"SIGKILL {max(1, peers // 4)} of {peers} live peers, restart with --resume",
            ctx.directory("kill-quarter"),
            peers=peers,
            steps=ctx.args.swarm_steps,
            secret=SECRET,
            seed=ctx.seed(8),
        )
    ]


async def kill_checkpoints(ctx: Context) -> list[Row]:
    """SIGKILL a peer during checkpoint writes; every checkpoint loads, resume takes the newest."""
    return [
        await checkpoint_kills(
            f"SIGKILL during checkpoint writes (x{ctx.args.kills})",
            ctx.directory("checkpoint-kills"),
            kills=ctx.args.kills,
            seed=ctx.seed(9),
        )
    ]


ATTACKS: dict[str, Callable[[Context], Awaitable[list[Row]]]] = {
    "fuzz-open": fuzz_open,
    "fuzz-secret": fuzz_secret,
    "fuzz-training": fuzz_training,
    "openapi": openapi,
    "neighbour-open": neighbour_open,
    "neighbour-member": neighbour_member,
    "flood-exchange-forged": flood_exchange_forged,
    "flood-exchange-unsigned": flood_exchange_unsigned,
    "flood-join": flood_join,
    "flood-peers": flood_peers,
    "replay": replay,
    "kill-quarter": kill_swarm,
    "checkpoint-kills": kill_checkpoints,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.chaos.run",
        description="Attack real gossipnet peers on 127.0.0.1 and print the reliability table.",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--requests", type=int, default=10_000, help="hostile requests per fuzzed peer")
    p.add_argument("--openapi-examples", type=int, default=100, help="cases per operation and mode")
    p.add_argument(
        "--neighbour-peers", type=int, default=3, help="real peers beside the hostile one"
    )
    p.add_argument("--neighbour-steps", type=int, default=600, help="steps each of them trains")
    p.add_argument("--flood-seconds", type=float, default=6.0, help="how long each flood holds")
    p.add_argument("--flood-rounds", type=int, default=2, help="floods per flood attack")
    p.add_argument(
        "--swarm-peers", type=int, default=8, help="peers of the swarm a quarter of which is killed"
    )
    p.add_argument(
        "--swarm-steps", type=int, default=400, help="steps each peer of that swarm trains"
    )
    p.add_argument("--kills", type=int, default=12, help="SIGKILLs during checkpoint writes")
    p.add_argument(
        "--only", action="append", choices=sorted(ATTACKS), help="run only these (repeatable)"
    )
    p.add_argument("--list", action="store_true", help="list the attacks and exit")
    p.add_argument(
        "--workdir", help="where the peers' logs go (default: a new temporary directory)"
    )
    p.add_argument("--out", help="the markdown table's path (default: WORKDIR/chaos-report.md)")
    return p


def _positive(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    for name in ("requests", "openapi_examples", "neighbour_peers", "neighbour_steps", "flood_rounds", "swarm_peers", "swarm_steps", "kills"):  # fmt: skip
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.flood_seconds > 0:
        p.error(f"--flood-seconds must be > 0, got {args.flood_seconds}")


async def run(ctx: Context, names: list[str]) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        started = time.monotonic()
        print(f"chaos: {name} ...", flush=True)
        try:
            new = await ATTACKS[name](ctx)
        except Exception as error:  # a harness failure is a failing row, not a lost table
            row = Row(f"{name} (did not finish)")
            row.failures.append(f"{type(error).__name__}: {error}")
            row.notes.append(traceback.format_exc(limit=4).replace("\n", " | ")[-600:])
            new = [row]
        for row in new:
            print(
                f"chaos: {row.attack}: {'pass' if row.passed else 'FAIL'} "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        rows += new
    return rows


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.list:
        for name, attack in ATTACKS.items():
            print(f"{name:26} {(attack.__doc__ or '').strip()}")
        return 0
    _positive(args, p)
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gossipnet-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    names = args.only or list(ATTACKS)
    started = time.monotonic()
    rows = asyncio.run(run(Context(args, root), names))
    title = f"gossipnet reliability suite (seed {args.seed}, {time.monotonic() - started:.0f} s)"
    print_table(rows, title=title)
    out = write_markdown(
        Path(args.out) if args.out else root / "chaos-report.md", rows, title=title
    )
    print(f"table written to {out}; peer logs under {root}")
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
