"""Stragglers and churn of a local swarm: ``launch --stragglers`` and ``launch --crashes``.

The real counterparts of the simulator's ``[network]`` models (:mod:`sim.network`):

* ``--stragglers PEER=FACTOR[,...]`` is ``stragglers = {PEER = FACTOR}``: those peers get
  ``gossipnet peer --slowdown FACTOR`` (each local step takes FACTOR times its compute,
  :mod:`peer.node.straggler`). PEER is an id or a range ``A-B``, as the simulator's keys.
* ``--crashes PEER@AT[+DOWN][,...]`` is ``crashes = [{peer, at, rejoin}]`` with
  ``rejoin = AT + DOWN`` (:class:`Crash`): the launcher SIGKILLs the peer AT seconds after
  the swarm starts training and, with +DOWN, has it back DOWN seconds later, from its
  newest checkpoint (its next process starts at the crash and waits, :func:`run_crashes`); a
  sync peer takes up its neighbours' round (:data:`REJOINS`, :func:`check_rejoin`). The
  results say who crashed and when it came back; a peer down at the end is left out of the
  means (:func:`annotate`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from peer.app.swarm import PeerProcess, Swarm, read_text


def _peers(text: str, peers: int, flag: str) -> tuple[int, ...]:
    """The ids ``"3"`` or ``"2-4"`` names, each in ``[0, peers)``."""
    first, dash, last = text.strip().partition("-")
    if not first.strip().isdigit() or (dash and not last.strip().isdigit()):
        raise ValueError(f"{flag}: a peer must be an id or a range A-B, got {text.strip()!r}")
    low = int(first)
    high = int(last) if dash else low
    if high < low:
        raise ValueError(f"{flag}: range {text.strip()} is empty; write it low-high")
    if high >= peers:
        raise ValueError(f"{flag}: peer {high} is outside 0..{peers - 1} (--peers {peers})")
    return tuple(range(low, high + 1))


def _number(text: str, flag: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: {what} must be a number, got {text.strip()!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag}: {what} must be finite, got {text.strip()!r}")
    return value


def parse_stragglers(text: str | None, peers: int) -> dict[int, float]:
    """``--stragglers PEER=FACTOR[,PEER=FACTOR...]`` as peer -> factor (empty for None); a
    ``ValueError`` starting ``--stragglers:`` for an id outside ``[0, peers)``, a peer given
    twice, or a factor that is not a finite number >= 1."""
    flag = "--stragglers"
    found: dict[int, float] = {}
    if text is None:
        return found
    for entry in text.split(","):
        key, equals, value = entry.partition("=")
        if not equals:
            raise ValueError(f"{flag}: each entry must be PEER=FACTOR (e.g. 3=3.0), got {entry!r}")
        factor = _number(value, flag, f"the factor of {key.strip()}")
        if factor < 1:
            raise ValueError(f"{flag}: the factor of {key.strip()} must be >= 1, got {factor:g}")
        for peer in _peers(key, peers, flag):
            if peer in found:
                raise ValueError(f"{flag}: peer {peer} is given twice; give it once")
            found[peer] = factor
    return found


@dataclass(frozen=True)
class Crash:
    """Peer ``peer`` is killed ``at`` seconds after the swarm starts training and back
    at ``rejoin`` (seconds after the same start; None: down to the end): the simulator's
    :class:`sim.network.Crash`, whose ``rejoin`` is absolute too (``--crashes P@AT+DOWN``
    is ``rejoin = AT + DOWN``)."""

    peer: int
    at: float
    rejoin: float | None = None


def parse_crashes(text: str | None, peers: int) -> tuple[Crash, ...]:
    """``--crashes PEER@AT[+DOWN][,...]`` as crashes in time order (empty for None); a
    ``ValueError`` starting ``--crashes:`` for an id outside ``[0, peers)``, a time that is
    not finite (AT >= 0, DOWN > 0), or two crashes of one peer that overlap (a peer must be
    back before it crashes again; one down to the end is its last)."""
    flag = "--crashes"
    if text is None:
        return ()
    crashes: list[Crash] = []
    for entry in text.split(","):
        who, at_sign, when = entry.partition("@")
        if not at_sign:
            raise ValueError(
                f"{flag}: each entry must be PEER@AT or PEER@AT+DOWN (seconds, e.g. 2@10+5), "
                f"got {entry.strip()!r}"
            )
        if not who.strip().isdigit():
            raise ValueError(f"{flag}: a peer must be an id, got {who.strip()!r}")
        peer = int(who)
        if peer >= peers:
            raise ValueError(f"{flag}: peer {peer} is outside 0..{peers - 1} (--peers {peers})")
        at_text, plus, down_text = when.partition("+")
        at = _number(at_text, flag, f"AT of peer {peer}")
        if at < 0:
            raise ValueError(f"{flag}: AT of peer {peer} must be >= 0 seconds, got {at:g}")
        rejoin = None
        if plus:
            down = _number(down_text, flag, f"DOWN of peer {peer}")
            if down <= 0:
                raise ValueError(f"{flag}: DOWN of peer {peer} must be > 0 seconds, got {down:g}")
            rejoin = at + down
        crashes.append(Crash(peer, at, rejoin))
    crashes.sort(key=lambda crash: (crash.at, crash.peer))
    back: dict[int, float | None] = {}
    for crash in crashes:
        if crash.peer in back:
            previous = back[crash.peer]
            if previous is None or crash.at <= previous:
                until = "the end" if previous is None else f"{previous:g} s"
                raise ValueError(
                    f"{flag}: peer {crash.peer} crashes at {crash.at:g} s while still down "
                    f"(until {until}); a peer must be back before it crashes again"
                )
        back[crash.peer] = crash.rejoin
    return tuple(crashes)


REJOINS = ("ad-psgd", "dpsgd", "local-sgd", "diloco", "noloco", "sparseloco")
"""The algorithms whose crashed peer may rejoin (``--crashes PEER@AT+DOWN``): AD-PSGD has
no rounds; a peer of the others takes up its neighbours' round when it is back, with the
model (and DiLoCo's slow weights) of its checkpoint (:mod:`peer.node.sync_round`,
"Catching up")."""

_NO_REJOIN = {
    "push-sum": "the mass it held dies with it (its checkpoint's is older), so the swarm's "
    "sum is no longer conserved",
    "choco": "its neighbours' public copies of it, and its of them, are not in its checkpoint",
}


def check_rejoin(algorithm: str | None, mode: str | None) -> None:
    """A ``ValueError`` starting ``--crashes:`` when a peer of ``algorithm`` (None: from
    ``mode``, as launch chooses it) cannot rejoin (:data:`REJOINS`)."""
    name = algorithm or ("dpsgd" if mode == "sync" else "ad-psgd")
    if name in REJOINS:
        return
    why = _NO_REJOIN.get(name, "it has no catch-up to its neighbours' round")
    raise ValueError(
        f"--crashes: +DOWN (a rejoin) needs {', '.join(REJOINS)}; a {name} peer cannot rejoin: "
        f"{why} (docs/time-model.md); give PEER@AT (down to the end)"
    )


def stragglers_flag(stragglers: Mapping[int, float]) -> str:
    """The ``--stragglers`` value of a simulator's ``stragglers`` (peer -> factor, ranges
    already expanded): ``{3: 3.0, 5: 2.0}`` -> ``"3=3.0,5=2.0"``."""
    return ",".join(f"{peer}={factor!r}" for peer, factor in sorted(stragglers.items()))


def crashes_flag(crashes: Iterable[Crash]) -> str:
    """The ``--crashes`` value of crashes with the simulator's absolute ``rejoin``:
    ``Crash(2, 10.0, 15.0)`` -> ``"2@10.0+5.0"``, ``Crash(3, 20.0)`` -> ``"3@20.0"``."""
    return ",".join(
        f"{crash.peer}@{crash.at!r}"
        + ("" if crash.rejoin is None else f"+{crash.rejoin - crash.at!r}")
        for crash in crashes
    )


async def _step_of(session: aiohttp.ClientSession, peer: PeerProcess) -> int | None:
    """The step ``peer`` reports in ``GET /v1/status`` now (None: no answer)."""
    address = peer.address or read_text(peer.address_file).strip() or None
    if address is None or peer.process.poll() is not None:
        return None
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
        async with session.get(f"http://{address}/v1/status") as response:
            if response.status == 200:
                step = (await response.json()).get("step")
                return step if isinstance(step, int) else None
    return None


async def _until(moment: float, stop: asyncio.Event) -> bool:
    """Wait until ``time.monotonic()`` reaches ``moment``; False if ``stop`` came first."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, moment - time.monotonic()))
    return not stop.is_set()


