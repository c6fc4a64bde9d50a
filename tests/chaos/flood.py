"""Attack 4: slow bodies and connection floods against a peer that is exchanging with another.

Two real peers of a secret swarm train and exchange with each other (each is the other's
only neighbour, so every call of ``caller`` goes to ``target``). :func:`slow_body_flood`
measures a quiet window, then opens ``connections`` raw connections to ``target`` that send
the headers of a large body (a real envelope of the model's size for ``/v1/exchange``, so
a streaming parser keeps reading; a JSON body as large as two models for ``/v1/join`` and
``/v1/peers``), an ``Authorization`` header of the right form with a forged signature (or
none), and 90 % of the body, then stall for ``hold_s`` seconds; then it closes them and waits for the memory to come back.

Judged: the exchanges the two real peers make while the flood holds (``caller``'s
``gossipnet_exchanges_total`` by outcome: ok, busy (409), failed) against the quiet window,
the target's resident memory (the start is read after the first quiet window, so normal
warm-up is not counted as abuse; the peak; after the abuse), crashes, and its membership.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass

import aiohttp
import torch

from peer.protocol.codecs import DenseCodec
from peer.protocol.wire import Envelope, pack_envelope
from peer.transport.server import MAX_JSON_BYTES

from .memory import MemorySampler, settle_memory
from .probes import Probe
from .processes import PeerProcess
from .signing import junk_authorization, sign
from .table import Row

ENDPOINTS = {
    "exchange": ("POST", "/v1/exchange", "application/msgpack"),
    "join": ("POST", "/v1/join", "application/json"),
    "peers": ("GET", "/v1/peers", "application/json"),
}


@dataclass
class Stall:
    """One flooding connection and what the server did with it."""

    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    opened: bool = False
    answered: int | None = None
    closed_by_server: bool = False
    sent: asyncio.Event | None = None


async def _open_stall(
    address: str, request_head: bytes, body: bytes, stall: Stall, hold: asyncio.Event
) -> None:
    host, port = address.rsplit(":", 1)
    try:
        stall.reader, stall.writer = await asyncio.open_connection(host, int(port))
        stall.opened = True
        stall.writer.write(request_head)
        stall.writer.write(body)
        with contextlib.suppress(TimeoutError):  # a peer that stops reading: stall anyway
            async with asyncio.timeout(1.0):
                await stall.writer.drain()
    except (ConnectionError, OSError):
        stall.closed_by_server = True
        return
    finally:
        if stall.sent is not None:
            stall.sent.set()
    reading = asyncio.ensure_future(stall.reader.read(4096))
    stopping = asyncio.ensure_future(hold.wait())
    await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if reading.done():
        with contextlib.suppress(Exception):
            data = reading.result()
            stall.closed_by_server = True
            if data.startswith(b"HTTP/1.1 ") and data[9:12].isdigit():
                stall.answered = int(data[9:12])
    else:
        reading.cancel()
    stopping.cancel()


async def _counts(probe: Probe) -> dict[str, float]:
    samples = await probe.metrics()
    return {
        outcome: samples.get(
            ("gossipnet_exchanges_total", (("outcome", outcome), ("role", "caller"))), 0.0
        )
        for outcome in ("ok", "busy", "failed")
    }


class SignedExchanges:
    """The suite as a correctly signed caller: one exchange after another to ``target``
    (digest-signed with the swarm secret, an envelope of zeros), counted by outcome."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: PeerProcess,
        target_id: str,
        secret: bytes,
        body: bytes,
    ) -> None:
        self.session = session
        self.target = target
        self.target_id = target_id
        self.secret = secret
        self.body = body
        self.outcomes = {"ok": 0.0, "busy": 0.0, "failed": 0.0}
        self._task: asyncio.Task[None] | None = None

    async def _one(self) -> str:
        headers = {
            "Content-Type": "application/msgpack",
            **sign(self.secret, "POST", "/v1/exchange", self.body, receiver=self.target_id),
        }
        try:
            async with self.session.post(
                f"http://{self.target.address}/v1/exchange",
                data=self.body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as response:
                await response.read()
                if response.status == 200:
                    return "ok"
                return "busy" if response.status == 409 else "failed"
        except (aiohttp.ClientError, TimeoutError, OSError):
            return "failed"

    async def _run(self) -> None:
        while True:
            self.outcomes[await self._one()] += 1
            await asyncio.sleep(0.05)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def counts(self) -> dict[str, float]:
        return dict(self.outcomes)


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(after[k] - before[k]) for k in after}


