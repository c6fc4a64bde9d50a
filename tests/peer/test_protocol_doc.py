"""docs/protocol.md and peer/openapi.yaml say what the server does: its routes, its errors
(codes, statuses, bodies, headers), its patterns and payloads, checked against the code and
against a live peer."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.node.membership import check_address
from peer.protocol import auth
from peer.protocol.codecs import receiving_codecs
from peer.protocol.errors import ERROR_CLASSES, ProtocolError
from peer.protocol.wire import PROTOCOL_VERSION, SENDER_ID_PATTERN
from peer.transport.server import build_app

from .conftest import SECRET, started_peer
from .test_server import Served, served_peer

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text()
STATUS_OF = {cls.code: cls.status for cls in ERROR_CLASSES}


def openapi() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        resources.files("peer").joinpath("openapi.yaml").read_text()
    )
    return loaded


async def test_openapi_lists_exactly_the_served_routes() -> None:
    async with started_peer("a") as peer:
        app = build_app(peer)
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    spec = openapi()
    assert spec["openapi"].startswith("3.1")
    documented = {(method, path) for path, item in spec["paths"].items() for method in item}
    assert documented == served


def test_every_error_code_is_documented_with_its_status() -> None:
    spec = openapi()
    enum = set(spec["components"]["schemas"]["Error"]["properties"]["error"]["enum"])
    assert enum == set(STATUS_OF)
    rows = re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", DOC, flags=re.MULTILINE)
    assert dict((code, int(status)) for status, code in rows) == STATUS_OF
    documented = {
        status
        for item in spec["paths"].values()
        for operation in item.values()
        for status in operation["responses"]
    } | {"404", "405", "500"}  # any path, any method; a bug
    assert {str(status) for status in STATUS_OF.values()} - {"503"} <= documented


def test_the_schemas_carry_the_protocol_version() -> None:
    schemas = openapi()["components"]["schemas"]
    for name in ("Envelope", "View", "Status"):
        assert schemas[name]["properties"]["v"]["const"] == PROTOCOL_VERSION, name
    assert openapi()["info"]["version"] == str(PROTOCOL_VERSION)


def _accepts_address(address: str) -> bool:
    try:
        check_address(address)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="ab1.-:[]f09", max_size=12),
        st.builds(
            lambda host, port: f"{host}:{port}",
            st.text(alphabet="a.-9[]:", min_size=1, max_size=6),
            st.text(alphabet="0123456789", min_size=0, max_size=7),
        ),
        st.integers(0, 10**6).map(lambda port: f"host:{port}"),
        st.integers(0, 70000).map(lambda port: f"[::1]:{port:05d}"),
    )
)
def test_the_address_pattern_is_the_servers_rule(address: str) -> None:
    pattern = openapi()["components"]["schemas"]["Address"]["pattern"]
    assert (re.search(pattern, address) is not None) == _accepts_address(address)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aZ09._:- é/", max_size=70))
def test_the_peer_id_pattern_is_the_servers_rule(peer_id: str) -> None:
    pattern = openapi()["components"]["schemas"]["PeerId"]["pattern"]
    assert (re.search(pattern, peer_id) is not None) == (
        SENDER_ID_PATTERN.fullmatch(peer_id) is not None
    )


def test_each_codec_payload_has_exactly_one_schema_with_its_fields() -> None:
    spec = openapi()
    options = spec["components"]["schemas"]["Envelope"]["properties"]["payload"]["oneOf"]
    for name, codec in receiving_codecs().items():
        payload = codec.encode(torch.linspace(-1, 1, 64))
        matching = [
            option
            for option in options
            if payload["codec"] == option["properties"]["codec"].get("const")
            or payload["codec"] in option["properties"]["codec"].get("enum", ())
        ]
        assert len(matching) == 1, name
        schema = matching[0]
        assert set(schema["required"]) == set(schema["properties"]) == set(payload), name
        for field, rule in schema["properties"].items():
            if "const" in rule:
                assert payload[field] == rule["const"], (name, field)
            if "enum" in rule:
                assert payload[field] in rule["enum"], (name, field)


def _validator(spec: dict[str, Any], name: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"$ref": f"#/components/schemas/{name}", "components": spec["components"]}
    return jsonschema.Draft202012Validator(schema)


PROBES: list[tuple[str, str, dict[str, str], bytes]] = [
    ("POST", "/v1/exchange", {}, b"\x93\x01"),
    ("POST", "/v1/exchange", {"Authorization": "junk"}, b""),
    ("POST", "/v1/exchange", {"Expect": "fly"}, b"x"),
    ("POST", "/v1/join", {}, b"{}"),
    ("GET", "/v1/peers", {}, b""),
    ("GET", "/v1/state", {}, b"body"),
    ("GET", "/v1/status", {"Expect": "fly"}, b""),
    ("DELETE", "/v1/state", {}, b""),
    ("GET", "/v1/unknown", {}, b""),
]


async def _probe(
    served: Served, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://{served.address}{path}", headers=headers, data=body or None
        ) as response,
    ):
        return response.status, dict(response.headers), await response.read()


async def test_live_refusals_are_documented_responses_with_error_bodies() -> None:
    """A small deterministic fuzz: each probe's status is among its operation's documented
    responses (or 404/405 for what no operation covers) and its body is an ``Error``."""
    spec = openapi()
    errors = _validator(spec, "Error")
    async with served_peer("callee") as served:
        before = served.digest()
        for method, path, headers, body in PROBES:
            status, got_headers, data = await _probe(served, method, path, headers, body)
            operation = spec["paths"].get(path, {}).get(method.lower())
            if operation is None:
                assert status == (404 if path not in spec["paths"] else 405), (method, path)
                if status == 405:
                    allowed = {m.upper() for m in spec["paths"][path]}
                    assert allowed <= set(got_headers["Allow"].split(","))
            else:
                assert str(status) in operation["responses"], (method, path, status, data)
            errors.validate(json.loads(data))
        assert served.digest() == before


async def test_live_views_and_status_match_their_schemas() -> None:
    spec = openapi()
    async with served_peer("callee") as served:
        served.peer.membership.observe("b", "127.0.0.1:9")
        headers = auth.sign_request(SECRET, "GET", "/v1/peers", b"", receiver="callee")
        status, got_headers, data = await _probe(served, "GET", "/v1/peers", headers, b"")
        assert status == 200 and "X-Gossipnet-Signature" in got_headers
        _validator(spec, "View").validate(json.loads(data))
        status, _, data = await _probe(served, "GET", "/v1/status", {}, b"")
        _validator(spec, "Status").validate(json.loads(data))


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "curl", "openssl", "sha256sum")),
    reason="the documented example needs bash, curl, openssl and sha256sum",
)
async def test_the_documented_curl_example_works(tmp_path: Path) -> None:
    snippet = next(
        block for block in re.findall(r"```sh\n(.*?)```", DOC, flags=re.DOTALL) if "curl" in block
    )
    (tmp_path / "swarm.secret").write_bytes(SECRET)
    async with started_peer("a") as peer:
        peer.membership.observe("b", "127.0.0.1:9")
        script = snippet.replace("127.0.0.1:7000", peer.address)
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", script, cwd=tmp_path, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    view = json.loads(out)
    assert view["id"] == "a"
    assert {"id": "b", "address": "127.0.0.1:9", "status": "alive"} in view["peers"]


async def test_the_status_schema_and_example_list_exactly_the_served_fields() -> None:
    async with started_peer("a") as peer:
        status = peer.status()
    schema = openapi()["components"]["schemas"]["Status"]
    assert set(schema["properties"]) == set(status)
    assert set(schema["required"]) <= set(status)
    exchanges = schema["properties"]["exchanges"]
    assert set(exchanges["properties"]) == set(exchanges["required"]) == set(status["exchanges"])
    section = DOC.split("### `GET /v1/status`", 1)[1]
    found = re.search(r"```json\n(.*?)```", section, flags=re.DOTALL)
    assert found is not None
    example = json.loads(found[1])
    assert set(example) == set(status)


def _hmac_hex(text: str) -> str:
    return hmac.new(SECRET, text.encode(), hashlib.sha256).hexdigest()


@pytest.mark.parametrize("receiver", ["callee", "peer-7.a_b", "x" * 64])
def test_the_openapi_security_scheme_is_what_auth_signs(receiver: str) -> None:
    """peer/openapi.yaml's security scheme states version 2 as ``peer.protocol.auth``
    implements it: its header patterns match the headers auth.py builds (and refuse
    version 1's), and its signed texts and tag keys, MACed, give auth.py's signatures."""
    scheme = openapi()["components"]["securitySchemes"]["swarmHmac"]
    digest_pattern = re.compile(scheme["x-header-pattern"])
    stream_pattern = re.compile(scheme["x-stream-header-pattern"])
    timestamp, nonce, body = auth.now_ms(), "0123456789abcdef" * 2, b'{"id": "a"}'
    common = {"receiver": receiver, "timestamp": timestamp, "nonce": nonce}
    digest_header = auth.sign_request(SECRET, "POST", "/v1/join", body, **common)
    stream_header = auth.sign_stream_request(SECRET, "POST", "/v1/exchange", 1234, **common)
    digest_auth, stream_auth = digest_header["Authorization"], stream_header["Authorization"]
    assert digest_pattern.fullmatch(digest_auth) and not stream_pattern.fullmatch(digest_auth)
    assert stream_pattern.fullmatch(stream_auth) and not digest_pattern.fullmatch(stream_auth)
    values = {
        "version": PROTOCOL_VERSION,
        "receiver": receiver,
        "timestamp": timestamp,
        "nonce": nonce,
    }
    signed_text = scheme["x-signed-text"].format(
        **values, method="POST", path="/v1/join", body_sha256=hashlib.sha256(body).hexdigest()
    )
    assert digest_auth.endswith(f",signature={_hmac_hex(signed_text)}")
    stream_text = scheme["x-stream-signed-text"].format(
        **values, method="POST", path="/v1/exchange", content_length=1234
    )
    assert stream_auth.endswith(f",signature={_hmac_hex(stream_text)}")
    response_text = scheme["x-response-signed-text"].format(
        status=200, nonce=nonce, body_sha256=hashlib.sha256(body).hexdigest()
    )
    response = auth.sign_response(SECRET, 200, nonce, body)
    assert response[auth.RESPONSE_SIGNATURE_HEADER] == _hmac_hex(response_text)
    request_key = scheme["x-request-tag-key"].format(nonce=nonce)
    response_key = scheme["x-response-tag-key"].format(status=200, nonce=nonce)
    assert auth.body_key(SECRET, nonce, "request").hex() == _hmac_hex(request_key)
    assert auth.body_key(SECRET, nonce, "response", 200).hex() == _hmac_hex(response_key)
    assert scheme["x-tag-bytes"] == auth.TAG_BYTES
    for name in (auth.SCHEME, auth.STREAM_SCHEME):
        form = f"{name} v={PROTOCOL_VERSION},to=<receiver id>,timestamp=<unix ms>,nonce=<32 hex>"
        assert form in scheme["description"]
    version_1 = f"{auth.SCHEME} timestamp={timestamp // 1000},nonce={nonce},signature={'a' * 64}"
    for refused in (version_1, digest_auth.replace(f"to={receiver}", "to=a b")):
        with pytest.raises(ProtocolError):
            auth.parse_authorization(refused)
        assert not digest_pattern.fullmatch(refused)
