"""Codecs: gossip's typed payload errors become the peer's typed protocol errors and statuses."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import aiohttp
import msgpack
import pytest
import torch

from gossip import PAYLOAD_ERROR_KINDS, PayloadError, build_compressor, decode
from peer import auth, codecs, wire
from peer.errors import (
    DTypeMismatch,
    MalformedBody,
    NonFiniteValues,
    ProtocolError,
    ShapeMismatch,
    UnknownCodec,
)

from .conftest import SECRET, model_bytes, started_peer

Corrupt = Callable[[int], dict[str, object]]


def payload(spec: str, d: int, **changes: object) -> dict[str, object]:
    """A real payload of ``spec`` for a d-vector, with some fields replaced, as received."""
    good = build_compressor(spec).encode(torch.randn(d), torch.Generator().manual_seed(0))
    return msgpack.unpackb(msgpack.packb({**good, **changes}))


# kind -> (payload for a d-vector that fails exactly that check, error class, status, code)
BY_KIND: dict[str, tuple[Corrupt, type[ProtocolError], int, str]] = {
    "field": (
        lambda d: {"codec": "fp16", "dtype": "<f2"},
        MalformedBody,
        400,
        "malformed_body",
    ),
    "parameter": (lambda d: payload("qsgd", d, bits=3), MalformedBody, 400, "malformed_body"),
    "dtype": (lambda d: payload("fp16", d, dtype="<f4"), DTypeMismatch, 422, "dtype_mismatch"),
    "length": (
        lambda d: payload("bf16", d, data=b"\x00" * 6),
        ShapeMismatch,
        422,
        "shape_mismatch",
    ),
    "value": (
        lambda d: payload("qsgd", d, scale=b"\x00\x00\x80\xbf" * math.ceil(d / 256)),  # -1.0
        MalformedBody,
        400,
        "malformed_body",
    ),
    "non_finite": (
        lambda d: payload("fp16", d, data=b"\x00\x7c" * d),  # +inf everywhere
        NonFiniteValues,
        422,
        "non_finite",
    ),
}


def test_every_payload_error_kind_has_one_protocol_error() -> None:
    assert set(codecs.PAYLOAD_ERRORS) == set(PAYLOAD_ERROR_KINDS)
    assert codecs.PAYLOAD_ERRORS["codec"] is UnknownCodec
    assert codecs.PAYLOAD_ERRORS["index"] is MalformedBody
    for kind, (_, error, status, code) in BY_KIND.items():
        assert codecs.PAYLOAD_ERRORS[kind] is error  # type: ignore[index]
        assert (error.status, error.code) == (status, code)


@pytest.mark.parametrize("kind", list(BY_KIND))
def test_each_kind_raised_by_gossip_becomes_its_typed_error(kind: str) -> None:
    corrupt, error, _, _ = BY_KIND[kind]
    body = corrupt(300)
    with pytest.raises(PayloadError) as raised:
        decode(body, 300)
    assert raised.value.kind == kind  # the case really fails the check it is named after
    with pytest.raises(error, match=r"^payload: ") as typed:
        codecs.receiving_codecs()[str(body["codec"])].decode(body, wire.ModelSpec(numel=300))
    assert type(typed.value) is error
    assert str(raised.value) in typed.value.detail


def test_a_payload_codec_other_than_the_envelopes_is_an_unknown_codec() -> None:
    body = payload("bf16", 300)
    with pytest.raises(UnknownCodec, match="envelope's codec 'fp16'"):
        codecs.receiving_codecs()["fp16"].decode(body, wire.ModelSpec(numel=300))


@pytest.mark.parametrize("kind", list(BY_KIND))
async def test_a_running_peer_answers_each_kind_with_its_status_and_code(kind: str) -> None:
    corrupt, _, status, code = BY_KIND[kind]
    async with started_peer("callee", seed=1) as peer:
        body = corrupt(peer.spec.numel)
        envelope = {"v": 1, "sender": "caller", "round": 0, "step": 0}
        envelope |= {"codec": body["codec"], "payload": body}
        raw = msgpack.packb(envelope, use_bin_type=True)
        before = model_bytes(peer)
        headers = auth.sign_request(SECRET, "POST", "/v1/exchange", raw)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://{peer.address}/v1/exchange", data=raw, headers=headers) as reply,
        ):
            got_status, answer = reply.status, await reply.read()
        assert got_status == status, answer
        error = json.loads(answer)
        assert error["error"] == code and error["detail"].startswith("payload: ")
        assert model_bytes(peer) == before
