"""Attack 3: a hostile neighbour, a fake peer that answers every call with garbage.

:class:`HostileNeighbour` is an aiohttp server the suite runs. It joins a swarm of real
``gossipnet peer`` processes (open, or as a member that holds the secret and signs its
garbage so that it passes authentication and reaches the decoders), re-joins every few
tenths of a second so the real peers keep calling it however often they evict it, and
answers their ``/v1/exchange``, ``/v1/peers``, ``/v1/join`` and ``/v1/state`` calls with one
of many kinds of garbage drawn from a seeded generator: envelopes whose ``v`` is a list,
float, bool or string; an envelope of zeros that is valid but for ``v: 1.0``; NaN, wrong
lengths and dtypes; someone else's sender id; msgpack and JSON nested 100,000 deep; bins
that claim gigabytes; truncated bodies, a Content-Length that lies, a body past the cap,
no answer, a slow answer, 500s, plain-text 4xx; views whose entries have invalid ids or
addresses (every such id contains ``ghost``), views of the wrong types, NaN, huge integers.

:func:`hostile_neighbour` runs the attack and judges it: the real peers keep running and
keep training to their last step, mark the neighbour suspected or evicted, apply none of
its answers (their exchanges made and served must pair up: every exchange a real peer
completed as the caller was served by a real peer) and admit none of its ghosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import torch
from aiohttp import web

from peer.app.swarm import free_ports
from peer.protocol.codecs import DenseCodec
from peer.protocol.wire import Envelope, pack_envelope

from .memory import MemorySampler
from .probes import Probe, ProbeError
from .processes import PeerGroup
from .signing import nonce_of, sign, sign_json_response, stream_response_body
from .table import Row

NEIGHBOUR_ID = "mallory"
EXCHANGE_GARBAGE = (
    "random-bytes", "v-list", "v-float-zeros", "v-bool", "v-str", "v-none", "v-map",
    "nan-payload", "wrong-length", "wrong-dtype", "sender-other", "deep-msgpack",
    "bin-claims-2gb", "truncated", "trailing", "length-lies", "json-200", "html-500",
    "text-400", "empty-200", "over-cap", "slow", "no-answer", "bad-tag",
)  # fmt: skip
VIEW_GARBAGE = (
    "deep-json", "v-list", "peers-map", "peers-ints", "ghost-ids", "ghost-addresses",
    "ghost-statuses", "many-ghosts", "nan", "huge-int", "random-bytes", "html-500", "text-400",
    "empty-200", "duplicate-keys", "id-missing", "id-not-string", "slow", "no-answer",
    "length-lies", "unsigned",
)  # fmt: skip


class HostileNeighbour:
    """The fake peer: an aiohttp server answering every endpoint with seeded garbage.

    Args:
        numel: the swarm's model size (its garbage is sized to look plausible).
        secret: the swarm secret (a member signs its garbage), or ``None``.
        seed: the garbage generator's seed.
        slow_s: how long a ``slow`` answer stalls (longer than the callers' timeout).
    """

    def __init__(self, *, numel: int, secret: bytes | None, seed: int, slow_s: float = 3.0) -> None:
        self.numel = numel
        self.secret = secret
        self.rng = random.Random(seed)
        self.slow_s = slow_s
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        self.served: Counter[str] = Counter()
        self._decks: dict[str, list[str]] = {}
        self._runner: web.AppRunner | None = None
        zeros = Envelope(
            sender=NEIGHBOUR_ID,
            round=0,
            codec="none",
            payload=DenseCodec().encode(torch.zeros(numel)),
        )
        self.base: dict[str, Any] = msgpack.unpackb(pack_envelope(zeros), raw=False)

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _draw(self, endpoint: str, kinds: tuple[str, ...]) -> str:
        """The next kind of garbage for ``endpoint``: every kind once, in a seeded shuffled
        order, then again (so even a short run serves each kind)."""
        deck = self._decks.setdefault(endpoint, [])
        if not deck:
            deck.extend(kinds)
            self.rng.shuffle(deck)
        return deck.pop()

    @property
    def total(self) -> int:
        return sum(self.served.values())

    # ------------------------------------------------------------------ answers

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        stream = request.headers.get("Authorization", "").startswith("gossipnet-stream")
        nonce = None
        with contextlib.suppress(Exception):
            nonce = nonce_of(dict(request.headers)) if self.secret is not None else None
        if request.path in ("/v1/exchange", "/v1/state"):
            kind = self._draw(request.path, EXCHANGE_GARBAGE)
            self.served[f"{request.path}:{kind}"] += 1
            return await self._exchange_garbage(request, kind, nonce, stream)
        kind = self._draw(request.path, VIEW_GARBAGE)
        self.served[f"{request.path}:{kind}"] += 1
        return await self._view_garbage(request, kind, nonce)

    def _envelope(self, **changes: Any) -> bytes:
        return msgpack.packb({**self.base, **changes}, use_bin_type=True)

    def _payload(self, **changes: Any) -> dict[str, Any]:
        return {**self.base["payload"], **changes}

    async def _exchange_garbage(
        self, request: web.Request, kind: str, nonce: str | None, stream: bool
    ) -> web.StreamResponse:
        rng = self.rng
        version = self.base["v"]
        status = 200
        if kind == "random-bytes":
            body = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
        elif kind == "v-list":
            body = self._envelope(v=[version])
        elif kind == "v-float-zeros":
            body = self._envelope(v=float(version))
        elif kind == "v-bool":
            body = self._envelope(v=True)
        elif kind == "v-str":
            body = self._envelope(v=str(version))
        elif kind == "v-none":
            body = self._envelope(v=None)
        elif kind == "v-map":
            body = self._envelope(v={"v": version})
        elif kind == "nan-payload":
            values = torch.full((self.numel,), float("nan"))
            body = self._envelope(payload=self._payload(data=values.numpy().tobytes()))
        elif kind == "wrong-length":
            body = self._envelope(payload=self._payload(data=bytes(4 * (self.numel - 1))))
        elif kind == "wrong-dtype":
            body = self._envelope(payload=self._payload(dtype="<f8"))
        elif kind == "sender-other":
            body = self._envelope(sender="someone-else")
        elif kind == "deep-msgpack":
            body = b"\x91" * 100_000 + b"\xc0"
        elif kind == "bin-claims-2gb":
            body = b"\x86\xa1v" + msgpack.packb(version) + b"\xa7payload\xc6\x7f\xff\xff\xff"
        elif kind == "truncated":
            full = self._envelope()
            body = full[: len(full) // 2]
        elif kind == "trailing":
            body = self._envelope(v=[version]) + b"\x00" * 8
        elif kind == "json-200":
            body = json.dumps({"v": version, "sender": NEIGHBOUR_ID}).encode()
        elif kind == "html-500":
            return web.Response(status=500, text="<html>oops</html>", content_type="text/html")
        elif kind == "text-400":
            return web.Response(status=400, text="no")
        elif kind == "empty-200":
            body = b""
        elif kind == "over-cap":
            return await self._stream_bytes(request, 64 << 20)
        elif kind == "slow":
            await asyncio.sleep(self.slow_s)
            body = self._envelope(v=[version])
        elif kind == "no-answer":
            return self._drop(request)
        elif kind == "length-lies":
            return await self._lying_length(request, self._envelope(v=[version]))
        else:  # bad-tag: a plausible body whose signature is wrong
            body = self._envelope(v=[version])
            return web.Response(status=200, body=body + bytes(16) if stream else body)
        if self.secret is not None and nonce is not None:
            if stream:
                body = stream_response_body(self.secret, status, nonce, body)
                return web.Response(status=status, body=body, content_type="application/msgpack")
            headers = sign_json_response(self.secret, status, nonce, body)
            return web.Response(status=status, body=body, headers=headers)
        return web.Response(status=status, body=body, content_type="application/msgpack")

    async def _view_garbage(
        self, request: web.Request, kind: str, nonce: str | None
    ) -> web.StreamResponse:
        rng = self.rng
        view: Any = {"v": self.base["v"], "id": NEIGHBOUR_ID, "peers": []}
        body: bytes | None = None
        if kind == "deep-json":
            depth = rng.choice((1000, 100_000))
            body = ("[" * depth + "]" * depth).encode()
        elif kind == "v-list":
            view["v"] = [view["v"]]
        elif kind == "peers-map":
            view["peers"] = {"ghost-map": {"address": "127.0.0.1:1"}}
        elif kind == "peers-ints":
            view["peers"] = [1, 2, None, "ghost-string"]
        elif kind == "ghost-ids":
            view["peers"] = [
                {"id": "ghost id!", "address": "127.0.0.1:1", "status": "alive"},
                {"id": "ghost-" + "x" * 70, "address": "127.0.0.1:2", "status": "alive"},
                {"id": ["ghost-list"], "address": "127.0.0.1:3", "status": "alive"},
                {"id": "ghost\n", "address": "127.0.0.1:4", "status": "alive"},
            ]
        elif kind == "ghost-addresses":
            view["peers"] = [
                {"id": "ghost-1", "address": "ghost-host", "status": "alive"},
                {"id": "ghost-2", "address": "127.0.0.1:0", "status": "alive"},
                {"id": "ghost-3", "address": 7000, "status": "alive"},
                {"id": "ghost-4", "address": "127.0.0.1:99999", "status": "alive"},
            ]
        elif kind == "ghost-statuses":
            view["peers"] = [
                {"id": "ghost-5", "address": "127.0.0.1:5", "status": "zombie"},
                {"id": "ghost-6", "address": "127.0.0.1:6", "status": 1},
                {"id": "ghost-7", "address": "127.0.0.1:7"},
            ]
        elif kind == "many-ghosts":
            view["peers"] = [
                {"id": f"ghost {i}", "address": "127.0.0.1:1", "status": "alive"}
                for i in range(rng.choice((1000, 20_000)))
            ]
        elif kind == "nan":
            body = b'{"v": NaN, "id": "mallory", "peers": []}'
        elif kind == "huge-int":
            body = b'{"v": ' + b"9" * 100_000 + b', "id": "mallory", "peers": []}'
        elif kind == "random-bytes":
            body = bytes(rng.randrange(256) for _ in range(rng.randint(1, 2048)))
        elif kind == "html-500":
            return web.Response(status=500, text="<html>oops</html>", content_type="text/html")
        elif kind == "text-400":
            return web.Response(status=400, text="no")
        elif kind == "empty-200":
            body = b""
        elif kind == "duplicate-keys":
            body = b'{"v": 1, "id": "mallory", "peers": [], "peers": [{"id": "ghost dup", "address": "x"}]}'
        elif kind == "id-missing":
            view.pop("id")
        elif kind == "id-not-string":
            view["id"] = ["ghost-id"]
        elif kind == "slow":
            await asyncio.sleep(self.slow_s)
        elif kind == "no-answer":
            return self._drop(request)
        elif kind == "length-lies":
            return await self._lying_length(request, json.dumps(view).encode())
        elif kind == "unsigned":
            return web.Response(status=200, body=json.dumps(view).encode())
        if body is None:
            body = json.dumps(view).encode()
        headers = {"Content-Type": "application/json"}
        if self.secret is not None and nonce is not None:
            headers.update(sign_json_response(self.secret, 200, nonce, body))
        return web.Response(status=200, body=body, headers=headers)

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=200)

    @staticmethod
    async def _lying_length(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Length": str(len(body) * 4)})
        await response.prepare(request)
        await response.write(body)
        if request.transport is not None:
            request.transport.abort()
        return response

    @staticmethod
    async def _stream_bytes(request: web.Request, size: int) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = bytes(1 << 20)
        with contextlib.suppress(ConnectionError, RuntimeError):
            for _ in range(size >> 20):
                await response.write(chunk)
        return response

    # ------------------------------------------------------------------ joining

    async def join(self, session: aiohttp.ClientSession, address: str, receiver: str) -> bool:
        """Announce ourselves to the real peer at ``address``; True if it admitted us."""
        body = json.dumps({"id": NEIGHBOUR_ID, "address": self.address}).encode()
        headers = {"Content-Type": "application/json"}
        if self.secret is not None:
            headers.update(sign(self.secret, "POST", "/v1/join", body, receiver=receiver))
        try:
            async with session.post(
                f"http://{address}/v1/join",
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as response:
                await response.read()
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False


async def hostile_neighbour(
    attack: str,
    directory: Path,
    *,
    peers: int,
    steps: int,
    secret: bytes | None,
    seed: int,
    rejoin_every_s: float = 0.3,
    deadline_s: float = 240.0,
) -> Row:
    """Run ``peers`` real peers for ``steps`` steps with the hostile neighbour among them.

    The real peers wait for ``peers`` members before they train: the others and the hostile
    one, which joins once they all listen (its first garbage answers their view pulls).
    """
    row = Row(attack)
    flags = [
        "--steps", str(steps), "--hold", "--request-timeout-s", "2", "--peers", str(peers),
        "--status-every", "25", "--seed", str(seed), "--log-level", "WARNING",
        "--wait-for-peers", str(peers),  # the other real peers and the hostile one
    ]  # fmt: skip
    if secret is not None:
        (directory / "secret").write_bytes(secret)
        flags += ["--secret-file", str(directory / "secret")]
    with PeerGroup(directory) as group:
        first = group.add("real-0", [*flags, "--peer-index", "0"])
        await first.wait_listening()
        for index in range(1, peers):
            group.add(
                f"real-{index}",
                [*flags, "--peer-index", str(index), "--join", first.address],
            )
        await group.wait_all()
        async with aiohttp.ClientSession() as session:
            probes = [Probe(session, p.address, p.peer_id, secret) for p in group.peers]
            status = await probes[0].status()
            neighbour = HostileNeighbour(numel=int(status["parameters"]), secret=secret, seed=seed)
            await neighbour.start()
            samplers = [MemorySampler(p) for p in group.peers]
            for sampler in samplers:
                sampler.start()
            suspected: set[str] = set()
            ghosts: set[str] = set()
            hangs = 0
            try:
                admitted = await neighbour.join(session, first.address, first.peer_id)
                row.fail_if(not admitted, "the hostile neighbour could not join the swarm")
                loop = asyncio.get_running_loop()
                end = loop.time() + deadline_s
                next_join = 0.0
                finished = False
                while loop.time() < end and not finished:
                    if loop.time() >= next_join:
                        for peer in group.peers:
                            if peer.alive:
                                await neighbour.join(session, peer.address, peer.peer_id)
                        next_join = loop.time() + rejoin_every_s
                    finished = True
                    for peer, probe in zip(group.peers, probes, strict=True):
                        if not peer.alive:
                            continue
                        try:
                            async with asyncio.timeout(10):
                                state = await probe.status()
                        except (ProbeError, TimeoutError) as error:
                            hangs += int(peer.alive and "Timeout" in repr(error))
                            finished = False
                            continue
                        for member in state.get("neighbours", []):
                            member_id = str(member.get("id"))
                            if member_id == NEIGHBOUR_ID and member.get("status") != "alive":
                                suspected.add(peer.peer_id)
                            if "ghost" in member_id:
                                ghosts.add(member_id)
                        finished = finished and int(state.get("step", 0)) >= steps
                    if all(not p.alive for p in group.peers):
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.5)  # the last exchanges land; holding peers call no one
                steps_reached = []
                made = served = 0.0
                for peer, probe in zip(group.peers, probes, strict=True):
                    if not peer.alive:
                        steps_reached.append(-1)
                        continue
                    steps_reached.append(await probe.step())
                    made += await probe.exchanges("caller", "ok")
                    served += await probe.exchanges("callee", "ok")
                    for member_id in await probe.members():
                        if "ghost" in member_id:
                            ghosts.add(member_id)
            finally:
                for sampler in samplers:
                    await sampler.stop()
                await neighbour.stop()
        row.crashes = group.crashes()
    row.requests = neighbour.total
    # Every exchange a real peer completed as the caller was served by a real peer, unless
    # it took the neighbour's garbage: the difference counts applied garbage (exact when no
    # real peer died, whose counters would be lost).
    row.model_changes = max(0, int(made - served)) if row.crashes == 0 else None
    row.membership_changes = len(ghosts)
    row.hangs = hangs
    row.peak_mib = max((s.peak for s in samplers if s.peak is not None), default=None)
    row.check_common()
    behind = [s for s in steps_reached if s < steps]
    row.fail_if(bool(behind), f"real peers stopped short of {steps} steps: {steps_reached}")
    called = {k.split(":")[0] for k in neighbour.served}
    row.fail_if(
        "/v1/exchange" in called and not suspected,
        "no real peer ever marked the hostile neighbour suspected",
    )
    row.notes.append(
        f"real peers reached steps {steps_reached}; {len(suspected)} of {peers} marked it "
        f"suspected or evicted; exchanges completed as caller {made:.0f}, served {served:.0f}"
    )
    row.notes.append(
        "garbage served: " + ", ".join(f"{k} x{n}" for k, n in sorted(neighbour.served.items()))
    )
    if ghosts:
        row.notes.append("ghosts admitted: " + ", ".join(sorted(ghosts)[:8]))
    for peer in group.peers:
        if peer.crashes:
            row.notes.append(f"{peer.peer_id} exited: {peer.last_error()[:300]}")
    return row
