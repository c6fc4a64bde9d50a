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
from peer.node.peer import Peer
from peer.protocol import auth, codecs, wire
from peer.protocol.errors import (
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
    "index": (  # an index past d: a sparsifier's payload is accepted, then refused
        lambda d: payload("topk:ratio=0.1", d, index=d.to_bytes(4, "little") * math.ceil(d / 10)),
        MalformedBody,
        400,
        "malformed_body",
    ),
}

# the lossless codec's own refusals (gossip's NoCompression payload, the model's dtype)
NONE_CASES: dict[str, tuple[Corrupt, int, str]] = {
    "another dtype": (
        lambda d: payload("none", d) | {"dtype": "<f8", "data": bytes(8 * d)},
        422,
        "dtype_mismatch",
    ),
    "unknown dtype": (lambda d: payload("none", d) | {"dtype": "float32"}, 422, "dtype_mismatch"),
    "short": (lambda d: payload("none", d) | {"data": bytes(4 * d - 4)}, 422, "shape_mismatch"),
    "nan": (lambda d: payload("none", d) | {"data": b"\x00\x00\xc0\x7f" * d}, 422, "non_finite"),
    "extra field": (lambda d: payload("none", d) | {"shape": [d]}, 400, "malformed_body"),
    "legacy tensor map": (lambda d: {"tensor": payload("none", d)}, 400, "malformed_body"),
}


def test_every_payload_error_kind_has_one_protocol_error() -> None:
    assert set(codecs.PAYLOAD_ERRORS) == set(PAYLOAD_ERROR_KINDS)
    assert codecs.PAYLOAD_ERRORS["codec"] is UnknownCodec
    assert set(BY_KIND) == set(PAYLOAD_ERROR_KINDS) - {"codec"}
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


async def _post_exchange(peer: Peer, envelope: dict) -> tuple[int, bytes]:
    """POST a hand-built, correctly signed envelope to a running peer's /v1/exchange."""
    raw = msgpack.packb(envelope, use_bin_type=True)
    headers = auth.sign_request(SECRET, "POST", "/v1/exchange", raw, receiver="callee")
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://{peer.address}/v1/exchange", data=raw, headers=headers) as reply,
    ):
        return reply.status, await reply.read()


@pytest.mark.parametrize("kind", list(BY_KIND))
async def test_a_running_peer_answers_each_kind_with_its_status_and_code(kind: str) -> None:
    corrupt, _, status, code = BY_KIND[kind]
    async with started_peer("callee", seed=1) as peer:
        body = corrupt(peer.spec.numel)
        envelope = {"v": wire.PROTOCOL_VERSION, "sender": "caller", "round": 0, "step": 0}
        envelope |= {"codec": body["codec"], "payload": body}
        before = model_bytes(peer)
        got_status, answer = await _post_exchange(peer, envelope)
        assert got_status == status, answer
        error = json.loads(answer)
        assert error["error"] == code and error["detail"].startswith("payload: ")
        assert model_bytes(peer) == before


def _repeated_position(d: int) -> dict[str, object]:
    """chunked-topk with its first chunk's first two 4-bit positions both 1."""
    good = payload("chunked-topk:chunk=16,k=4", d)
    return good | {"index": b"\x11" + bytes(good["index"])[1:]}  # type: ignore[arg-type]


# SparseLoCo's codec (chunked-topk): its own refusals, status and code
CHUNKED_CASES: dict[str, tuple[Corrupt, int, str]] = {
    "repeated position": (_repeated_position, 400, "malformed_body"),
    "nan centroid": (
        lambda d: payload(
            "chunked-topk:chunk=16,k=4", d, centroid=b"\x00\x00\xc0\x7f" * 4 * math.ceil(d / 16)
        ),
        422,
        "non_finite",
    ),
    "short levels": (
        lambda d: payload("chunked-topk:chunk=16,k=4", d, level=b""),
        422,
        "shape_mismatch",
    ),
    "bits 3": (lambda d: payload("chunked-topk:chunk=16,k=4", d, bits=3), 400, "malformed_body"),
}


@pytest.mark.parametrize("case", list(CHUNKED_CASES))
async def test_a_running_peer_refuses_bad_chunked_topk_payloads_untouched(case: str) -> None:
    corrupt, status, code = CHUNKED_CASES[case]
    async with started_peer("callee", seed=1) as peer:
        body = corrupt(peer.spec.numel)
        envelope = {"v": wire.PROTOCOL_VERSION, "sender": "caller", "round": 0, "step": 0}
        envelope |= {"codec": "chunked-topk", "payload": body}
        before = model_bytes(peer)
        got_status, answer = await _post_exchange(peer, envelope)
        assert got_status == status, answer
        assert json.loads(answer)["error"] == code
        assert model_bytes(peer) == before


@pytest.mark.parametrize("case", list(NONE_CASES))
async def test_a_running_peer_refuses_bad_none_payloads_untouched(case: str) -> None:
    corrupt, status, code = NONE_CASES[case]
    async with started_peer("callee", seed=1) as peer:
        body = corrupt(peer.spec.numel)
        envelope = {
            "v": wire.PROTOCOL_VERSION,
            "sender": "caller",
            "round": 0,
            "step": 0,
            "codec": "none",
        }
        before = model_bytes(peer)
        got_status, answer = await _post_exchange(peer, envelope | {"payload": body})
        assert got_status == status, answer
        assert json.loads(answer)["error"] == code
        assert model_bytes(peer) == before


def test_dense_codec_is_gossips_none_and_decodes_a_view() -> None:
    x = torch.randn(300)
    sent = codecs.DenseCodec().encode(x)
    assert sent == build_compressor("none").encode(x)
    received = msgpack.unpackb(msgpack.packb(sent))
    decoded = codecs.receiving_codecs()["none"].decode(received, wire.ModelSpec(numel=300))
    assert torch.equal(decoded, x)
    assert decoded.untyped_storage().data_ptr() == _address(received["data"])
    bf16 = wire.ModelSpec(numel=300, dtype=torch.bfloat16)
    decoded = codecs.DenseCodec().decode(
        msgpack.unpackb(msgpack.packb(codecs.DenseCodec().encode(x.bfloat16()))), bf16
    )
    assert decoded.dtype == torch.bfloat16 and torch.equal(decoded, x.bfloat16())


def _address(data: bytes) -> int:
    import numpy as np

    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)
