"""What the suite reads from a live peer to tell whether an attack changed it.

* the model's digest: SHA-256 of the tensor bytes of ``GET /v1/state`` (signed as a member
  when the swarm has a secret: the suite holds it), so any change to the parameters shows;
* the membership: the ids of ``GET /v1/peers`` (signed likewise);
* the status (``GET /v1/status``: step, exchanges, neighbours) and the Prometheus counters
  of ``GET /metrics`` (exchanges served and made, refusals by code), both open.

A peer that does not train (``--steps 1 --hold``) changes its model only through an
exchange it accepts; for a training peer the suite reads the count of exchanges it served
(``gossipnet_exchanges_total{role="callee",outcome="ok"}``) instead.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp
import msgpack
from prometheus_client.parser import text_string_to_metric_families

from .signing import sign

TIMEOUT = aiohttp.ClientTimeout(total=15)


class ProbeError(RuntimeError):
    """A probe could not read what it asked for (names the peer and the endpoint)."""


class Probe:
    """Reads one peer at ``address`` (``HOST:PORT``) whose id is ``peer_id``.

    Args:
        session: the aiohttp session to call through.
        address: the peer's ``HOST:PORT``.
        peer_id: its id (a signature names its receiver).
        secret: the swarm secret, or ``None`` for an open swarm.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        address: str,
        peer_id: str,
        secret: bytes | None,
    ) -> None:
        self.session = session
        self.address = address
        self.peer_id = peer_id
        self.secret = secret

    def _headers(self, method: str, path: str) -> dict[str, str]:
        if self.secret is None:
            return {}
        return sign(self.secret, method, path, b"", receiver=self.peer_id)

    async def _get(self, path: str, *, signed: bool) -> tuple[int, bytes]:
        headers = self._headers("GET", path) if signed else {}
        url = f"http://{self.address}{path}"
        try:
            async with self.session.get(url, headers=headers, timeout=TIMEOUT) as response:
                return response.status, await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise ProbeError(f"{self.address}{path}: {type(error).__name__}: {error}") from error

    async def status(self) -> dict[str, Any]:
        """``GET /v1/status`` as JSON."""
        code, body = await self._get("/v1/status", signed=False)
        if code != 200:
            raise ProbeError(f"{self.address}/v1/status answered {code}")
        loaded = json.loads(body)
        if not isinstance(loaded, dict):
            raise ProbeError(f"{self.address}/v1/status is not a JSON object")
        return loaded

    async def model_digest(self) -> str:
        """SHA-256 of the model's tensor bytes from ``GET /v1/state``."""
        code, body = await self._get("/v1/state", signed=True)
        if code != 200:
            raise ProbeError(f"{self.address}/v1/state answered {code}: {body[:200]!r}")
        envelope = msgpack.unpackb(body, raw=False)
        payload = envelope.get("payload", {}) if isinstance(envelope, dict) else {}
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, bytes):
            raise ProbeError(f"{self.address}/v1/state has no payload data")
        return hashlib.sha256(data).hexdigest()

    async def members(self) -> dict[str, str]:
        """The membership view: member id -> status, from ``GET /v1/peers``."""
        code, body = await self._get("/v1/peers", signed=True)
        if code != 200:
            raise ProbeError(f"{self.address}/v1/peers answered {code}: {body[:200]!r}")
        view = json.loads(body)
        return {
            str(m["id"]): str(m.get("status"))
            for m in view.get("peers", [])
            if isinstance(m, dict) and m.get("id") != self.peer_id
        }

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of ``GET /metrics``: (name, sorted labels) -> value."""
        code, body = await self._get("/metrics", signed=False)
        if code != 200:
            raise ProbeError(f"{self.address}/metrics answered {code}")
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(body.decode(errors="replace")):
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "peer"))
                samples[(sample.name, labels)] = float(sample.value)
        return samples

    async def exchanges(self, role: str, outcome: str) -> float:
        """``gossipnet_exchanges_total{role, outcome}`` (0 before the first)."""
        samples = await self.metrics()
        key = ("gossipnet_exchanges_total", (("outcome", outcome), ("role", role)))
        return samples.get(key, 0.0)

    async def step(self) -> int:
        return int((await self.status()).get("step", 0))
