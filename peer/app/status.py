"""``gossipnet status URL``: a running peer's ``GET /v1/status``, readable or as JSON.

``URL`` is ``http[s]://HOST:PORT`` or plain ``HOST:PORT`` (http). The endpoint
is open (no secret needed). Exit codes: 0 shown, 1 the peer could not be
reached or did not answer with a status, 2 a malformed URL or bad flags.

    $ gossipnet status 127.0.0.1:7000
    peer a  (127.0.0.1:7000, ad-psgd, protocol v2)
    step 1200  round 1200  loss 0.4312
    ...
    exchanges 1187 ok, 13 failed
    ...

A peer that has stopped averaging (no successful exchange in its last rounds,
``isolated`` in the status) is marked ``ISOLATED`` on the exchanges line.

The command answers in a fraction of a second: this path imports neither torch nor
aiohttp (one GET with the standard library; a test checks that torch stays unloaded).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from peer.app.usage import OneLineParser

__all__ = ["fetch_status", "human_bytes", "main", "parse_url", "render"]


def human_bytes(value: float) -> str:
    """``1536`` -> ``"1.5 KB"`` (powers of 1000, as network rates are quoted)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"  # pragma: no cover


def parse_url(url: str) -> str:
    """The status URL for ``url`` (``HOST:PORT`` or ``http[s]://HOST:PORT[/]``); else ValueError."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            f"URL: scheme {parts.scheme!r} in {url!r}; allowed: http, https (or none: http)"
        )
    if parts.path not in ("", "/", "/v1/status") or parts.query or parts.fragment:
        raise ValueError(f"URL: must be http[s]://HOST:PORT with no path, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if not parts.hostname or port is None or not 1 <= port <= 65535:
        raise ValueError(
            f"URL: must be HOST:PORT with a port in 1..65535 (e.g. 127.0.0.1:7000), got {url!r}"
        )
    return f"{parts.scheme}://{parts.netloc}/v1/status"


def fetch_status(url: str, *, timeout_s: float, cafile: str | None) -> dict[str, Any]:
    """GET the status JSON; ``ConnectionError`` with the reason if that fails."""
    context = None
    if url.startswith("https:"):
        from peer.protocol.tls import client_ssl_context

        context = client_ssl_context(cafile=cafile)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            body = response.read(16 * 1024 * 1024)
    except urllib.error.HTTPError as error:
        raise ConnectionError(f"{url} answered HTTP {error.code}") from None
    except urllib.error.URLError as error:
        reason = error.reason
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        raise ConnectionError(f"cannot reach {url}: {text}") from None
    except OSError as error:  # a timeout is one too
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise ConnectionError(f"cannot reach {url}: {reason}") from None
    try:
        status = json.loads(body)
    except ValueError:
        raise ConnectionError(f"{url} did not answer with JSON") from None
    if not isinstance(status, dict) or "id" not in status:
        raise ConnectionError(f"{url} did not answer with a peer status")
    return status


def render(status: dict[str, Any]) -> str:
    """A readable multi-line summary of a status object."""
    loss = status.get("loss")
    lines = [
        f"peer {status['id']}  ({status.get('address') or 'client-only'}, "
        f"{status.get('algorithm') or status.get('mode')}, protocol v{status.get('v')})",
        f"step {status.get('step')}  round {status.get('round')}  "
        f"loss {'-' if loss is None else f'{loss:.4f}'}",
        f"model {status.get('parameters')} parameters ({status.get('dtype')}), "
        f"compressor {status.get('compressor')}, "
        f"aggregator {status.get('aggregator')}",
        f"traffic {human_bytes(float(status.get('bytes_in', 0)))} in, "
        f"{human_bytes(float(status.get('bytes_out', 0)))} out; "
        f"{'signed' if status.get('authenticated') else 'OPEN swarm (no secret)'}",
    ]
    exchanges = status.get("exchanges")
    if isinstance(exchanges, dict):
        line = f"exchanges {exchanges.get('ok')} ok, {exchanges.get('failed')} failed"
        if status.get("isolated"):
            line += (
                f"  ISOLATED: no successful exchange in {status.get('rounds_without_exchange')} "
                "rounds, training alone"
            )
        lines.append(line)
    privacy = status.get("privacy")
    if isinstance(privacy, dict):  # DP-SGD (docs/privacy.md)
        epsilon, target = privacy.get("epsilon"), privacy.get("target_epsilon")
        line = (
            f"privacy epsilon {'inf' if epsilon is None else f'{epsilon:.4g}'} at delta "
            f"{privacy.get('delta')}, sigma {privacy.get('noise_multiplier')}, "
            f"budget {'none' if target is None else target}"
        )
        if privacy.get("stopped"):
            line += "  STOPPED: one more round would pass the budget"
        lines.append(line)
    if status.get("topology"):
        lines.append(f"topology {status['topology']}, rank {status.get('rank')}")
    members = status.get("neighbours", [])
    lines.append(f"neighbours ({len(members)}):")
    for member in members:
        lines.append(
            f"  {member.get('id'):<24} {member.get('address') or '(client-only)':<24} "
            f"{member.get('status')}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str], prog: str = "gossipnet status") -> int:
    """``gossipnet status URL``: print the peer's status; returns the exit code."""
    parser = OneLineParser(prog=prog, description="Show a running peer's status (GET /v1/status).")
    parser.add_argument("url", metavar="URL", help="http[s]://HOST:PORT or HOST:PORT")
    parser.add_argument("--json", action="store_true", help="print the raw status JSON")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="default 5")
    parser.add_argument("--tls-ca", help="CA file to verify an https peer")
    args = parser.parse_args(list(argv))
    if not args.timeout_s > 0:
        parser.error(f"--timeout-s: must be > 0, got {args.timeout_s}")
    try:
        url = parse_url(args.url)
    except ValueError as error:
        parser.error(str(error))
    try:
        status = fetch_status(url, timeout_s=args.timeout_s, cafile=args.tls_ca)
    except ConnectionError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:  # an unreadable --tls-ca
        parser.error(f"--tls-ca: {args.tls_ca}: {error}")
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0
