"""Attack 2: Schemathesis, the field's OpenAPI fuzzer, over ``peer/openapi.yaml`` against a live peer.

For every operation of the schema it draws positive (schema-valid) and negative
(schema-violating) requests with Schemathesis' Hypothesis strategies, serializes them as
the schema says (msgpack bodies through a serializer registered here), signs them with
the swarm secret as a member would (``peer.protocol.auth``, over the exact bytes sent), sends them,
and runs Schemathesis' response checks: no 5xx, status codes, content types, headers and
bodies that the schema documents, schema-violating requests refused, schema-valid ones
accepted. Every failure is a schema mismatch (the schema or the server is wrong).

Two allowances: a schema-valid exchange refused ``422 shape_mismatch`` or
``dtype_mismatch`` is not a mismatch, since the schema cannot know the receiving peer's
model (its length and dtype); nor is a payload refused ``400 malformed_body`` for a rule
JSON Schema cannot state (the schema states it in the codec's description): a
``chunked-topk`` ``k`` beyond its ``chunk`` (a rule between two fields) or a negative qsgd
scale (a rule on the content of bytes), each checked on the payload drawn. Its ``ignored_auth`` check is not run: it assumes the
generated ``Authorization`` header is junk, and here every request is signed correctly.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import requests

from .processes import PeerProcess
from .signing import sign
from .table import Row

SCHEMA = Path(__file__).resolve().parents[2] / "peer" / "openapi.yaml"
MODEL_DEPENDENT = frozenset({"shape_mismatch", "dtype_mismatch"})


def _register_msgpack() -> None:
    import schemathesis

    @schemathesis.serializer("application/msgpack")
    def _msgpack(context: Any, value: Any) -> bytes:
        return msgpack.packb(_binary_fields(_packable(value)), use_bin_type=True)


def _bytes_properties(node: Any) -> set[str]:
    """Every property name the schema declares ``Bytes`` (``$ref`` to the Bytes schema)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for name, value in (node.get("properties") or {}).items():
            if isinstance(value, dict) and value.get("$ref") == "#/components/schemas/Bytes":
                found.add(name)
        for value in node.values():
            found |= _bytes_properties(value)
    elif isinstance(node, list):
        for value in node:
            found |= _bytes_properties(value)
    return found


BINARY_FIELDS = frozenset(_bytes_properties(json.loads(SCHEMA.read_text())))
"""Payload fields the schema declares ``Bytes`` (``contentEncoding: binary``, msgpack bin),
read from the schema itself, so a codec's new field is covered when the schema gains it."""


def _k_beyond_chunk(body: Any) -> bool:
    """Whether a drawn exchange carries a chunked-topk payload with ``k > chunk``."""
    payload = body.get("payload") if isinstance(body, dict) else None
    if not isinstance(payload, dict) or payload.get("codec") != "chunked-topk":
        return False
    k, chunk = payload.get("k"), payload.get("chunk")
    return isinstance(k, int) and isinstance(chunk, int) and k > chunk


def _negative_scale(body: Any) -> bool:
    """Whether a drawn exchange carries a qsgd payload whose ``scale`` bytes (float32, as
    sent: the serializer turns the drawn string into bytes) hold a negative or non-finite
    scale, which the schema states in words but cannot check (it cannot look into bytes)."""
    payload = body.get("payload") if isinstance(body, dict) else None
    if not isinstance(payload, dict) or payload.get("codec") != "qsgd":
        return False
    scale = payload.get("scale")
    raw = scale.encode("utf-8", "surrogatepass") if isinstance(scale, str) else scale
    if not isinstance(raw, bytes | bytearray) or len(raw) % 4:
        return False
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    return any(not math.isfinite(v) or v < 0 for v in values)


def _binary_fields(value: Any) -> Any:
    """An envelope with its payload's ``Bytes`` strings as bytes: JSON Schema has no bytes
    type, so Schemathesis draws them as strings; on the wire they are msgpack bins."""
    if isinstance(value, dict) and isinstance(value.get("payload"), dict):
        payload = {
            k: v.encode("utf-8", "surrogatepass")
            if k in BINARY_FIELDS and isinstance(v, str)
            else v
            for k, v in value["payload"].items()
        }
        return {**value, "payload": payload}
    return value


