"""Attacks 6 and 7: SIGKILL a quarter of a live swarm, and SIGKILL a peer while it checkpoints.

:func:`kill_quarter` starts ``peers`` real peers of a secret swarm (``peer-0`` the bootstrap,
the others join it) that train ``steps`` steps with checkpoints, SIGKILLs a quarter of them
(the bootstrap among them) once every peer is past 30 % of its steps, and restarts each
killed peer with its own command plus ``--resume``. Judged: every survivor finishes its
steps; every restarted peer resumes from a checkpoint (``resumed from ... at step N``, N > 0),
rejoins (its view has a live member, a survivor lists it alive, and it completes exchanges
again) and finishes its steps; no peer exits on its own.

:func:`checkpoint_kills` runs one peer that checkpoints every step and SIGKILLs it at
random moments, ``kills`` times, restarting it with ``--resume`` each time. After every kill
every checkpoint file must load and verify; every restart must resume from the newest one
that does and must remove the temporary files a killed write left behind.
"""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import aiohttp

from peer.node.checkpoint import CheckpointError, list_checkpoints, load_checkpoint

from .probes import Probe, ProbeError
from .processes import PeerExited, PeerGroup, PeerProcess
from .table import Row

CHECKPOINT_NAME = re.compile(r"checkpoint-\d{12}\.safetensors")


async def _statuses(probes: dict[str, Probe], group: PeerGroup) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for peer in group.peers:
        if not peer.alive:
            continue
        try:
            found[peer.peer_id] = await probes[peer.peer_id].status()
        except ProbeError:
            continue
    return found


