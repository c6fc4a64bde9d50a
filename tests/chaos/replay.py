"""Attack 5: forged and replayed requests against two peers of one secret swarm.

Two real peers that do not train (``--steps 1 --hold``: their models change only through an
exchange they accept) share a secret. :func:`forged_and_replayed`

1. sends requests signed with a wrong secret (digest- and stream-signed exchanges, a join,
   ``GET /v1/peers`` and ``GET /v1/state``): all must be refused ``401``;
2. captures correctly signed requests meant for the first peer, built with ``peer.protocol.auth``'s
   own signing functions and sent with raw aiohttp (a digest-signed exchange, a
   stream-signed exchange, a join): the originals are accepted; then replays each, byte for
   byte, to the same peer and to the other peer: all must be refused ``401``;
3. restarts the first peer with its own command and replays the captures to it again (well
   inside the clock window): all must be refused.

After every forged or replayed request it reads the receiving peer's model digest and
membership: neither may change.
"""

from __future__ import annotations

import json
import secrets

import aiohttp
import torch

from peer.protocol.codecs import DenseCodec
from peer.protocol.wire import Envelope, pack_envelope

from .probes import Probe
from .processes import PeerProcess
from .signing import sign, sign_stream
from .table import Row

TIMEOUT = aiohttp.ClientTimeout(total=15)


Captured = tuple[str, str, dict[str, str], bytes]
"""A request as it went over the wire: method, path, headers, body."""


async def _send(
    session: aiohttp.ClientSession, address: str, request: Captured
) -> tuple[int | None, bytes]:
    method, path, headers, body = request
    try:
        async with session.request(
            method, f"http://{address}{path}", data=body or None, headers=headers, timeout=TIMEOUT
        ) as response:
            return response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        return None, repr(error).encode()


def _envelope_body(sender: str, numel: int) -> bytes:
    envelope = Envelope(
        sender=sender, round=0, codec="none", payload=DenseCodec().encode(torch.zeros(numel))
    )
    return pack_envelope(envelope)


async def forged_and_replayed(
    attack: str,
    *,
    first: PeerProcess,
    first_id: str,
    second: PeerProcess,
    second_id: str,
    secret: bytes,
    restart: bool = True,
) -> Row:
    """Run the forged, replayed and replayed-after-restart requests; one row."""
    row = Row(attack)
    wrong = secrets.token_bytes(32)
    row.client_errors = row.server_errors = row.model_changes = row.membership_changes = 0
    row.hangs = 0
    async with aiohttp.ClientSession() as session:
        probes = {
            first_id: Probe(session, first.address, first_id, secret),
            second_id: Probe(session, second.address, second_id, secret),
        }
        addresses = {first_id: first.address, second_id: second.address}
        numel = int((await probes[first_id].status())["parameters"])

        async def hostile(name: str, receiver: str, request: Captured) -> None:
            """Send a request that must be refused; judge the answer and the receiver."""
            probe = probes[receiver]
            digest, members = await probe.model_digest(), await probe.members()
            status, body = await _send(session, addresses[receiver], request)
            row.requests += 1
            if status is None:
                row.hangs = (row.hangs or 0) + int(b"Timeout" in body)
            elif 400 <= status < 500:
                row.client_errors = (row.client_errors or 0) + 1
            elif status >= 500:
                row.server_errors = (row.server_errors or 0) + 1
            model_changed = await probe.model_digest() != digest
            members_changed = set(await probe.members()) ^ set(members)
            row.model_changes = (row.model_changes or 0) + int(model_changed)
            row.membership_changes = (row.membership_changes or 0) + len(members_changed)
            row.fail_if(status != 401, f"{name} to {receiver}: answered {status} (want 401)")
            row.notes.append(
                f"{name} -> {receiver}: {status} {body[:100]!r}"
                + (" MODEL CHANGED" if model_changed else "")
                + (f" MEMBERS CHANGED {sorted(members_changed)}" if members_changed else "")
            )

        async def original(name: str, request: Captured) -> None:
            status, body = await _send(session, first.address, request)
            row.notes.append(f"original {name} -> {first_id}: {status}")
            row.fail_if(
                status != 200,
                f"the original {name} was refused ({status} {body[:100]!r}): the replays test nothing",
            )

        exchange = _envelope_body("captured-exchange", numel)
        join = json.dumps({"id": "captured-join", "address": "127.0.0.1:9"}).encode()
        msgpack_type = {"Content-Type": "application/msgpack"}
        json_type = {"Content-Type": "application/json"}

        # 1. a wrong secret
        stream_headers, stream_body = sign_stream(
            wrong, "POST", "/v1/exchange", exchange, receiver=first_id
        )
        for name, request in (
            ("wrong-secret exchange", ("POST", "/v1/exchange", {**msgpack_type, **sign(wrong, "POST", "/v1/exchange", exchange, receiver=first_id)}, exchange)),
            ("wrong-secret stream exchange", ("POST", "/v1/exchange", {**msgpack_type, **stream_headers}, stream_body)),
            ("wrong-secret join", ("POST", "/v1/join", {**json_type, **sign(wrong, "POST", "/v1/join", join, receiver=first_id)}, join)),
            ("wrong-secret peers", ("GET", "/v1/peers", sign(wrong, "GET", "/v1/peers", b"", receiver=first_id), b"")),
            ("wrong-secret state", ("GET", "/v1/state", sign(wrong, "GET", "/v1/state", b"", receiver=first_id), b"")),
        ):  # fmt: skip
            await hostile(name, first_id, request)

        # 2. captured on the way to the first peer, then replayed
        stream_headers, stream_body = sign_stream(
            secret,
            "POST",
            "/v1/exchange",
            _envelope_body("captured-stream", numel),
            receiver=first_id,
        )
        captures: list[tuple[str, Captured]] = [
            ("exchange", ("POST", "/v1/exchange", {**msgpack_type, **sign(secret, "POST", "/v1/exchange", exchange, receiver=first_id)}, exchange)),
            ("stream exchange", ("POST", "/v1/exchange", {**msgpack_type, **stream_headers}, stream_body)),
            ("join", ("POST", "/v1/join", {**json_type, **sign(secret, "POST", "/v1/join", join, receiver=first_id)}, join)),
        ]  # fmt: skip
        for name, request in captures:
            await original(name, request)
        for name, request in captures:
            await hostile(f"replayed {name}", first_id, request)
            await hostile(f"replayed {name} (other peer)", second_id, request)

        # 3. after a restart of the first peer
        if restart:
            first.stop()
            first.start()
            await first.wait_listening()
            for name, request in captures:
                await hostile(f"replayed {name} (after restart)", first_id, request)
    row.crashes = int(first.crashed()) + int(second.crashed())
    row.check_common()
    return row
