"""docs/protocol.md and peer/openapi.yaml say what the server does."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from importlib import resources
from pathlib import Path

import pytest

from peer.errors import ERROR_CLASSES
from peer.server import build_app

from .conftest import SECRET, started_peer

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text()


def openapi() -> dict:
    return json.loads(resources.files("peer").joinpath("openapi.yaml").read_text())


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


def test_every_error_code_is_documented() -> None:
    codes = {cls.code for cls in ERROR_CLASSES}
    enum = set(openapi()["components"]["schemas"]["Error"]["properties"]["error"]["enum"])
    assert codes <= enum
    for code in codes:
        assert f"`{code}`" in DOC, code


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
    example = json.loads(re.search(r"```json\n(.*?)```", section, flags=re.DOTALL)[1])
    assert set(example) == set(status)
