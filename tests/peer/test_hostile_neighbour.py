"""A hostile neighbour answers garbage: the client raises only its three typed errors, and a
real peer calling it keeps its model and membership bit for bit, and keeps running.

The neighbour is a real aiohttp server on 127.0.0.1 (plus a raw TCP server for answers that
are not even HTTP). It is a *member*: in a swarm with a secret it signs its garbage
correctly (a response tag or ``X-Gossipnet-Signature`` bound to our nonce), so every answer
reaches the decoders; in an open swarm nobody signs. Every answer here is invalid, so any
change to the model or to the membership is a bug, and so is any exception other than
``PeerUnavailable``, ``RemoteRefused`` or a ``ProtocolError`` (node.py catches exactly those
around exchanges, joins and view refreshes: anything else would end the peer).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack
import pytest
import torch
from aiohttp import web

from peer.protocol import auth
from peer.protocol.codecs import DenseCodec, receiving_codecs
from peer.protocol.errors import ProtocolError
from peer.protocol.wire import (
    MAX_VIEW_ENTRIES,
    PROTOCOL_VERSION,
    Envelope,
    ModelSpec,
    max_body_bytes,
)
from peer.transport.body import poly1305_tag
from peer.transport.client import PeerClient, PeerUnavailable, RemoteRefused

from .conftest import SECRET, model_bytes, started_peer

HOSTILE_ID = "zz-hostile"
"""Larger than the peer's id, so a sync peer calls it first each round."""
CALLER_ID = "a"
NUMEL = 10
"""Parameters of conftest's model (``Linear(4, 2)``)."""
SPEC = ModelSpec(numel=NUMEL)
CAP = max_body_bytes(SPEC.num_bytes)
TIMEOUT_S = 1.0
TYPED = (PeerUnavailable, RemoteRefused, ProtocolError)


@dataclass
class Answer:
    """One hostile HTTP answer."""

    body: bytes = b""
    status: int = 200
    sign: bool = True
    """Sign a 2xx as a member would (tag or X-Gossipnet-Signature), when there is a secret."""
    content_length: int | None = None
    """Send this Content-Length instead of the body's, then close the connection."""
    chunked: bool = False
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------ envelope answers


def envelope(**overrides: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "sender": HOSTILE_ID,
        "round": 0,
        "step": 0,
        "codec": "none",
        "payload": DenseCodec().encode(torch.ones(NUMEL)),
    }
    obj.update(overrides)
    return {key: value for key, value in obj.items() if value is not DROP}


DROP = object()


def packed(**overrides: Any) -> bytes:
    return msgpack.packb(envelope(**overrides), use_bin_type=True)


def payload(data: bytes, dtype: str = "<f4", **extra: Any) -> dict[str, Any]:
    return {"codec": "none", "dtype": dtype, "data": data, **extra}


def floats(*values: float) -> bytes:
    return torch.tensor([*values, *[0.0] * (NUMEL - len(values))]).numpy().tobytes()


def duplicate_v() -> bytes:
    """A msgpack map of seven entries whose ``v`` comes twice (the last is a string)."""
    entries = [*envelope().items(), ("v", str(PROTOCOL_VERSION))]
    return b"\x87" + b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in entries)


