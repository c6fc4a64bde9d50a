"""PeerConfig validation, codecs over gossip compressors, and membership bookkeeping."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import torch

from gossip.settings import ConfigurationError
from peer.node.config import PeerConfig
from peer.node.membership import Membership, check_address, view_entry
from peer.protocol import codecs, wire
from peer.protocol.errors import (
    DTypeMismatch,
    InvalidSender,
    MalformedBody,
    NonFiniteValues,
    ShapeMismatch,
    UnknownCodec,
)
from peer.transport.admission import DEFAULT_SERVING_SHARE

from .conftest import started_peer


@pytest.mark.parametrize(
    ("field", "value", "refused", "message"),
    [
        ("peer_id", "", "peer_id", "peer_id"),
        ("port", 70000, "port", "port"),
        ("mode", "gossip", "mode", r"mode: must be one of \['async', 'sync'\]"),
        ("order", "random", "order", "order"),
        (
            "compressor",
            "topk:ratio=0.1",
            "compressor",
            r"compressor: topk drops most coordinates .* none, fp16, bf16, qsgd",
        ),
        ("fanout", 0, "fanout", "fanout"),
        ("local_steps", 0, "local_steps", "local_steps"),
        ("round_deadline_s", 0, "round_deadline_s", "round_deadline_s"),
        ("request_timeout_s", float("nan"), "request_timeout_s", "request_timeout_s"),
        ("evict_after", 0, "evict_after", "evict_after"),
        ("join", ("nohost",), "join", "join: an entry must be HOST:PORT"),
        ("join", "127.0.0.1:1", "join", "join: must be a list or tuple"),
        ("secret", b"short", "secret", "secret"),
        ("max_body_factor", 0.5, "max_body_factor", "max_body_factor"),
        ("max_serving_share", 0, "max_serving_share", r"max_serving_share: must be in \(0, 1\]"),
        ("max_serving_share", 1.5, "max_serving_share", r"must be in \(0, 1\]; got 1.5"),
        ("checkpoint_every", 5, "checkpoint_dir", "checkpoint_dir: is required"),
        (
            "tls_cert",
            "cert.pem",
            "tls_cert",
            "tls_cert: must be given together with PeerConfig.tls_key",
        ),
        ("client_only", True, "join", "join: must name at least one peer"),
    ],
)
def test_config_errors_name_the_field(
    field: str, value: object, refused: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        PeerConfig(**{"peer_id": "a", field: value})  # type: ignore[arg-type]
    assert caught.value.field == refused
    assert str(caught.value).startswith(f"PeerConfig.{refused}: ")


def test_the_serving_share_is_a_config_field_with_the_servers_default() -> None:
    assert PeerConfig(peer_id="a").max_serving_share == DEFAULT_SERVING_SHARE == 0.5
    assert PeerConfig(peer_id="a", max_serving_share=1).max_serving_share == 1.0


def test_the_deprecated_codec_field_is_gone() -> None:
    with pytest.raises(TypeError, match="codec"):
        PeerConfig(peer_id="a", codec="fp16")  # type: ignore[call-arg]


def test_a_client_only_peer_calls_two_neighbours_a_round_unless_told() -> None:
    from peer.node.config import CLIENT_ONLY_FANOUT

    edge = ("127.0.0.1:7000",)
    assert PeerConfig(peer_id="a").fanout == 1
    assert PeerConfig(peer_id="a", client_only=True, join=edge).fanout == CLIENT_ONLY_FANOUT == 2
    assert PeerConfig(peer_id="a", client_only=True, join=edge, fanout=1).fanout == 1
    assert PeerConfig(peer_id="a", fanout=3).fanout == 3
    with pytest.raises(ValueError, match="fanout"):
        PeerConfig(peer_id="a", client_only=True, join=edge, fanout=0)
    # sync rounds exchange with every neighbour: a fanout there is an error, not ignored
    assert PeerConfig(peer_id="a", mode="sync").fanout is None
    with pytest.raises(ValueError, match=r"PeerConfig\.fanout: async mode only \(dpsgd rounds"):
        PeerConfig(peer_id="a", mode="sync", fanout=1)


def test_config_join_accepts_a_list_and_keeps_a_tuple() -> None:
    config = PeerConfig(peer_id="edge-7", join=["127.0.0.1:7000"], client_only=True)
    assert config.join == ("127.0.0.1:7000",)


def test_config_defaults_are_valid() -> None:
    config = PeerConfig(peer_id="edge-1.example:7")
    assert config.mode == "async" and config.compressor == "none" and config.aggregator == "mean"
    assert "xxxxxxxx" not in repr(PeerConfig(peer_id="a", secret=b"x" * 16))


SPEC = wire.ModelSpec(numel=300)


# spec -> largest error, relative to max |x|: one quantization step for qsgd (1/L, L = 127
# or 7), 16-bit rounding, exact for the rest (sparsifiers with ratio 1 keep everything)
ROUND_TRIP_TOLERANCE = {
    "none": 0.0,
    "fp16": 1e-3,
    "bf16": 1e-2,
    "qsgd:bits=8": 1 / 127,
    "qsgd:bits=4,block=64": 1 / 7,
    "topk:ratio=1": 0.0,
    "randk:ratio=1": 0.0,
    "fp16:feedback=true": 1e-3,
}


@pytest.mark.parametrize("spec", list(ROUND_TRIP_TOLERANCE))
def test_codecs_round_trip_through_msgpack(spec: str) -> None:
    codec = codecs.build_codec(spec)
    x = torch.randn(300)
    payload = msgpack.unpackb(msgpack.packb(codec.encode(x)), raw=False)
    decoded = codecs.receiving_codecs()[codec.name].decode(payload, SPEC)
    assert decoded.shape == (300,) and decoded.dtype == torch.float32
    error = float((decoded - x).abs().max())
    assert error <= ROUND_TRIP_TOLERANCE[spec] * float(x.abs().max())


def test_sparse_codecs_are_built_and_decoded_the_configuration_decides_who_may_send_them() -> None:
    """Every gossip codec can be sent and received; that a sparsifier must not carry a
    model is GossipConfig's rule (PeerConfig's ``compressor`` case above), not the codec's."""
    codec = codecs.build_codec("topk:ratio=0.01")
    x = torch.randn(300)
    decoded = codecs.receiving_codecs()["topk"].decode(
        msgpack.unpackb(msgpack.packb(codec.encode(x))), SPEC
    )
    assert int((decoded != 0).sum()) == 3
    assert set(codecs.receiving_codecs()) == {
        "none",
        "fp16",
        "bf16",
        "qsgd",
        "topk",
        "randk",
        "chunked-topk",
    }
    with pytest.raises(ValueError, match=r"codec: unknown compressor 'zstd'; choose one of"):
        codecs.build_codec("zstd")
    with pytest.raises(ValueError, match=r"codec: compressor 'topk' has no parameter 'bits'"):
        codecs.build_codec("topk:bits=2")


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"codec": "fp16", "dtype": "<f2", "data": b"\x00" * 10}, ShapeMismatch),
        ({"codec": "fp16", "dtype": "<f4", "data": b"\x00" * 1200}, DTypeMismatch),
        ({"codec": "fp16", "dtype": "<f2", "data": b"\x00\x7c" * 300}, NonFiniteValues),  # +inf
        ({"codec": "fp16", "dtype": "<f2"}, MalformedBody),
        ({"codec": "bf16", "dtype": "bf16", "data": b"\x00" * 600}, UnknownCodec),
    ],
)
def test_compressor_payload_errors_become_typed(payload: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        codecs.receiving_codecs()["fp16"].decode(payload, SPEC)


async def test_fp16_peers_converge() -> None:
    async with (
        started_peer("a", seed=0, compressor="fp16") as a,
        started_peer("b", seed=1, compressor="fp16", join=(a.address,), fetch_state=False) as b,
    ):
        for _ in range(3):
            await asyncio.gather(a.gossip(), b.gossip())
        assert float((a.flat.vector - b.flat.vector).abs().max()) < 1e-2


def test_membership_suspect_evict_readmit() -> None:
    now = [0.0]
    view = Membership("me", "127.0.0.1:1", suspect_after=2, evict_after=3, clock=lambda: now[0])
    view.observe("x", "127.0.0.1:2")
    assert view.record_failure("x") == "alive"
    assert view.record_failure("x") == "suspected"
    assert [m.id for m in view.neighbours()] == ["x"]
    assert view.record_failure("x") == "evicted"
    assert view.neighbours() == [] and view.view() == [
        {"id": "me", "address": "127.0.0.1:1", "status": "alive"}
    ]
    now[0] = 5.0
    member = view.observe("x")
    assert member.status == "alive" and member.failures == 0 and member.address == "127.0.0.1:2"
    assert member.last_seen == 5.0
    assert view.counts() == {"alive": 1, "suspected": 0, "evicted": 0, "left": 0}


def test_a_member_that_left_is_neither_called_nor_shared_until_it_returns() -> None:
    view = Membership("me", "127.0.0.1:1", suspect_after=1, evict_after=2)
    view.observe("x", "127.0.0.1:2")
    view.record_failure("x")
    assert view.mark_left("x") and not view.mark_left("stranger")
    member = view.get("x")
    assert member is not None and (member.status, member.failures) == ("left", 0)
    assert view.neighbours() == [] and [m["id"] for m in view.view()] == ["me"]
    view.merge([{"id": "x", "address": "127.0.0.1:2", "status": "alive"}])  # an older view
    assert member.status == "left"
    assert view.counts() == {"alive": 0, "suspected": 0, "evicted": 0, "left": 1}
    view.observe("x")  # it joins again
    assert member.status == "alive"


def test_membership_merge_adds_only_new_and_never_itself() -> None:
    view = Membership("me", None)
    view.observe("x", "127.0.0.1:2")
    view.record_failure("x")
    added = view.merge(
        [
            {"id": "me", "address": "10.0.0.1:1", "status": "alive"},
            {"id": "x", "address": "127.0.0.1:9", "status": "alive"},
            {"id": "y", "address": None, "status": "alive"},
        ]
    )
    assert added == ["y"]
    assert view.get("x").status == "suspected" and view.get("x").address == "127.0.0.1:2"
    with pytest.raises(ValueError, match="own id"):
        view.observe("me")


BAD_ENTRIES = {
    "no address": {"id": "z"},
    "no id": {"address": "127.0.0.1:9"},
    "address not HOST:PORT": {"id": "z", "address": "bad", "status": "alive"},
    "address port 0": {"id": "z", "address": "127.0.0.1:0", "status": "alive"},
    "address a list": {"id": "z", "address": ["127.0.0.1", 9], "status": "alive"},
    "address an int": {"id": "z", "address": 9000, "status": "alive"},
    "id an int": {"id": 5, "address": "127.0.0.1:9", "status": "alive"},
    "id with a space": {"id": "z z", "address": "127.0.0.1:9", "status": "alive"},
    "id too long": {"id": "z" * 65, "address": "127.0.0.1:9", "status": "alive"},
    "id a map": {"id": {"id": "z"}, "address": "127.0.0.1:9", "status": "alive"},
    "unknown status": {"id": "z", "address": "127.0.0.1:9", "status": "king"},
    "status a bool": {"id": "z", "address": "127.0.0.1:9", "status": True},
    "an extra key": {"id": "z", "address": "127.0.0.1:9", "admin": True, "status": "alive"},
    "no status": {"id": "z", "address": "127.0.0.1:9"},
    "a string": "z@127.0.0.1:9",
    "a list": ["z", "127.0.0.1:9"],
    "null": None,
    "a number": 1e309,
}


@pytest.mark.parametrize("case", list(BAD_ENTRIES))
def test_bad_view_entries_are_skipped_and_logged_never_joined(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    view = Membership("me", None)
    with pytest.raises((MalformedBody, InvalidSender)):
        view_entry(BAD_ENTRIES[case])
    good = {"id": "y", "address": "127.0.0.1:8", "status": "alive"}
    assert view.merge([BAD_ENTRIES[case], good], source="view of x") == ["y"]
    assert [m.id for m in view.members()] == ["y"]
    assert "skipped 1 bad entry of view of x (entry 0:" in caplog.text


@pytest.mark.parametrize("address", ["127.0.0.1:7000", "peer-3.local:80", "[::1]:9000"])
def test_addresses(address: str) -> None:
    assert check_address(address) == address


@pytest.mark.parametrize("address", ["127.0.0.1", "host:0", "host:99999", "a b:1", 7000])
def test_bad_addresses(address: object) -> None:
    with pytest.raises(ValueError, match="address"):
        check_address(address)


def test_stochastic_codec_is_seeded() -> None:
    x = torch.randn(1000)
    first = codecs.build_codec("qsgd:bits=2", seed=7).encode(x)
    again = codecs.build_codec("qsgd:bits=2", seed=7).encode(x)
    other = codecs.build_codec("qsgd:bits=2", seed=8).encode(x)
    assert first == again and first != other