async def kill_quarter(
    attack: str,
    directory: Path,
    *,
    peers: int,
    steps: int,
    secret: bytes,
    seed: int,
    checkpoint_every: int = 25,
    deadline_s: float = 400.0,
) -> Row:
    """Kill ``peers // 4`` peers of a live swarm mid-run and restart them with ``--resume``."""
    row = Row(attack)
    (directory / "secret").write_bytes(secret)
    victims_count = max(1, peers // 4)
    rng = random.Random(seed)
    victims = ["peer-0", *rng.sample([f"peer-{i}" for i in range(1, peers)], victims_count - 1)]
    with PeerGroup(directory) as group:
        first: PeerProcess | None = None
        for index in range(peers):
            flags = [
                "--steps", str(steps), "--hold", "--peers", str(peers),
                "--peer-index", str(index), "--secret-file", str(directory / "secret"),
                "--checkpoint-dir", str(directory / f"peer-{index}.checkpoints"),
                "--checkpoint-every", str(checkpoint_every), "--status-every", "50",
                "--request-timeout-s", "3", "--wait-for-peers", str(peers - 1),
                "--seed", str(seed),
            ]  # fmt: skip
            if first is not None:
                flags += ["--join", first.address]
            peer = group.add(f"peer-{index}", flags)
            if first is None:
                first = peer
                await peer.wait_listening()
        await group.wait_all()
        by_id = {p.peer_id: p for p in group.peers}
        async with aiohttp.ClientSession() as session:
            probes = {p.peer_id: Probe(session, p.address, p.peer_id, secret) for p in group.peers}
            loop = asyncio.get_running_loop()
            end = loop.time() + deadline_s
            killed_at: dict[str, int] = {}
            while loop.time() < end:
                statuses = await _statuses(probes, group)
                if (
                    len(statuses) == peers
                    and min(s["step"] for s in statuses.values()) >= steps * 0.3
                ):
                    killed_at = {v: int(statuses[v]["step"]) for v in victims}
                    break
                await asyncio.sleep(0.2)
            row.fail_if(not killed_at, "the swarm never reached 30 % of its steps")
            for victim in killed_at:
                by_id[victim].kill()
            row.requests = len(killed_at)
            await asyncio.sleep(2.0)
            restarted: list[str] = []
            for victim in killed_at:  # the bootstrap first: the others --join it
                by_id[victim].start(["--resume"])
                try:
                    await by_id[victim].wait_listening()
                    restarted.append(victim)
                except PeerExited as error:
                    row.failures.append(f"{victim} did not restart: {error}")
            targets = {p.peer_id: steps for p in group.peers}
            for victim in killed_at:
                resumed = by_id[victim].resumed_steps()
                targets[victim] = (resumed[-1] if resumed else 0) + steps
                if victim not in restarted:
                    del targets[victim]
            rejoined: dict[str, set[str]] = {victim: set() for victim in killed_at}
            ok_at_restart: dict[str, int] = {}
            done: dict[str, int] = {}
            while loop.time() < end:
                statuses = await _statuses(probes, group)
                for victim in killed_at:
                    status = statuses.get(victim)
                    if status is None:
                        continue
                    ok = int(status.get("exchanges", {}).get("ok", 0))
                    ok_at_restart.setdefault(victim, ok)
                    if any(m.get("status") == "alive" for m in status.get("neighbours", [])):
                        rejoined[victim].add("has a live member")
                    if ok > ok_at_restart[victim]:
                        rejoined[victim].add("exchanges again")
                    for other, other_status in statuses.items():
                        if other in killed_at:
                            continue
                        for member in other_status.get("neighbours", []):
                            if member.get("id") == victim and member.get("status") == "alive":
                                rejoined[victim].add("listed alive by a survivor")
                done = {pid: int(s["step"]) for pid, s in statuses.items()}
                if all(done.get(pid, -1) >= target for pid, target in targets.items()):
                    break
                if not any(p.alive for p in group.peers):
                    break
                await asyncio.sleep(0.5)
        row.crashes = group.crashes()
    row.check_common()
    survivors = [pid for pid in targets if pid not in killed_at]
    short = {pid: done.get(pid, -1) for pid in survivors if done.get(pid, -1) < targets[pid]}
    row.fail_if(bool(short), f"survivors short of {steps} steps: {short}")
    for victim in killed_at:
        resumed = by_id[victim].resumed_steps()
        row.fail_if(not resumed or resumed[-1] == 0, f"{victim} did not resume from a checkpoint")
        missing = {"has a live member", "exchanges again", "listed alive by a survivor"} - rejoined[
            victim
        ]
        row.fail_if(bool(missing), f"{victim} did not rejoin (no: {', '.join(sorted(missing))})")
        row.fail_if(
            victim in targets and done.get(victim, -1) < targets[victim],
            f"{victim} stopped at step {done.get(victim, -1)} of {targets.get(victim)}",
        )
        row.notes.append(
            f"{victim}: killed at step {killed_at[victim]}, resumed at "
            f"{resumed[-1] if resumed else 'none'}, rejoin signs: "
            f"{', '.join(sorted(rejoined[victim])) or 'none'}"
        )
    row.notes.append(f"final steps {dict(sorted(done.items()))}")
    return row


def _inspect(directory: Path) -> tuple[list[int], list[str], list[str]]:
    """(steps of the checkpoints that load, files that do not, stray temporary files)."""
    valid: list[int] = []
    corrupt: list[str] = []
    for path in list_checkpoints(directory):
        try:
            valid.append(load_checkpoint(path).step)
        except CheckpointError as error:
            corrupt.append(f"{path.name}: {error}")
        except FileNotFoundError:
            continue
    strays = (
        sorted(
            p.name
            for p in directory.iterdir()
            if p.is_file() and not CHECKPOINT_NAME.fullmatch(p.name)
        )
        if directory.is_dir()
        else []
    )
    return sorted(valid), corrupt, strays


async def checkpoint_kills(
    attack: str, directory: Path, *, kills: int, seed: int, max_delay_s: float = 1.5
) -> Row:
    """SIGKILL a peer that checkpoints every step ``kills`` times at random moments."""
    row = Row(attack)
    rng = random.Random(seed)
    checkpoints = directory / "checkpoints"
    corrupt_total: list[str] = []
    wrong_resume: list[str] = []
    strays_left: list[str] = []
    strays_made = 0
    with PeerGroup(directory) as group:
        flags = [
            "--steps", "0", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1",
            "--keep-checkpoints", "3", "--resume", "--seed", str(seed),
        ]  # fmt: skip
        peer = group.add("writer", flags, start=False)
        strays_before: list[str] = []
        newest: int | None = None
        for attempt in range(kills + 1):
            resumes_before = len(peer.resumed_steps())
            peer.start()
            await peer.wait_listening()
            await asyncio.sleep(0.3)  # the resume line follows the listening line
            resumed = peer.resumed_steps()[resumes_before:]
            if newest is not None:
                got = resumed[-1] if resumed else None
                if got != newest:
                    wrong_resume.append(
                        f"restart {attempt}: resumed at {got}, newest valid {newest}"
                    )
            _, _, strays_now = _inspect(checkpoints)
            strays_left += sorted(set(strays_before) & set(strays_now) - set(strays_left))
            if attempt == kills:
                break
            await asyncio.sleep(rng.uniform(0.2, max_delay_s))
            peer.kill()
            row.requests += 1
            valid, corrupt, strays_before = _inspect(checkpoints)
            strays_made += len(strays_before)
            corrupt_total += corrupt
            newest = valid[-1] if valid else None
        peer.stop()
        row.crashes = group.crashes()
    row.check_common()
    row.fail_if(
        bool(corrupt_total), f"{len(corrupt_total)} checkpoint(s) did not load: {corrupt_total[:3]}"
    )
    row.fail_if(
        bool(wrong_resume),
        f"{len(wrong_resume)} restart(s) did not resume from the newest: {wrong_resume[:3]}",
    )
    row.fail_if(
        bool(strays_left),
        f"{len(strays_left)} stale temporary file(s) still there after a restart: {strays_left[:3]}",
    )
    row.notes.append(
        f"{row.requests} kills; {strays_made} temporary files found right after the kills; "
        f"{len(strays_left)} of them survived the next start"
    )
    return row