GOOD = packed()
ENVELOPE_ANSWERS: dict[str, tuple[Answer, tuple[type[Exception], ...]]] = {
    "v a list": (Answer(packed(v=[PROTOCOL_VERSION])), (ProtocolError,)),
    "v a map": (Answer(packed(v={"v": PROTOCOL_VERSION})), (ProtocolError,)),
    "v a float": (Answer(packed(v=float(PROTOCOL_VERSION))), (ProtocolError,)),
    "v 1.0 and zeros": (
        Answer(packed(v=1.0, payload=DenseCodec().encode(torch.zeros(NUMEL)))),
        (ProtocolError,),
    ),
    "v true": (Answer(packed(v=True)), (ProtocolError,)),
    "v 1 (the old version)": (Answer(packed(v=1)), (ProtocolError,)),
    "v 2**64-1": (Answer(packed(v=2**64 - 1)), (ProtocolError,)),
    "v twice, last a string": (Answer(duplicate_v()), (ProtocolError,)),
    "round 2**64-1": (Answer(packed(round=2**64 - 1)), (ProtocolError,)),
    "round true": (Answer(packed(round=True)), (ProtocolError,)),
    "step -5": (Answer(packed(step=-5)), (ProtocolError,)),
    "sender another peer": (Answer(packed(sender="a-stranger")), (ProtocolError,)),
    "sender the caller": (Answer(packed(sender=CALLER_ID)), (ProtocolError,)),
    "sender a path": (Answer(packed(sender="../../etc")), (ProtocolError,)),
    "sender a map": (Answer(packed(sender={"id": HOSTILE_ID})), (ProtocolError,)),
    "codec zstd": (Answer(packed(codec="zstd")), (ProtocolError,)),
    "extra key": (Answer(msgpack.packb({**envelope(), "x": 1})), (ProtocolError,)),
    "missing step": (Answer(packed(step=DROP)), (ProtocolError,)),
    "bytes key": (Answer(msgpack.packb({**envelope(), b"v": 2})), (ProtocolError,)),
    "payload NaN": (Answer(packed(payload=payload(floats(math.nan)))), (ProtocolError,)),
    "payload -inf": (Answer(packed(payload=payload(floats(-math.inf)))), (ProtocolError,)),
    "payload too short": (Answer(packed(payload=payload(bytes(4 * NUMEL - 4)))), (ProtocolError,)),
    "payload too long": (Answer(packed(payload=payload(bytes(4 * NUMEL + 4)))), (ProtocolError,)),
    "payload float64": (
        Answer(packed(payload=payload(bytes(8 * NUMEL), dtype="<f8"))),
        (ProtocolError,),
    ),
    "payload a list": (Answer(packed(payload=[1, 2])), (ProtocolError,)),
    "payload another codec": (
        Answer(packed(payload={**payload(bytes(4 * NUMEL)), "codec": "fp16"})),
        (ProtocolError,),
    ),
    "payload data a str": (Answer(packed(payload=payload("x" * 40))), (ProtocolError,)),  # type: ignore[arg-type]
    "payload extra key": (Answer(packed(payload=payload(bytes(40), x=1))), (ProtocolError,)),
    "nested 100,000 arrays deep": (Answer(b"\x91" * 100_000 + b"\x00"), (ProtocolError,)),
    "nested 50,000 maps deep": (Answer(b"\x81\xa1a" * 50_000 + b"\x00"), (ProtocolError,)),
    "truncated msgpack": (Answer(GOOD[: len(GOOD) // 2]), (ProtocolError,)),
    "trailing bytes": (Answer(GOOD + b"xyz"), (ProtocolError,)),
    "extension type": (Answer(msgpack.packb(msgpack.ExtType(1, b"x"))), (ProtocolError,)),
    "not msgpack": (Answer(b"<html><body>hello</body></html>"), (ProtocolError,)),
    "JSON": (Answer(b'{"v": 2}'), (ProtocolError,)),
    "empty 200": (Answer(b""), (ProtocolError,)),
    "204 no content": (Answer(b"", status=204), (ProtocolError,)),
    "over the body cap": (Answer(b"\x00" * (CAP + 1)), (ProtocolError,)),
    "a 1 MiB string": (
        Answer(packed(sender="s" * (1 << 20))),
        (ProtocolError,),  # over the cap before it is a string too long
    ),
    "Content-Length longer than the body": (
        Answer(GOOD, content_length=len(GOOD) + 100),
        (PeerUnavailable,),
    ),
    "Content-Length shorter than the body": (
        Answer(GOOD, content_length=len(GOOD) // 2),
        (ProtocolError, PeerUnavailable),
    ),
}
"""Answers to ``POST /v1/exchange`` and ``GET /v1/state`` (and the errors they must raise)."""

SIGNED_ONLY: dict[str, tuple[Answer, tuple[type[Exception], ...]]] = {
    "unsigned good envelope": (Answer(GOOD, sign=False), (ProtocolError,)),
    "wrong tag": (Answer(GOOD + bytes(16), sign=False), (ProtocolError,)),
    "good envelope, chunked (no length for the tag)": (
        Answer(GOOD, chunked=True),
        (ProtocolError,),
    ),
    "unsigned good view": (
        Answer(json.dumps({"v": 2, "id": HOSTILE_ID, "peers": []}).encode(), sign=False),
        (ProtocolError,),
    ),
}
"""Answers that are wrong only because a secret swarm signs everything."""


# ------------------------------------------------------------------ JSON answers


def view_json(**overrides: Any) -> bytes:
    obj: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": HOSTILE_ID, "peers": []}
    obj.update(overrides)
    return json.dumps(obj).encode()


JSON_ANSWERS: dict[str, tuple[Answer, tuple[type[Exception], ...]]] = {
    "nested 100,000 arrays deep": (
        Answer(b"[" * 100_000 + b"]" * 100_000),
        (ProtocolError,),
    ),
    "nested 100,000 objects deep": (
        Answer(b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        (ProtocolError,),
    ),
    "not UTF-8": (
        Answer(b'{"v": 2, "id": "\xff\xfe", "peers": []}'),
        (ProtocolError,),
    ),
    "duplicate keys": (
        Answer(b'{"v": 2, "id": "zz-hostile", "id": "zz-hostile", "peers": []}'),
        (ProtocolError,),
    ),
    "v a list": (Answer(view_json(v=[2])), (ProtocolError,)),
    "v a map": (Answer(view_json(v={"v": 2})), (ProtocolError,)),
    "v 2.0": (Answer(view_json(v=2.0)), (ProtocolError,)),
    "v true": (Answer(view_json(v=True)), (ProtocolError,)),
    "v 1 (the old version)": (Answer(view_json(v=1)), (ProtocolError,)),
    "v a string": (Answer(view_json(v="2")), (ProtocolError,)),
    "v 10**30": (Answer(view_json(v=10**30)), (ProtocolError,)),
    "v 10**100": (Answer(view_json(v=10**100)), (ProtocolError,)),
    "v NaN": (Answer(b'{"v": NaN, "id": "zz-hostile", "peers": []}'), (ProtocolError,)),
    "v Infinity": (Answer(b'{"v": Infinity, "id": "zz-hostile", "peers": []}'), (ProtocolError,)),
    "v 1e999": (Answer(b'{"v": 1e999, "id": "zz-hostile", "peers": []}'), (ProtocolError,)),
    "id an int": (Answer(view_json(id=5)), (ProtocolError,)),
    "id with a space": (Answer(view_json(id="zz hostile")), (ProtocolError,)),
    "id another peer": (Answer(view_json(id="a-stranger")), (ProtocolError,)),
    "id missing": (Answer(json.dumps({"v": 2, "peers": []}).encode()), (ProtocolError,)),
    "extra key": (Answer(view_json(admin=True)), (ProtocolError,)),
    "peers a map": (Answer(view_json(peers={"b": "127.0.0.1:1"})), (ProtocolError,)),
    "peers a string": (Answer(view_json(peers="127.0.0.1:1")), (ProtocolError,)),
    "peers too many": (
        Answer(
            view_json(
                peers=[
                    {"id": f"p{i}", "address": "10.0.0.1:1"} for i in range(MAX_VIEW_ENTRIES + 1)
                ]
            )
        ),
        (ProtocolError,),
    ),
    "top-level list": (Answer(b"[]"), (ProtocolError,)),
    "top-level number": (Answer(b"2"), (ProtocolError,)),
    "truncated": (Answer(view_json()[:20]), (ProtocolError,)),
    "empty": (Answer(b""), (ProtocolError,)),
    "msgpack": (Answer(msgpack.packb({"v": 2, "id": HOSTILE_ID, "peers": []})), (ProtocolError,)),
    "over 1 MiB": (Answer(view_json(pad="x" * (1 << 20))), (ProtocolError,)),
    "chunked over 1 MiB": (Answer(view_json(pad="x" * (1 << 20)), chunked=True), (ProtocolError,)),
    "Content-Length longer than the body": (
        Answer(view_json(), content_length=500),
        (PeerUnavailable,),
    ),
}
"""Answers to ``POST /v1/join``, ``GET /v1/peers`` and the ``GET /v1/status`` lookup."""

BAD_ENTRIES_VIEW = view_json(
    peers=[
        {"id": 5, "address": []},
        "peer-b@127.0.0.1:7001",
        None,
        {"id": "no-address"},
        {"id": "bad-address", "address": "127.0.0.1"},
        {"id": "bad-port", "address": "127.0.0.1:99999"},
        {"id": "bad status", "address": "127.0.0.1:1"},
        {"id": "x" * 65, "address": "127.0.0.1:1"},
        {"id": "ok-but-extra", "address": "127.0.0.1:1", "role": "admin"},
        {"id": "bad-status", "address": "127.0.0.1:1", "status": 1},
        {"id": CALLER_ID, "address": "10.9.9.9:1"},
    ]
)
"""A well-formed view whose every entry must be skipped (or is the caller itself)."""

HTTP_ANSWERS: dict[str, tuple[Answer, tuple[type[Exception], ...]]] = {
    "500": (Answer(b"oops", status=500), (PeerUnavailable,)),
    "503 with JSON": (Answer(b'{"error": "not_ready", "detail": "x"}', 503), (PeerUnavailable,)),
    "302 to the caller itself": (
        Answer(b"", status=302, headers={"Location": "http://127.0.0.1:9/v1/peers"}),
        (ProtocolError,),
    ),
    "404 HTML": (Answer(b"<h1>404</h1>", status=404), (RemoteRefused,)),
    "400 nested 100,000 deep": (Answer(b"[" * 100_000, status=400), (RemoteRefused,)),
    "400 not UTF-8": (Answer(b'{"error": "\xff", "detail": "\xfe"}', status=400), (RemoteRefused,)),
    "400 NaN": (Answer(b'{"error": NaN, "detail": "x"}', status=400), (RemoteRefused,)),
    "400 duplicate keys": (
        Answer(b'{"error": "a", "error": "b", "detail": "x"}', status=400),
        (RemoteRefused,),
    ),
    "400 code with odd characters, detail with escapes": (
        Answer(
            json.dumps({"error": "Bad Code\n", "detail": "\x1b[31mred\nforged log line"}).encode(),
            status=400,
        ),
        (RemoteRefused,),
    ),
    "401 a list": (Answer(b"[1, 2]", status=401), (RemoteRefused,)),
    "418 empty": (Answer(b"", status=418), (RemoteRefused,)),
    "400 over 1 MiB": (Answer(b"x" * ((1 << 20) + 1), status=400), (ProtocolError,)),
    "slower than the timeout": (Answer(GOOD, delay_s=TIMEOUT_S + 0.5), (PeerUnavailable,)),
}
"""Answers at the HTTP level, the same for every endpoint."""


# ------------------------------------------------------------------ the hostile neighbour


class Hostile:
    """An aiohttp server that answers every endpoint with ``self.answers[path]`` (the
    status lookup answers honestly unless told otherwise)."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self.answers: dict[str, Answer] = {}
        self.address = ""
        self.calls: dict[str, int] = {}

    def honest_status(self) -> Answer:
        return Answer(json.dumps({"v": PROTOCOL_VERSION, "id": HOSTILE_ID}).encode(), sign=False)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.calls[request.path] = self.calls.get(request.path, 0) + 1
        answer = self.answers.get(request.path) or (
            self.honest_status() if request.path == "/v1/status" else Answer(GOOD)
        )
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        body, headers = answer.body, dict(answer.headers)
        signed = "Authorization" in request.headers  # the status lookup is not
        if self.secret is not None and signed and answer.sign and 200 <= answer.status < 300:
            nonce = auth.request_nonce(request.headers)
            if auth.is_streamed(request.headers):
                key = auth.body_key(self.secret, nonce, "response", answer.status)
                body += poly1305_tag(key, body)
            else:
                headers.update(auth.sign_response(self.secret, answer.status, nonce, body))
        if answer.content_length is None and not answer.chunked:
            return web.Response(status=answer.status, body=body, headers=headers)
        response = web.StreamResponse(status=answer.status, headers=headers)
        if answer.chunked:
            response.enable_chunked_encoding()
        else:
            response.content_length = answer.content_length
        await response.prepare(request)
        await response.write(body)
        if answer.chunked:
            await response.write_eof()
        elif request.transport is not None:  # a lying Content-Length: hang up
            request.transport.close()
        return response


@asynccontextmanager
async def hostile_neighbour(secret: bytes | None) -> AsyncIterator[Hostile]:
    hostile = Hostile(secret)
    app = web.Application(client_max_size=4 << 20)
    app.router.add_route("*", "/{tail:.*}", hostile.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    hostile.address = f"127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield hostile
    finally:
        await runner.cleanup()


RAW_ANSWERS: dict[str, bytes] = {
    "not HTTP": b"hello there\r\n\r\n",
    "bad status line": b"HTTP/1.1 abc OK\r\n\r\n",
    "status 999": b"HTTP/1.1 999 Weird\r\nContent-Length: 0\r\n\r\n",
    "100 Continue, then nothing": b"HTTP/1.1 100 Continue\r\n\r\n",
    "header without a colon": b"HTTP/1.1 200 OK\r\nContent-Length 5\r\n\r\nhello",
    "Content-Length not a number": b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nhello",
    "negative Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
    "two Content-Lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "a 100 KB header": b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 100_000 + b"\r\n\r\n",
    "10,000 headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: a\r\n" * 10_000 + b"\r\n",
    "broken chunked framing": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    ),
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "NUL bytes": b"\x00" * 1000,
    "hang up at once": b"",
}
"""Answers that are not HTTP/1.1, from a raw TCP server."""


@asynccontextmanager
async def raw_neighbour(answer: bytes) -> AsyncIterator[str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
            writer.write(answer)
            await writer.drain()
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


# ------------------------------------------------------------------ the client's calls


async def _exchange(client: PeerClient, address: str) -> object:
    sent = DenseCodec().encode(torch.zeros(NUMEL))
    reply = await client.exchange(
        address,
        Envelope(sender=CALLER_ID, round=0, codec="none", payload=sent),
        receiver=HOSTILE_ID,
        codecs=receiving_codecs(),
    )
    return receiving_codecs()[reply.codec].decode(reply.payload, SPEC)  # as a peer does


async def _state(client: PeerClient, address: str) -> object:
    reply = await client.state(address, receiver=HOSTILE_ID, codecs={"none"})
    return DenseCodec().decode(reply.payload, SPEC)


CALLS: dict[str, tuple[str, Callable[[PeerClient, str], Awaitable[object]]]] = {
    "exchange": ("/v1/exchange", _exchange),
    "state": ("/v1/state", _state),
    "join": ("/v1/join", lambda c, a: c.join(a, CALLER_ID, "127.0.0.1:9", receiver=HOSTILE_ID)),
    "join a bare address": ("/v1/join", lambda c, a: c.join(a, CALLER_ID, None)),
    "peers": ("/v1/peers", lambda c, a: c.peers(a, receiver=HOSTILE_ID)),
    "status": ("/v1/status", lambda c, a: c.peer_id(a)),
}
ENVELOPE_CALLS = ("exchange", "state")
JSON_CALLS = ("join", "join a bare address", "peers")


async def outcome(call: Awaitable[object]) -> Exception | None:
    """The typed error a call raised, None if it returned; anything else is re-raised."""
    try:
        await call
    except TYPED as error:
        return error
    return None


def cases(secret: bytes | None) -> list[tuple[str, str, Answer, tuple[type[Exception], ...]]]:
    """(answer name, call, answer, errors it may raise) for every answer and call."""
    out = []
    for name, (answer, expected) in ENVELOPE_ANSWERS.items():
        out += [(name, call, answer, expected) for call in ENVELOPE_CALLS]
    for name, (answer, expected) in JSON_ANSWERS.items():
        out += [(name, call, answer, expected) for call in JSON_CALLS]
    if secret is None:  # an open swarm signs for nobody: a bare join does not ask who is there
        out.remove(("id another peer", "join a bare address", *JSON_ANSWERS["id another peer"]))
    for name, (answer, expected) in HTTP_ANSWERS.items():
        calls = ("exchange", "peers") if answer.delay_s else tuple(CALLS)  # a timeout is slow
        out += [(name, call, answer, expected) for call in calls]
    if secret is not None:
        for name, (answer, expected) in SIGNED_ONLY.items():
            calls = JSON_CALLS if "view" in name else ENVELOPE_CALLS
            out += [(name, call, answer, expected) for call in calls]
    return out


@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "open"])
async def test_the_client_raises_only_typed_errors_for_any_answer(secret: bytes | None) -> None:
    wrong = []
    async with (
        hostile_neighbour(secret) as hostile,
        PeerClient(secret=secret, timeout_s=TIMEOUT_S, max_body_bytes=CAP) as client,
    ):
        for name, call, answer, expected in cases(secret):
            path, function = CALLS[call]
            hostile.answers = {path: answer}
            try:
                error = await outcome(function(client, hostile.address))
            except Exception as escaped:  # the bug this test is here to catch
                wrong.append(f"{call} / {name}: {type(escaped).__name__} escaped: {escaped}")
                continue
            if answer.content_length is not None:
                await client.close()  # it hung up: start the next case on a fresh connection
            if error is None:
                wrong.append(f"{call} / {name}: accepted")
            elif not isinstance(error, expected):
                wrong.append(f"{call} / {name}: {type(error).__name__} ({error})")
        for name, (answer, _) in JSON_ANSWERS.items():  # the status lookup: only no escape
            hostile.answers = {"/v1/status": answer}
            try:
                await outcome(client.join(hostile.address, CALLER_ID, None))
            except Exception as escaped:
                wrong.append(f"status lookup / {name}: {type(escaped).__name__}: {escaped}")
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("answer", list(RAW_ANSWERS))
async def test_answers_that_are_not_http_are_a_peer_unavailable(answer: str) -> None:
    async with (
        raw_neighbour(RAW_ANSWERS[answer]) as address,
        PeerClient(secret=SECRET, timeout_s=TIMEOUT_S, max_body_bytes=CAP) as client,
    ):
        for call in CALLS:
            error = await outcome(CALLS[call][1](client, address))
            assert isinstance(error, PeerUnavailable | ProtocolError), (call, error)


async def test_a_refusals_code_and_detail_are_bounded_and_printable() -> None:
    answer = json.dumps({"error": "busy", "detail": "\x1b[31m\nline two" + "x" * 10_000})
    async with (
        hostile_neighbour(SECRET) as hostile,
        PeerClient(secret=SECRET, timeout_s=TIMEOUT_S, max_body_bytes=CAP) as client,
    ):
        hostile.answers = {"/v1/peers": Answer(answer.encode(), status=409)}
        with pytest.raises(RemoteRefused) as refused:
            await client.peers(hostile.address, receiver=HOSTILE_ID)
        assert refused.value.code == "busy" and refused.value.detail.isprintable()
        assert len(refused.value.detail) <= 500
        hostile.answers = {"/v1/peers": Answer(b'{"error": "Not A Code!", "detail": 1}', 400)}
        with pytest.raises(RemoteRefused) as refused:
            await client.peers(hostile.address, receiver=HOSTILE_ID)
        assert refused.value.code == "unknown"


# ------------------------------------------------------------------ a real peer


def membership_of(peer: Any) -> list[Any]:
    return [peer.membership.view(), [(m.id, m.address) for m in peer.membership.members()]]


@pytest.mark.parametrize(
    ("mode", "secret"),
    [("async", SECRET), ("sync", SECRET), ("async", None)],
    ids=["async-secret", "sync-secret", "async-open"],
)
@pytest.mark.filterwarnings("ignore::peer.protocol.auth.OpenSwarmWarning")  # the open case's
async def test_a_peer_calling_a_hostile_neighbour_keeps_its_model_and_membership(
    mode: str, secret: bytes | None
) -> None:
    async with (
        hostile_neighbour(secret) as hostile,
        started_peer(
            CALLER_ID,
            mode=mode,
            secret=secret,
            request_timeout_s=TIMEOUT_S,
            round_deadline_s=2.0,
            suspect_after=1_000_000,  # keep calling it: every answer is another attack
            evict_after=1_000_000,
        ) as peer,
    ):
        peer.membership.observe(HOSTILE_ID, hostile.address)
        model, members = model_bytes(peer), membership_of(peer)
        answers: list[tuple[str, str, Answer]] = []
        for name, (answer, _) in ENVELOPE_ANSWERS.items():
            answers.append((name, "/v1/exchange", answer))
        for name, (answer, _) in [
            *JSON_ANSWERS.items(),
            ("bad entries", (Answer(BAD_ENTRIES_VIEW), ())),
        ]:
            answers.append((name, "/v1/peers", answer))
        for name, (answer, _) in [*HTTP_ANSWERS.items(), *SIGNED_ONLY.items()]:
            if secret is not None or name not in SIGNED_ONLY:
                answers += [(name, "/v1/exchange", answer), (name, "/v1/peers", answer)]
        changed = []
        for name, path, answer in answers:
            hostile.answers = {path: answer}
            before = hostile.calls.get(path, 0)
            if path == "/v1/exchange":
                await peer.gossip()  # raises nothing: the peer would stop otherwise
            else:
                await peer.refresh_view()
            assert hostile.calls.get(path, 0) > before, f"{name}: {path} was not called"
            if model_bytes(peer) != model or membership_of(peer) != members:
                changed.append(f"{path} / {name}")
                model, members = model_bytes(peer), membership_of(peer)
        assert changed == [], "\n".join(changed)
        hostile_member = peer.membership.get(HOSTILE_ID)
        assert hostile_member is not None and hostile_member.failures > 0
        async with (  # and the peer still serves
            aiohttp.ClientSession() as session,
            session.get(f"http://{peer.address}/v1/status") as response,
        ):
            assert response.status == 200 and (await response.json())["id"] == CALLER_ID


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize(("status", "code"), [(409, "busy"), (429, "overloaded")])
async def test_a_full_neighbour_is_busy_not_failed(mode: str, status: int, code: str) -> None:
    """``409 busy`` and ``429 overloaded`` mean alive and full: counted busy, never a
    failure that would get the neighbour suspected; anything else refused is a failure."""
    async with (
        hostile_neighbour(SECRET) as hostile,
        started_peer(CALLER_ID, mode=mode, request_timeout_s=TIMEOUT_S, round_deadline_s=2.0)
        as peer,
    ):  # fmt: skip
        peer.membership.observe(HOSTILE_ID, hostile.address)
        refusal = json.dumps({"error": code, "detail": "full"}).encode()
        hostile.answers = {"/v1/exchange": Answer(refusal, status=status)}
        for _ in range(3):
            await peer.gossip()
        member = peer.membership.get(HOSTILE_ID)
        assert member is not None and member.failures == 0 and member.status == "alive"
        assert hostile.calls.get("/v1/exchange", 0) >= 3
        hostile.answers = {"/v1/exchange": Answer(b'{"error": "x", "detail": "y"}', status=400)}
        await peer.gossip()
        member = peer.membership.get(HOSTILE_ID)
        assert member is not None and member.failures > 0