async def training_started(
    swarm: Swarm, stop: asyncio.Event, session: aiohttp.ClientSession
) -> float | None:
    """``time.monotonic()`` when the first peer reports a step (polled every 0.1 s, so
    within about 0.1 s of its first step): the swarm's time 0, the simulator's; None if
    ``stop`` is set first."""
    while not stop.is_set():
        steps = await asyncio.gather(*(_step_of(session, peer) for peer in swarm.peers))
        if any(step for step in steps):
            return time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    return None


async def run_crashes(
    swarm: Swarm, crashes: Sequence[Crash], stop: asyncio.Event, say: Callable[[str], None]
) -> None:
    """Carry out ``launch --crashes`` on a started swarm. From the moment it starts training
    (:func:`training_started`), SIGKILL each crash's peer at ``at`` (a crash: no goodbye, no
    checkpoint at stop). With a ``rejoin``, its next process is started at once with
    ``--start-at`` the rejoin time, so it does its start-up (Python, torch, the data: seconds)
    while down and is back at ``rejoin``: it then resumes from its newest checkpoint (it
    checkpoints every :func:`peer.app.swarm.crash_checkpoint_every` steps unless
    ``--checkpoint-every`` says otherwise), rejoins the members that checkpoint remembers
    (a sync peer in their current round, skipping the rounds it missed) and trains on to
    ``--steps`` in all; or, if it crashed before its first checkpoint, it starts
    afresh from the initial model (``--no-fetch-state``: the simulator's rejoining peer keeps
    its own model, never a neighbour's) with all its steps. Each crash is recorded on the
    peer (``PeerProcess.crashes``), in seconds since time 0: ``pid`` (the process killed),
    ``at``, ``back`` (the ``--start-at`` moment: ``rejoin``), ``rejoined`` (its first step
    after that: later than ``back`` by what is left of its start-up, if any) and
    ``from_step``. A crash whose peer already exited is recorded as
    ``skipped``."""
    timeout = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = await training_started(swarm, stop, session)
        if start is None:
            return
        watchers: list[asyncio.Task[None]] = []
        events = sorted(
            [(crash.at, 0, crash) for crash in crashes]
            + [(crash.rejoin, 1, crash) for crash in crashes if crash.rejoin is not None]
        )
        records: dict[Crash, dict[str, Any]] = {}
        try:
            for moment, kind, crash in events:
                peer = swarm.peers[crash.peer]
                if kind == 1 and crash not in records:
                    continue  # its crash was skipped
                if not await _until(start + moment, stop):
                    return
                now = round(time.monotonic() - start, 3)
                if kind == 1:  # its process, started at the crash, is back now
                    peer.down = peer.restart_pending = False
                    record = records[crash]
                    record["back"] = now
                    resumed = (
                        "afresh"
                        if record["from_step"] is None
                        else f"from its step {record['from_step']}"
                    )
                    if (record["from_step"] or 0) >= swarm.args.steps:  # crashed while finishing
                        resumed += (
                            f"; it had taken its {swarm.args.steps} steps, so it takes one more "
                            "(a peer's --steps counts the steps to take), then finishes"
                        )
                    say(f"{peer.peer_id} back at {now:.1f} s, {resumed} (--crashes)")
                    watchers.append(asyncio.create_task(_rejoined(session, peer, record, start)))
                    continue
                if peer.process.poll() is not None:
                    peer.crashes.append({"planned_at": crash.at, "skipped": "had exited"})
                    continue
                pid = peer.process.pid
                peer.process.kill()  # SIGKILL
                await asyncio.to_thread(peer.process.wait)
                peer.down = True
                peer.restart_pending = crash.rejoin is not None
                records[crash] = {"planned_at": crash.at, "at": now, "pid": pid}
                records[crash].update(back=None, rejoined=None, from_step=None)
                peer.crashes.append(records[crash])
                say(f"{peer.peer_id} crashed (SIGKILL) at {now:.1f} s (--crashes)")
                if crash.rejoin is None:
                    continue
                from_step = await asyncio.to_thread(_checkpoint_step, swarm, peer)
                args = argparse.Namespace(**vars(swarm.args))
                args.resumed = None if from_step is None else {peer.index: from_step}
                back = time.time() + (start + crash.rejoin - time.monotonic())
                more = ["--start-at", repr(back), "--wait-for-peers", "0"]  # it joins at start
                if from_step is None:
                    more.append("--no-fetch-state")
                swarm.respawn(peer, args, more)
                records[crash]["from_step"] = from_step
            await asyncio.gather(*watchers)
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)


