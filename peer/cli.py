"""``gossipnet peer``: run one networked peer that trains a workloads model on its shard.

Every :class:`~peer.config.PeerConfig` field has one flag (``round_deadline_s``
-> ``--round-deadline-s``); the workload flags pick the data set, the partition,
this peer's shard and the model. The peer prints one line when it listens
(``peer ID listening on HOST:PORT``); on a terminal a live line (step, loss,
neighbours, bytes/s, drawn by rich on stderr), otherwise a JSON status line on
stdout every ``--status-every`` steps; a final JSON status line always; and it
stops cleanly (final checkpoint with ``--checkpoint-dir``) on SIGTERM or SIGINT
(Ctrl-C). ``--eval-out FILE`` writes the final test loss and accuracy as JSON.
Logs go to stderr (``--log-level``, ``--log-json`` for one JSON object per
line). Exit codes: 0 done or stopped by a signal, 1 could not join the swarm,
2 bad arguments.

Neighbours are drawn at random from the membership view, or with
``--topology NAME --peers FILE --rank R`` from a ``topologies`` graph over the
listed peers (FILE: one ``HOST:PORT`` per line, rank r = line r; the peer
listens on its line and mixes with the graph's weights).

Example, two peers on one machine::

    echo "a-long-swarm-secret-of-32-bytes" > swarm.secret
    gossipnet peer --id a --port 7000 --secret-file swarm.secret --num-peers 2 --peer-index 0 &
    gossipnet peer --id b --port 7001 --join 127.0.0.1:7000 --secret-file swarm.secret \\
        --num-peers 2 --peer-index 1 --steps 500
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gossip.algorithms import ORDERS
from peer.codecs import DENSE_CODECS
from peer.config import ALGORITHMS, MODES, PeerConfig, resolve_device
from peer.node import Peer
from peer.topology import read_peer_list, topology_names
from workloads import Dataset, build_model, load_dataset, partition, peer_batches

DEFAULT_DATASET = "synthetic:num_samples=2000,seed=0"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s --id ID [--port PORT] [--join HOST:PORT] [--steps N] [options]",
        description=(
            "Run one gossip-training peer: listen, join a swarm, train a model on this peer's "
            "shard, and average it with neighbours (async AD-PSGD or sync D-PSGD rounds)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The swarm secret comes from --secret-file or GOSSIPNET_SECRET; without one the "
            "swarm is open (a loud warning). Protocol: docs/protocol.md."
        ),
    )
    peer = parser.add_argument_group("peer (PeerConfig)")
    peer.add_argument("--id", dest="peer_id", required=True, help="peer id, [A-Za-z0-9._:-]{1,64}")
    peer.add_argument("--host", help="listen address (default 127.0.0.1)")
    peer.add_argument("--port", type=int, help="listen port, 0 = ephemeral (default)")
    peer.add_argument("--advertise", metavar="HOST:PORT", help="address others should call")
    peer.add_argument("--client-only", action="store_true", help="never listen; needs --join")
    peer.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="bootstrap peer (repeatable)",
    )
    peer.add_argument(
        "--no-fetch-state",
        dest="fetch_state",
        action="store_false",
        help="keep our own initial model instead of copying the bootstrap peer's",
    )
    peer.add_argument(
        "--algorithm",
        help=f"one of {', '.join(ALGORITHMS)} (default ad-psgd, or from --mode); sets --mode",
    )
    peer.add_argument("--mode", choices=MODES, help="async (ad-psgd, default) or sync (dpsgd)")
    peer.add_argument(
        "--order", choices=ORDERS, help="dpsgd: combine-then-adapt (default) or adapt-then-combine"
    )
    peer.add_argument(
        "--local-steps",
        type=int,
        help="optimizer steps per round (dpsgd: default 1; local-sgd: default 4, >= 2)",
    )
    peer.add_argument(
        "--aggregator",
        help="consensus spec, e.g. trimmed-mean:b=1 (default mean); it must be able to run on "
        "the smallest neighbourhood (ad-psgd: the pair's 2 models)",
    )
    peer.add_argument(
        "--compress",
        "--codec",
        dest="codec",
        help="codec of sent models: "
        + ", ".join(DENSE_CODECS)
        + " (e.g. qsgd:bits=8; default none)",
    )
    peer.add_argument(
        "--consensus-step", type=float, help="choco: consensus step gamma in (0, 1] (default 0.5)"
    )
    peer.add_argument(
        "--byzantine",
        metavar="ATTACK",
        help="evaluation only: act as a Byzantine member that sends this consensus attack "
        "(sign-flip, gaussian:sigma=1, alie, ...; see gossipnet consensus) instead of its "
        "messages; sync algorithms only",
    )
    peer.add_argument("--fanout", type=int, default=1, help="async: neighbours per round")
    peer.add_argument("--round-deadline-s", type=float, default=5.0, help="sync: round deadline")
    peer.add_argument("--seed", type=int, default=0)
    peer.add_argument(
        "--topology",
        help="neighbours from a graph over --peers: " + ", ".join(topology_names()),
    )
    peer.add_argument(
        "--topology-weights", help="metropolis (default, undirected), max-degree, lazy, uniform"
    )
    peer.add_argument(
        "--peers",
        dest="peers_file",
        metavar="FILE",
        help="with --topology: every peer's HOST:PORT, one a line (rank r = line r)",
    )
    peer.add_argument("--rank", type=int, help="with --topology: this peer's line in --peers")
    peer.add_argument("--device", default="cpu", help="auto, cpu, cuda or cuda:INDEX (default cpu)")
    peer.add_argument(
        "--max-concurrent-exchanges",
        type=int,
        default=8,
        help="exchanges served at once, more get 409 busy (default 8)",
    )
    peer.add_argument("--request-timeout-s", type=float, default=10.0)
    peer.add_argument("--suspect-after", type=int, default=1)
    peer.add_argument("--evict-after", type=int, default=3)
    peer.add_argument("--secret-file", help="file holding the swarm secret (>= 16 bytes)")
    peer.add_argument("--clock-window-s", type=int, default=60)
    peer.add_argument("--tls-cert")
    peer.add_argument("--tls-key")
    peer.add_argument("--tls-ca")
    peer.add_argument("--max-body-factor", type=float, default=2.0)
    peer.add_argument("--checkpoint-dir")
    peer.add_argument("--checkpoint-every", type=int, default=0, help="steps, 0 = only at stop")
    peer.add_argument("--keep-checkpoints", type=int, default=3)
    peer.add_argument(
        "--resume", action="store_true", help="start from the newest valid checkpoint"
    )
    work = parser.add_argument_group("workload")
    work.add_argument("--dataset", default=DEFAULT_DATASET, help=f"default {DEFAULT_DATASET}")
    work.add_argument("--partition", default="iid", help="iid, dirichlet:alpha=0.5, shards:...")
    work.add_argument("--num-peers", type=int, default=1, help="shards the data is split into")
    work.add_argument("--peer-index", type=int, default=0, help="this peer's shard, 0-based")
    work.add_argument("--model", default="mlp", help="workloads model name (default mlp)")
    work.add_argument("--batch-size", type=int, default=32)
    work.add_argument("--lr", type=float, default=0.05)
    work.add_argument("--momentum", type=float, default=0.9)
    run = parser.add_argument_group("run")
    run.add_argument("--steps", type=int, default=0, help="optimizer steps, 0 = until a signal")
    run.add_argument("--status-every", type=int, default=50, help="steps between status lines")
    run.add_argument("--address-file", help="write HOST:PORT here once listening (for scripts)")
    run.add_argument(
        "--hold",
        action="store_true",
        help="after --steps, keep serving neighbours (not training) until SIGTERM/SIGINT",
    )
    run.add_argument(
        "--wait-for-peers",
        type=int,
        default=0,
        metavar="K",
        help="before training, wait (up to 60 s) until K other peers are alive",
    )
    run.add_argument(
        "--eval-out",
        metavar="FILE",
        help="at the end, write the test loss and accuracy as JSON to FILE",
    )
    run.add_argument(
        "--progress",
        choices=("auto", "live", "lines"),
        default="auto",
        help="live: one rich line on stderr; lines: JSON lines on stdout; auto: live on a TTY",
    )
    run.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="WARNING",
        help="logging to stderr (default WARNING)",
    )
    run.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    run.add_argument("-v", "--verbose", action="store_true", help="same as --log-level INFO")
    return parser


CONFIG_FIELDS = (
    "peer_id", "client_only", "fetch_state", "order", "algorithm",
    "local_steps", "aggregator", "codec", "consensus_step", "byzantine", "fanout", "round_deadline_s", "seed", "topology",
    "topology_weights", "rank", "device", "max_concurrent_exchanges",
    "request_timeout_s", "suspect_after", "evict_after", "secret_file", "clock_window_s",
    "tls_cert", "tls_key", "tls_ca", "max_body_factor", "checkpoint_dir", "checkpoint_every",
    "keep_checkpoints", "resume",
)  # fmt: skip
FLAG_NAMES = {"peer_id": "--id", "codec": "--compress", "peer_list": "--peers"}
"""Config fields whose flag is not ``--`` + the field name with dashes."""


def flag_message(error: Exception) -> str:
    """A ``PeerConfig`` error with each ``PeerConfig.field`` written as its flag."""
    return re.sub(
        r"PeerConfig\.(\w+)",
        lambda m: FLAG_NAMES.get(m[1], "--" + m[1].replace("_", "-")),
        str(error),
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and exception text)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, as_json: bool) -> None:
    """Log to stderr at ``level``, as text or one JSON object per line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def _network(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """host, port, advertise, join and peer_list: from the flags, or from ``--peers``/``--rank``."""
    network: dict[str, Any] = {
        "host": args.host or "127.0.0.1",
        "port": args.port if args.port is not None else 0,
        "advertise": args.advertise,
        "join": tuple(args.join),
        "peer_list": (),
    }
    if args.peers_file is None:
        if args.topology is not None or args.rank is not None:
            parser.error("--topology and --rank need --peers FILE (one HOST:PORT a line)")
        return network
    if args.topology is None:
        parser.error("--peers FILE needs --topology (e.g. --topology ring)")
    if args.rank is None:
        parser.error("--peers FILE needs --rank R (this peer's line, 0-based)")
    try:
        addresses = read_peer_list(args.peers_file)
    except ValueError as error:
        parser.error(str(error))
    if not 0 <= args.rank < len(addresses):
        parser.error(
            f"--rank must be in [0, {len(addresses)}) for the {len(addresses)} peers in "
            f"{args.peers_file}, got {args.rank}"
        )
    own = addresses[args.rank]
    own_host, _, own_port = own.rpartition(":")
    local = own_host in ("127.0.0.1", "localhost", "[::1]")
    network.update(
        host=args.host or ("127.0.0.1" if local else "0.0.0.0"),
        port=int(own_port) if args.port is None else args.port,
        advertise=args.advertise or own,
        join=tuple(args.join) or tuple(a for a in addresses if a != own),
        peer_list=addresses,
    )
    return network


def main(argv: Sequence[str], prog: str = "gossipnet peer") -> int:
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    configure_logging("INFO" if args.verbose else args.log_level, args.log_json)
    network = _network(args, parser)
    try:
        config = PeerConfig(
            mode=args.mode,
            **network,
            **{name: getattr(args, name) for name in CONFIG_FIELDS},
        )
    except ValueError as error:
        parser.error(flag_message(error))
    for name in ("steps", "status_every", "batch_size", "num_peers", "wait_for_peers"):
        minimum = 0 if name in ("steps", "wait_for_peers") else 1
        if getattr(args, name) < minimum:
            parser.error(
                f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(args, name)}"
            )
    if not 0 <= args.peer_index < args.num_peers:
        parser.error(
            f"--peer-index must be in [0, --num-peers={args.num_peers}), got {args.peer_index}"
        )
    try:
        peer, data = _build_peer(args, config)
    except (ValueError, OSError) as error:
        parser.error(flag_message(error) if "PeerConfig." in str(error) else str(error))
    try:
        return asyncio.run(_run(peer, data, args))
    except ConnectionError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1