async def slow_body_flood(
    attack: str,
    *,
    target: PeerProcess,
    target_id: str,
    caller: PeerProcess | None,
    caller_id: str | None,
    secret: bytes,
    endpoint: str,
    connections: int,
    signature: str,
    hold_s: float,
    rounds: int,
    seed: int,
    settle_s: float = 15.0,
) -> Row:
    """Flood ``target`` with ``connections`` stalled ``endpoint`` bodies, ``rounds`` times.

    ``signature``: ``"forged"`` (right form, fresh timestamp, wrong MAC) or ``"none"``.
    ``caller``: the real peer exchanging with ``target`` whose calls are counted; ``None``:
    the suite itself calls ``target`` with correctly signed exchanges and counts those.
    """
    method, path, content_type = ENDPOINTS[endpoint]
    rng = random.Random(seed)
    row = Row(attack)
    statuses: dict[int, int] = {}
    during = {"ok": 0, "busy": 0, "failed": 0}
    quiet = {"ok": 0, "busy": 0, "failed": 0}
    released = 0
    async with aiohttp.ClientSession() as session:
        target_probe = Probe(session, target.address, target_id, secret)
        status = await target_probe.status()
        numel = int(status["parameters"])
        if endpoint == "exchange":  # a real envelope's bytes: the streaming parser reads on
            full = pack_envelope(
                Envelope(
                    sender="flooder",
                    round=0,
                    codec="none",
                    payload=DenseCodec().encode(torch.zeros(numel)),
                )
            )
        else:  # JSON control bodies: as large as the JSON cap allows, read whole
            size = min(2 * numel * 4, MAX_JSON_BYTES - 64)
            full = b'{"id": "' + b"a" * size + b'", "address": null}'
        length = len(full)
        prober: SignedExchanges | None = None
        if caller is None:
            zeros = Envelope(
                sender="chaos-prober",
                round=0,
                codec="none",
                payload=DenseCodec().encode(torch.zeros(numel)),
            )
            prober = SignedExchanges(session, target, target_id, secret, pack_envelope(zeros))
            prober.start()
            counts = prober.counts
            who = "the suite"
        else:
            caller_probe = Probe(session, caller.address, caller_id or "", secret)

            async def counts() -> dict[str, float]:
                return await _counts(caller_probe)

            who = caller_id
        members_before = await target_probe.members()
        sampler = MemorySampler(target)
        start_mib: float | None = None
        for _ in range(rounds):
            before = await counts()
            await asyncio.sleep(hold_s)
            for key, value in _delta(await counts(), before).items():
                quiet[key] += value
            if start_mib is None:  # the start: after a quiet window of normal work
                start_mib = sampler.start()
            hold = asyncio.Event()
            stalls = [Stall(sent=asyncio.Event()) for _ in range(connections)]
            tasks = []
            body = full[: length * 9 // 10]
            for stall in stalls:
                headers = [
                    f"{method} {path} HTTP/1.1",
                    f"Host: {target.address}",
                    f"Content-Type: {content_type}",
                    f"Content-Length: {length}",
                ]
                if signature == "forged":
                    junk = bytes(rng.randrange(256) for _ in range(48))
                    headers.append(f"Authorization: {junk_authorization(junk, receiver=target_id)}")
                head = ("\r\n".join(headers) + "\r\n\r\n").encode()
                tasks.append(
                    asyncio.ensure_future(_open_stall(target.address, head, body, stall, hold))
                )
            with contextlib.suppress(TimeoutError):  # every stall has sent its 90 %
                async with asyncio.timeout(10.0):
                    await asyncio.gather(*(s.sent.wait() for s in stalls if s.sent is not None))
            before = await counts()
            await asyncio.sleep(hold_s)
            if target.alive:
                for key, value in _delta(await counts(), before).items():
                    during[key] += value
            hold.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for stall in stalls:
                if stall.answered is not None:
                    statuses[stall.answered] = statuses.get(stall.answered, 0) + 1
                released += int(stall.closed_by_server)
                if stall.writer is not None:
                    stall.writer.close()
            row.requests += connections
            if not target.alive:
                break
        await sampler.stop()
        if prober is not None:
            await prober.stop()
        row.crashes = int(target.crashed()) + int(caller is not None and caller.crashed())
        row.peak_mib = sampler.peak
        if target.alive:
            after_mib = await settle_memory(target, start_mib, timeout_s=settle_s)
            row.memory_after_pct = (
                None
                if after_mib is None or not start_mib
                else 100.0 * (after_mib - start_mib) / start_mib
            )
            members_after = await target_probe.members()
            changed = set(members_after) ^ set(members_before)
            row.membership_changes = len(changed - {"chaos-prober"})  # the signed caller
    row.client_errors = sum(n for s, n in statuses.items() if 400 <= s < 500)
    row.server_errors = sum(n for s, n in statuses.items() if s >= 500)
    # Calls that failed (timed out) during the flood beyond those of the quiet windows: a
    # loaded machine fails some calls anyway, and those are not the flood's doing.
    row.hangs = max(0, during["failed"] - quiet["failed"])
    row.check_common()
    made = sum(during.values())
    quiet_made = sum(quiet.values())
    share = during["ok"] / made if made else 0.0
    quiet_share = quiet["ok"] / quiet_made if quiet_made else 0.0
    row.fail_if(during["ok"] == 0, "no signed exchange succeeded while the flood held")
    row.fail_if(
        during["ok"] > 0 and share < 0.5 * quiet_share,
        f"only {share:.0%} of the exchanges succeeded during the flood ({quiet_share:.0%} before)",
    )
    row.notes.append(
        f"signed exchanges {who} -> {target_id}: quiet {quiet['ok']} ok / {quiet['busy']} "
        f"busy / {quiet['failed']} failed; flooded {during['ok']} ok / {during['busy']} busy / "
        f"{during['failed']} failed (over {rounds} x {hold_s:g} s)"
    )
    row.notes.append(
        f"{released} of {row.requests} stalled connections were answered or closed by the peer "
        f"before the flood let go; answers {dict(sorted(statuses.items()))}; memory start "
        f"{start_mib or 0:.0f} MiB"
    )
    return row