async def _rejoined(
    session: aiohttp.ClientSession, peer: PeerProcess, record: dict[str, Any], start: float
) -> None:
    """Record when the restarted ``peer`` first reports a step past its checkpoint's."""
    while peer.process.poll() is None:
        step = await _step_of(session, peer)
        if step is not None and step > (record["from_step"] or 0):
            record["rejoined"] = round(time.monotonic() - start, 3)
            return
        await asyncio.sleep(0.1)


def _checkpoint_step(swarm: Swarm, peer: PeerProcess) -> int | None:
    """The step of ``peer``'s newest valid checkpoint in the run directory (None: none)."""
    from peer.node.checkpoint import CheckpointError, load_latest

    try:
        checkpoint = load_latest(swarm.directory / f"{peer.peer_id}.checkpoints")
    except CheckpointError:
        return None
    return None if checkpoint is None else checkpoint.step


def annotate(results: dict[str, Any], swarm: Swarm) -> list[str]:
    """Add each straggler's ``slowdown``, every peer's ``compute_s`` and
    ``slowdown_waited_s`` as last polled, and each crashed peer's ``crashes`` to its entry of
    ``results`` (the ``--json`` line) and ``down: true`` to a peer down at the end, whose
    missing evaluation leaves it out of the means; returns one line per crashed peer for the
    summary."""
    slowdowns: dict[int, float] = getattr(swarm.args, "slowdowns", {})
    lines = []
    for peer, entry in zip(swarm.peers, results["peers"], strict=True):
        if peer.index in slowdowns:
            entry["slowdown"] = slowdowns[peer.index]
        for key in ("compute_s", "slowdown_waited_s"):  # as last polled (/v1/status)
            if key in peer.status:
                entry[key] = peer.status[key]
        if not peer.crashes:
            continue
        entry["crashes"] = peer.crashes
        parts = []
        for record in peer.crashes:
            if "skipped" in record:
                parts.append(f"its crash at {record['planned_at']:g} s skipped (it had exited)")
                continue
            part = f"crashed at {record['at']:.1f} s"
            if record["back"] is not None:
                start = (
                    "afresh"
                    if record.get("from_step") is None
                    else f"from its step {record['from_step']}"
                )
                part += f", back at {record['back']:.1f} s {start}"
                if record["rejoined"] is not None:
                    part += f", training again at {record['rejoined']:.1f} s"
            parts.append(part)
        line = f"{peer.peer_id} " + "; ".join(parts)
        if peer.down:
            entry["down"] = True
            line += "; down at the end: left out of the means"
        lines.append(line)
    return lines