def _packable(value: Any) -> Any:
    """``value`` with integers msgpack cannot hold (beyond 64 bits) as floats: a negative
    case stays schema-violating (a float where an integer is required, or out of range)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return float(value)
    if isinstance(value, dict):
        return {_packable(k): _packable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_packable(v) for v in value]
    return value


def _checks() -> list[Any]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi import checks

    return [
        not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_headers_conformance,
        checks.response_schema_conformance,
        checks.negative_data_rejection,
        checks.positive_data_acceptance,
        checks.missing_required_header,
        checks.unsupported_method,
    ]


def _negates_headers(case: Any) -> bool:
    """Whether a negative case's violation is in its headers (the ``Authorization`` header
    the schema declares): then it is sent unsigned, as generated, and must be refused."""
    components = getattr(case.meta, "components", None) or {}
    return any(
        getattr(location, "value", location) == "header"
        and getattr(info.mode, "value", info.mode) == "negative"
        for location, info in components.items()
    )


def _error_code(response: requests.Response) -> str:
    try:
        obj = json.loads(response.content)
    except ValueError:
        return "-"
    return str(obj.get("error", "-")) if isinstance(obj, dict) else "-"


def openapi_fuzz(
    attack: str,
    target: PeerProcess,
    *,
    peer_id: str,
    secret: bytes | None,
    examples: int,
    seed: int,
) -> Row:
    """Run ``examples`` positive and ``examples`` negative cases per operation; one row.

    Blocking (Schemathesis sends through ``requests``): run it in a worker thread.
    """
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from schemathesis import GenerationMode

    _register_msgpack()
    schema = schemathesis.openapi.from_path(str(SCHEMA))
    base_url = f"http://{target.address}"
    row = Row(attack)
    statuses: Counter[int] = Counter()
    mismatches: Counter[tuple[str, str, str]] = Counter()
    examples_seen: dict[tuple[str, str, str], str] = {}
    allowed = 0
    cross_field = 0
    errors: Counter[str] = Counter()
    checks = _checks()
    session = requests.Session()

    def run_case(case: Any) -> None:
        nonlocal allowed, cross_field
        try:
            kwargs = case.as_transport_kwargs(base_url=base_url)
        except Exception as error:  # a body the media type cannot carry
            errors[f"{case.operation.label}: not serializable ({type(error).__name__})"] += 1
            return
        keep = ("method", "url", "headers", "data", "json", "params", "cookies")
        prepared = requests.Request(**{k: v for k, v in kwargs.items() if k in keep}).prepare()
        body = prepared.body or b""
        if isinstance(body, str):
            body = body.encode()
        if secret is not None and not _negates_headers(case):
            prepared.headers.update(
                sign(secret, prepared.method or "GET", prepared.path_url, body, receiver=peer_id)
            )
        try:
            response = session.send(prepared, timeout=15)
        except requests.RequestException as error:
            errors[type(error).__name__] += 1
            row.hangs = (row.hangs or 0) + int(isinstance(error, requests.Timeout))
            return
        row.requests += 1
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks, transport_kwargs={"base_url": base_url})
        except KeyboardInterrupt:
            raise
        except BaseException as group:
            failures = getattr(group, "exceptions", (group,))
            for failure in failures:
                title = str(getattr(failure, "title", type(failure).__name__))
                code = _error_code(response)
                label = f"{case.operation.label} ({case.meta.generation.mode.value if case.meta else '?'})"
                if (
                    "rejected" in title.lower()
                    and case.operation.label == "POST /v1/exchange"
                    and response.status_code == 422
                    and code in MODEL_DEPENDENT
                ):
                    allowed += 1
                    continue
                if (
                    "rejected" in title.lower()
                    and response.status_code == 400
                    and code == "malformed_body"
                    and (_k_beyond_chunk(case.body) or _negative_scale(case.body))
                ):
                    cross_field += 1
                    continue
                key = (label, title, f"{response.status_code} {code}")
                mismatches[key] += 1
                examples_seen.setdefault(key, response.text[:160].replace("\n", " "))

    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @hypothesis_seed(seed)
            @settings(
                max_examples=examples,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def explore(case: Any) -> None:
                run_case(case)

            try:
                explore()
            except Exception as error:  # a generation error of one operation: report it
                reason = type(error).__name__
                if reason == "Unsatisfiable":  # nothing to violate: no body, no parameters
                    reason = "no such case exists"
                errors[f"{operation.label} {mode.value}: {reason}"] += 1
    row.client_errors = sum(n for s, n in statuses.items() if 400 <= s < 500)
    row.server_errors = sum(n for s, n in statuses.items() if s >= 500)
    row.hangs = row.hangs or 0
    row.crashes = 1 if target.crashed() else 0
    row.check_common()
    total = sum(mismatches.values())
    row.fail_if(
        total > 0,
        f"{total} schema mismatch(es) in {len(mismatches)} kind(s) (listed in the notes)",
    )
    row.notes.append(
        "statuses "
        + ", ".join(f"{s} x{n}" for s, n in sorted(statuses.items()))
        + f"; {allowed} schema-valid exchanges refused for the model's size or dtype, "
        f"{cross_field} for a rule the schema cannot check (a chunked-topk k beyond its "
        "chunk, a negative qsgd scale inside its bytes) (allowed)"
    )
    for (label, title, answer), count in mismatches.most_common():
        row.notes.append(
            f"mismatch x{count}: {label}: {title}; answered {answer}: "
            f"{examples_seen[(label, title, answer)]}"
        )
    for what, count in errors.items():
        row.notes.append(f"not drawn x{count}: {what}")
    return row