def _build_peer(args: argparse.Namespace, config: PeerConfig) -> tuple[Peer, Dataset]:
    torch.set_num_threads(1)
    data = load_dataset(args.dataset)
    shards = partition(args.partition, data.y_train, num_peers=args.num_peers, seed=args.seed)
    model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
    lr, momentum = args.lr, args.momentum

    def optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, momentum=momentum)

    batches = peer_batches(
        data,
        shards[args.peer_index],
        batch_size=args.batch_size,
        seed=args.seed,
        peer=args.peer_index,
    )
    try:  # checked when a peer is built; named by flag here
        resolve_device(config.device)
    except ValueError as error:
        raise ValueError(f"--device: {error}") from None
    peer = Peer(model, optimizer, torch.nn.functional.cross_entropy, batches, config)
    return peer, data


async def _run(peer: Peer, data: Dataset, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    live = args.progress == "live" or (args.progress == "auto" and sys.stderr.isatty())
    await peer.start()
    rate = _Rate(peer)
    progress = asyncio.ensure_future(_live_line(peer, rate, stop)) if live else None
    try:
        where = peer.address or "(client-only)"
        print(f"peer {peer.peer_id} listening on {where}", flush=True)
        if peer.resumed_from is not None:
            print(f"resumed from {peer.resumed_from} at step {peer.step}", flush=True)
        if args.address_file and peer.address:
            temp = Path(args.address_file + ".tmp")
            temp.write_text(peer.address)
            temp.replace(args.address_file)
        stopping = asyncio.ensure_future(stop.wait())
        if args.wait_for_peers:
            waiting = asyncio.ensure_future(peer.wait_for_members(args.wait_for_peers))
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        target = peer.step + args.steps if args.steps else None
        while not stop.is_set() and (target is None or peer.step < target):
            chunk = (
                args.status_every if target is None else min(args.status_every, target - peer.step)
            )
            training = asyncio.ensure_future(peer.run(steps=chunk))
            await asyncio.wait({training, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                training.cancel()
                await asyncio.gather(training, return_exceptions=True)
                break
            training.result()
            if not live:
                print(json.dumps(_status_line(peer, rate)), flush=True)
        if args.hold and not stop.is_set():
            print(json.dumps({**_status_line(peer, rate), "holding": True}), flush=True)
            await stopping
        stopping.cancel()
    finally:
        if progress is not None:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
        await peer.stop()
    final: dict[str, object] = {**_status_line(peer, rate), "stopped": True}
    if args.eval_out:
        result = await asyncio.to_thread(peer.evaluate, data.x_test, data.y_test)
        report = {
            "id": peer.peer_id,
            "step": peer.step,
            "test_loss": result["loss"],
            "test_accuracy": result["accuracy"],
            "test_samples": int(result["samples"]),
            "batch_size": args.batch_size,
            "exchanges_ok": peer.health.exchanges_ok,
            "exchanges_failed": peer.health.exchanges_failed,
            "isolated": peer.health.isolated,
            "byzantine": peer.config.byzantine,
        }
        temp = Path(args.eval_out + ".tmp")
        temp.write_text(json.dumps(report))
        temp.replace(args.eval_out)
        final["test_accuracy"] = result["accuracy"]
    print(json.dumps(final), flush=True)
    return 0


class _Rate:
    """Bytes per second (in + out) since the previous reading."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.last = (time.monotonic(), self._total())
        self.value = 0.0

    def _total(self) -> float:
        return self.peer.metrics.bytes_total("in") + self.peer.metrics.bytes_total("out")

    def read(self) -> float:
        now, total = time.monotonic(), self._total()
        then, before = self.last
        if now - then >= 0.2:
            self.value = (total - before) / (now - then)
            self.last = (now, total)
        return self.value


async def _live_line(peer: Peer, rate: _Rate, stop: asyncio.Event) -> None:
    """One line on stderr, redrawn twice a second by rich: step, loss, neighbours, bytes/s."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    def line() -> Text:
        status = _status_line(peer, rate)
        loss = status["loss"]
        neighbours = status["neighbours"]
        assert isinstance(neighbours, list)
        return Text(
            f"peer {peer.peer_id}  step {status['step']}  "
            f"loss {'-' if loss is None else f'{loss:.4f}'}  "
            f"neighbours {len(neighbours)}  {human_bytes(rate.read())}/s"
        )

    with Live(line(), console=Console(stderr=True), auto_refresh=False) as live:
        try:
            while not stop.is_set():
                live.update(line(), refresh=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
        finally:  # the last frame stays on screen: the final state
            live.update(line(), refresh=True)


def human_bytes(value: float) -> str:
    """``1536`` -> ``"1.5 KB"`` (powers of 1000, as network rates are quoted)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"  # pragma: no cover


def _status_line(peer: Peer, rate: _Rate | None = None) -> dict[str, object]:
    status = peer.status()
    line = {
        key: status[key] for key in ("id", "round", "step", "loss", "bytes_in", "bytes_out")
    } | {"neighbours": [m["id"] for m in status["neighbours"] if m["status"] != "evicted"]}
    if rate is not None:
        line["bytes_per_s"] = round(rate.read(), 1)
    return line


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
