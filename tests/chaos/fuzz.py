"""Attack 1: thousands of hostile requests against one live peer, and what they changed.

:func:`fuzz_peer` sends :mod:`.hostile`'s requests (HTTP through aiohttp, broken HTTP through
raw sockets) from ``concurrency`` workers and records every answer: status codes, answers
that are not the documented JSON error (``{"error": code, "detail": text}``), 405s without
an ``Allow`` header, ``2xx`` answers to hostile ``POST``s, connections dropped without an
answer, requests past their deadline (hangs), and the tracebacks the peer logs for them
(a refused request is a line in the log at most, never a traceback). Around the run it reads the peer's model
digest (or, for a training peer, its count of exchanges served), its membership, its step,
its resident memory (sampled for the peak, and after the abuse), and whether the process is
still alive. Refused input must change neither the model nor the membership.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from .hostile import Hostile, HostileRequests
from .memory import MemorySampler, settle_memory
from .probes import Probe
from .processes import PeerProcess
from .signing import sign
from .table import Row

DEADLINE_S = 10.0
"""A hostile request the peer has not answered (or closed) within this is a hang."""


@dataclass
class Answer:
    """What came back for one request (``status`` None: the connection closed unanswered)."""

    status: int | None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    hang: bool = False


def is_json_error(answer: Answer) -> bool:
    """Whether a 4xx/5xx answer is the documented ``{"error": code, "detail": text}`` JSON."""
    content_type = next((v for k, v in answer.headers.items() if k.lower() == "content-type"), "")
    if not content_type.lower().startswith("application/json"):
        return False
    try:
        obj = json.loads(answer.body)
    except ValueError:
        return False
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("error"), str)
        and isinstance(obj.get("detail"), str)
    )


@dataclass
class Tally:
    """Counts over every answer of a fuzzing run."""

    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    dropped: int = 0
    hangs: int = 0
    non_json_4xx: int = 0
    raw_non_json_4xx: int = 0
    missing_allow: int = 0
    accepted: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    @property
    def client_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if 400 <= status < 500)

    @property
    def server_error_count(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def _example(self, problem: str, case: Hostile, answer: Answer) -> None:
        if problem not in self.examples:
            what = (
                case.kind if case.raw is not None else f"{case.kind} {case.method} {case.path[:60]}"
            )
            self.examples[problem] = f"{what} -> {answer.status} {answer.body[:160]!r}"

    def record(self, case: Hostile, answer: Answer) -> None:
        self.sent += 1
        if answer.hang:
            self.hangs += 1
            self._example("hang", case, answer)
            return
        if answer.status is None:
            self.dropped += 1
            return
        status = answer.status
        self.statuses[status] += 1
        if status >= 500:
            self.server_errors[
                case.kind.split(":")[0] + ":" + case.kind.split(":", 1)[-1][:40]
            ] += 1
            self._example(f"5xx {status}", case, answer)
        if 400 <= status < 500 and case.method != "HEAD" and not is_json_error(answer):
            if case.raw is None:
                self.non_json_4xx += 1
                self._example("non-JSON 4xx", case, answer)
            else:
                self.raw_non_json_4xx += 1
                self._example("non-JSON 4xx (raw)", case, answer)
        if status == 405 and not any(k.lower() == "allow" for k in answer.headers):
            self.missing_allow += 1
            self._example("405 without Allow", case, answer)
        if 200 <= status < 300 and case.mutating:
            self.accepted[case.kind] += 1
            self._example(f"accepted {case.kind}", case, answer)


async def send_http(
    session: aiohttp.ClientSession,
    address: str,
    case: Hostile,
    *,
    secret: bytes | None,
    receiver: str,
    deadline_s: float,
) -> Answer:
    """Send one HTTP ``case`` (signed with ``secret`` when it says so) and read the answer."""
    headers = dict(case.headers)
    if case.sign == "digest" and secret is not None:
        headers.update(sign(secret, case.method, case.path, case.body, receiver=receiver))
    skip = () if any(k.lower() == "content-type" for k in headers) else ("Content-Type",)
    url = URL(f"http://{address}{case.path}", encoded=True)
    try:
        async with asyncio.timeout(deadline_s):
            async with session.request(
                case.method,
                url,
                data=case.body if case.body or case.method not in ("GET", "HEAD") else None,
                headers=headers,
                skip_auto_headers=skip,
                allow_redirects=False,
            ) as response:
                body = await response.read()
                return Answer(response.status, dict(response.headers), body)
    except TimeoutError:
        return Answer(None, hang=True)
    except (aiohttp.ClientError, OSError, ValueError):
        return Answer(None)


async def send_raw(address: str, data: bytes, *, deadline_s: float) -> Answer:
    """Write ``data`` on a fresh connection, half-close it, and read the first answer."""
    host, port = address.rsplit(":", 1)
    writer = None
    try:
        async with asyncio.timeout(deadline_s):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(data)
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            return await _read_answer(reader)
    except TimeoutError:
        return Answer(None, hang=True)
    except (ConnectionError, OSError):
        return Answer(None)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    """The first final HTTP answer on ``reader`` (``100 Continue`` skipped)."""
    buffer = b""
    while True:
        while b"\r\n\r\n" not in buffer:
            chunk = await reader.read(65536)
            if not chunk:
                return _parse_head(buffer) if buffer else Answer(None)
            buffer += chunk
        head, _, rest = buffer.partition(b"\r\n\r\n")
        answer = _parse_head(head)
        if answer.status == 100:
            buffer = rest
            continue
        length = answer.headers.get("content-length")
        if length is not None and length.isdigit():
            while len(rest) < int(length):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                rest += chunk
            return Answer(answer.status, answer.headers, rest[: int(length)])
        return Answer(answer.status, answer.headers, rest)


def _parse_head(head: bytes) -> Answer:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return Answer(None)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().decode(errors="replace").lower()] = value.strip().decode(
            errors="replace"
        )
    return Answer(int(parts[1]), headers)


async def fuzz_peer(
    attack: str,
    target: PeerProcess,
    *,
    peer_id: str,
    secret: bytes | None,
    requests: int,
    seed: int,
    training: bool,
    concurrency: int = 8,
    deadline_s: float = DEADLINE_S,
) -> Row:
    """Send ``requests`` hostile requests to ``target`` and judge what they did.

    ``training``: the peer trains, so its model changes anyway; an applied exchange shows in
    its count of exchanges served instead of its digest, and its step must keep growing.
    """
    row = Row(attack)
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        probe = Probe(session, target.address, peer_id, secret)
        status = await probe.status()
        generator = HostileRequests(
            random.Random(seed),
            target_id=peer_id,
            numel=int(status["parameters"]),
            dtype=str(status["dtype"]),
            secret=secret,
        )
        members_before = await probe.members()
        digest_before = None if training else await probe.model_digest()
        served_before = await probe.exchanges("callee", "ok")
        step_before = int(status["step"])
        stderr_before = target.stderr_file.stat().st_size if target.stderr_file.exists() else 0
        sampler = MemorySampler(target)
        start_mib = sampler.start()
        tally = Tally()
        cases = iter(generator)
        remaining = requests
        started = time.monotonic()

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0 and target.alive:
                remaining -= 1
                case = next(cases)
                if case.raw is not None:
                    answer = await send_raw(target.address, case.raw, deadline_s=deadline_s)
                else:
                    answer = await send_http(
                        session,
                        target.address,
                        case,
                        secret=secret,
                        receiver=peer_id,
                        deadline_s=deadline_s,
                    )
                tally.record(case, answer)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
        await sampler.stop()
        row.requests = tally.sent
        row.client_errors = tally.client_errors
        row.server_errors = tally.server_error_count
        row.hangs = tally.hangs
        row.crashes = 1 if target.crashed() else 0
        row.peak_mib = sampler.peak
        if target.alive:
            after_mib = await settle_memory(target, start_mib)
            row.memory_after_pct = _percent(after_mib, start_mib)
            members_after = await probe.members()
            row.membership_changes = len(set(members_after) ^ set(members_before))
            served = int(await probe.exchanges("callee", "ok") - served_before)
            if training:
                row.model_changes = served
                step_after = await probe.step()
                row.fail_if(step_after <= step_before, f"training stopped at step {step_after}")
                row.notes.append(f"steps {step_before} -> {step_after} while fuzzed")
            else:
                digest_after = await probe.model_digest()
                row.model_changes = max(served, int(digest_after != digest_before))
        row.check_common()
        accepted = sum(tally.accepted.values())
        row.fail_if(
            accepted > 0,
            f"{accepted} hostile POST(s) answered 2xx: "
            + ", ".join(f"{k} x{n}" for k, n in tally.accepted.most_common(6)),
        )
        non_json = tally.non_json_4xx + tally.raw_non_json_4xx
        row.fail_if(
            non_json > 0,
            f"{non_json} 4xx answers are not the documented JSON error "
            f"({tally.raw_non_json_4xx} of them to broken HTTP on raw sockets)",
        )
        row.fail_if(tally.missing_allow > 0, f"{tally.missing_allow} 405 answers lack Allow")
        with open(target.stderr_file, "rb") as stderr:
            stderr.seek(stderr_before)
            logged = stderr.read()
        tracebacks = logged.count(b"Traceback")
        row.fail_if(
            tracebacks > 0,
            f"{tracebacks} tracebacks logged for refused requests ({len(logged)} bytes of stderr)",
        )
        top = ", ".join(f"{s} x{n}" for s, n in sorted(tally.statuses.items()))
        row.notes.append(
            f"{tally.sent} requests in {elapsed:.0f} s; statuses {top}; "
            f"{tally.dropped} closed unanswered; stderr +{len(logged)} bytes"
        )
        if tally.server_errors:
            row.notes.append(
                "5xx by kind: "
                + ", ".join(f"{k} x{n}" for k, n in tally.server_errors.most_common(8))
            )
        for problem, example in tally.examples.items():
            row.notes.append(f"first {problem}: {example}")
    return row


def _percent(after: float | None, start: float | None) -> float | None:
    if after is None or not start:
        return None
    return 100.0 * (after - start) / start
