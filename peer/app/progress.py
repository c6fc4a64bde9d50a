"""The progress of a running swarm: each peer's ``GET /v1/status``, as a table or as lines.

:func:`watch` polls every peer about twice a second (a peer that does not answer, or a
client-only peer, is read from the last status line it printed) until all have exited or
reached their steps, and draws either a live table (rich: step, loss, neighbours,
exchanges, bytes/s, state; an isolated peer in bold red) or a plain line every few seconds.
The state column tells the truth (:meth:`peer.app.swarm.PeerProcess.state`): ``starting`` until
a peer answers, ``waiting`` while it waits for the others, ``running``, ``finished`` once
it reached its steps, ``stopped`` after Ctrl-C, ``failed: REASON``. While the live table is
drawn, log lines go above it, never onto it (:func:`peer.app.logs.above_live`).

With a :class:`~peer.node.logbook.Logbook` (``launch --log-dir``: ``DIR/swarm/``), every poll
that sees a peer at a new step adds that peer's row (step, loss, bytes, exchanges) to the
swarm's record (:func:`record_progress`), written in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

import aiohttp

from peer.app.logs import above_live
from peer.app.status import human_bytes
from peer.app.swarm import PeerProcess, Swarm, holds, read_text
from peer.node.logbook import Logbook


async def _poll(session: aiohttp.ClientSession, peer: PeerProcess) -> None:
    if peer.address is None and not peer.client_only and peer.address_file.exists():
        peer.address = read_text(peer.address_file).strip() or None
    status: dict[str, Any] = {}
    if peer.address is not None and peer.process.poll() is None:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
            async with session.get(f"http://{peer.address}/v1/status") as response:
                if response.status == 200:
                    status = await response.json()
    if not status:
        status = peer.last_status_line()
    if not status:
        return
    total = float(status.get("bytes_in", 0)) + float(status.get("bytes_out", 0))
    now = time.monotonic()
    if peer.last_bytes is not None and now > peer.last_bytes[0]:
        peer.rate = max(0.0, (total - peer.last_bytes[1]) / (now - peer.last_bytes[0]))
    peer.last_bytes = (now, total)
    peer.status = status


def _finished(peer: PeerProcess, steps: int, holding: bool) -> bool:
    """Exited, or, for a holding peer (which waits for the launcher's SIGTERM), reached
    ``steps``. A peer that does not hold is done only when it exits: after its steps it
    still evaluates and writes its results, which on busy cores can take a while."""
    if peer.restart_pending:  # down, and launch --crashes will start it again
        return False
    if peer.process.poll() is not None:
        return True
    return holding and int(peer.status.get("step", 0)) >= steps


def _neighbours(status: dict[str, Any]) -> int:
    listed = status.get("neighbours", [])
    if listed and isinstance(listed[0], dict):
        return sum(1 for m in listed if m.get("status") in ("alive", "suspected"))
    return len(listed)


def status_row(peer: PeerProcess, steps: int | None = None) -> list[str]:
    """One peer's cells: id (marked client-only or ISOLATED), step, loss, live neighbours,
    exchanges ok and failed, bytes/s, and its state (:meth:`PeerProcess.state` against
    ``steps``, the steps each peer was asked for)."""
    status = peer.status
    loss = status.get("loss")
    exchanges = status.get("exchanges")
    if not isinstance(exchanges, dict):  # not polled yet, or a client-only peer's status line
        exchanges = {}
    return [
        peer.peer_id
        + (" (client-only)" if peer.client_only else "")
        + (" ISOLATED" if status.get("isolated") else ""),
        str(status.get("step", "-")),
        "-" if loss is None else f"{loss:.4f}",
        str(_neighbours(status)) if status else "-",
        str(exchanges.get("ok", "-")),
        str(exchanges.get("failed", "-")),
        human_bytes(peer.rate) + "/s",
        peer.state(steps),
    ]


def live_table(swarm: Swarm) -> Any:
    """The live table; an isolated peer (no successful exchange lately) is shown in bold red."""
    from rich.table import Table

    steps = swarm.args.steps
    table = Table(title=f"gossipnet swarm ({len(swarm.peers)} peers, {steps} steps each)")
    columns = ("peer", "step", "loss", "neighbours", "exchanges ok", "failed", "bytes/s", "state")
    for column in columns:
        table.add_column(column, justify="left" if column in ("peer", "state") else "right")
    for peer in swarm.peers:
        table.add_row(
            *status_row(peer, steps), style="bold red" if peer.status.get("isolated") else None
        )
    return table


def record_progress(logbook: Logbook, swarm: Swarm, recorded: dict[str, int]) -> None:
    """Add a row to the swarm's record for each peer whose polled step is new since its
    last row (``recorded``: peer id -> step, updated). Blocking: call it in a thread."""
    for peer in swarm.peers:
        step = peer.status.get("step")
        if isinstance(step, int) and recorded.get(peer.peer_id) != step:
            logbook.record_status(peer.status, peer=peer.peer_id)
            recorded[peer.peer_id] = step


async def watch(
    swarm: Swarm, mode: str, stop: asyncio.Event, logbook: Logbook | None = None
) -> None:
    """Poll every peer until all exited or ``stop`` is set; draw the progress (and record
    it in ``logbook``, :func:`record_progress`)."""
    recorded: dict[str, int] = {}

    async def poll_all() -> None:
        await asyncio.gather(*(_poll(session, p) for p in swarm.peers))
        if logbook is not None:
            await asyncio.to_thread(record_progress, logbook, swarm, recorded)

    timeout = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        with contextlib.ExitStack() as drawn:
            live = None
            if mode == "live":
                from rich.console import Console
                from rich.live import Live

                console = Console(stderr=True)
                live = Live(live_table(swarm), console=console, auto_refresh=False)
                live.start()
                drawn.callback(live.stop)
                drawn.enter_context(above_live(console))  # log lines go above the table
            last_line = time.monotonic()
            holding = holds(swarm.args)
            while (swarm.alive() or any(p.restart_pending for p in swarm.peers)) and not (
                stop.is_set()
            ):
                await poll_all()
                if all(_finished(p, swarm.args.steps, holding) for p in swarm.peers):
                    break
                if live is not None:
                    live.update(live_table(swarm), refresh=True)
                elif mode == "lines" and time.monotonic() - last_line >= 5.0:
                    last_line = time.monotonic()
                    parts = [
                        f"{row[0]} step {row[1]} loss {row[2]} {row[-1]}"
                        for row in (status_row(p, swarm.args.steps) for p in swarm.peers)
                    ]
                    print("progress: " + "; ".join(parts), file=sys.stderr, flush=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            await poll_all()
            if live is not None:
                live.update(live_table(swarm), refresh=True)
