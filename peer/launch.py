"""``gossipnet launch`` and ``gossipnet demo``: a local swarm of real peer processes.

``launch --peers N`` starts N ``gossipnet peer`` OS processes on 127.0.0.1, all in
one process group: ``peer-0`` is the bootstrap and the others ``--join`` it (or,
with ``--topology``, every rank gets a port in a generated peer file and mixes
with the graph's weights). A fresh 32-byte swarm secret is written to a file
readable only by the user and passed with ``--secret-file``; peer i trains on
shard i (``--num-peers N --peer-index i``). While they run, a live table
(rich) shows each peer's step, loss, neighbours and bytes/s, polled from its
``GET /v1/status``; meanwhile the launcher trains one *centralized* model on all
the data with the peers' combined batch (N x batch size) for as many steps, i.e.
on the same number of samples. At the end every peer writes its test accuracy
(``gossipnet peer --eval-out``) and the launcher prints each beside the
centralized one. Ctrl-C (or SIGTERM) stops the swarm cleanly: SIGTERM to the
group, a grace period for the final checkpoints, then SIGKILL, no orphans.

``demo`` is ``launch`` with defaults picked to finish in about a minute on two
CPU cores: 4 peers, MNIST-1D, an MLP, asynchronous AD-PSGD.

Exit codes: 0 every peer finished, 1 a peer failed (its last stderr line is
shown), 2 bad arguments, 130 stopped by Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from peer.config import ALGORITHMS, MODES
from peer.topology import topology_names

DEMO_DEFAULTS = (
    "--peers", "4", "--dataset", "mnist1d:num_samples=4000", "--model", "mlp",
    "--steps", "600", "--batch-size", "32", "--lr", "0.05", "--momentum", "0.9",
    "--algorithm", "ad-psgd",
)  # fmt: skip
"""What ``gossipnet demo`` runs (any of it can be overridden on the command line)."""
GRACE_S = 15.0
"""How long stopped peers get to checkpoint and exit before SIGKILL."""
PASS_THROUGH = (
    "algorithm", "mode", "compress", "aggregator", "local_steps", "fanout", "round_deadline_s",
    "topology", "topology_weights", "dataset", "partition", "model", "batch_size", "lr",
    "momentum", "seed", "steps", "device", "checkpoint_every", "log_level",
)  # fmt: skip
"""Launcher options handed to every peer unchanged (``--lr 0.1`` -> ``--lr 0.1``)."""


def cache_dir() -> Path:
    """Where generated data sets are cached: ``$GOSSIPNET_CACHE``, else ``~/.cache/gossipnet``."""
    base = os.environ.get("GOSSIPNET_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gossipnet"
    )
    return Path(base)


def with_cache(dataset: str) -> str:
    """An ``mnist1d`` spec with a ``cache_dir``, so N peers do not each regenerate it."""
    name, _, rest = dataset.partition(":")
    if name.strip() != "mnist1d" or "cache_dir" in rest:
        return dataset
    path = cache_dir() / "mnist1d"
    return f"{name}:{rest + ',' if rest else ''}cache_dir={path}"


def _parser(prog: str, demo: bool) -> argparse.ArgumentParser:
    what = "the demo" if demo else "a local swarm"
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            f"Run {what}: N gossipnet peer processes on 127.0.0.1 train one model together; "
            "a live table shows their progress, and at the end each peer's test accuracy is "
            "printed beside a centralized run on the same data and number of samples."
        ),
        epilog="Every option but --peers, --client-only, --dir, --json, --progress and "
        "--peer-args is passed to each peer unchanged. Guide: docs/peer.md.",
    )
    swarm = parser.add_argument_group("swarm")
    swarm.add_argument("--peers", type=int, default=4, help="number of peer processes (2-64)")
    swarm.add_argument(
        "--client-only", type=int, default=0, metavar="K", help="the last K peers never listen"
    )
    swarm.add_argument("--algorithm", help=", ".join(ALGORITHMS) + " (default ad-psgd)")
    swarm.add_argument("--mode", choices=MODES)
    swarm.add_argument("--compress", help="none, fp16, bf16, qsgd:bits=B")
    swarm.add_argument("--aggregator", help="consensus spec, e.g. trimmed-mean:b=1")
    swarm.add_argument("--local-steps", type=int)
    swarm.add_argument("--fanout", type=int)
    swarm.add_argument("--round-deadline-s", type=float)
    swarm.add_argument("--topology", help="one of " + ", ".join(topology_names()))
    swarm.add_argument("--topology-weights")
    swarm.add_argument("--device", help="auto, cpu, cuda, cuda:I")
    swarm.add_argument("--checkpoint-every", type=int, help="steps (checkpoints in --dir)")
    swarm.add_argument("--log-level", help="peers' log level (their stderr goes to --dir)")
    swarm.add_argument(
        "--peer-args", default="", metavar="ARGS", help="more peer flags, one shell-quoted string"
    )
    work = parser.add_argument_group("workload")
    work.add_argument("--dataset", default="mnist1d:num_samples=4000")
    work.add_argument("--partition", default="iid")
    work.add_argument("--model", default="mlp")
    work.add_argument("--batch-size", type=int, default=32)
    work.add_argument("--lr", type=float, default=0.05)
    work.add_argument("--momentum", type=float, default=0.9)
    work.add_argument("--seed", type=int, default=0)
    work.add_argument("--steps", type=int, default=500, help="optimizer steps per peer")
    out = parser.add_argument_group("output")
    out.add_argument(
        "--dir", help="keep the run's files here (logs, results, checkpoints); default: temporary"
    )
    out.add_argument(
        "--progress",
        choices=("auto", "live", "lines", "none"),
        default="auto",
        help="live table (rich), plain lines every few seconds, or nothing; auto: live on a TTY",
    )
    out.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    return parser


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if not 2 <= args.peers <= 64:
        parser.error(f"--peers must be an integer in [2, 64], got {args.peers}")
    if not 0 <= args.client_only < args.peers:
        parser.error(f"--client-only must be in [0, --peers={args.peers}), got {args.client_only}")
    if args.client_only and args.topology:
        parser.error("--client-only cannot be combined with --topology (every rank listens)")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a finite number > 0, got {args.lr}")
    try:
        shlex.split(args.peer_args)
    except ValueError as error:
        parser.error(f"--peer-args must be shell-quoted flags: {error}")
    _check_peer_options(args, parser)


def _check_peer_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The options every peer gets, checked here with the peers' own validation (PeerConfig,
    hence ``gossip.GossipConfig``, the simulator's too): one clear line now, not N failed
    peers after the baseline has trained."""
    from gossip.configuration import ConfigurationError
    from peer.cli import flag_message
    from peer.config import PeerConfig

    addresses = tuple(f"127.0.0.1:{7000 + i}" for i in range(args.peers))
    options: dict[str, Any] = {
        "algorithm": args.algorithm,
        "mode": args.mode,
        "aggregator": args.aggregator,
        "codec": args.compress,
        "local_steps": args.local_steps,
        "fanout": args.fanout if args.fanout is not None else 1,
        "round_deadline_s": args.round_deadline_s if args.round_deadline_s is not None else 5.0,
        "device": args.device or "cpu",
        "seed": args.seed,
    }
    if args.topology:
        options.update(
            topology=args.topology,
            topology_weights=args.topology_weights,
            peer_list=addresses,
            rank=0,
        )
    try:
        config = PeerConfig(peer_id="peer-0", **options)
        if not args.topology and config.mode == "sync":
            # without a topology a sync peer mixes every other member: N models in all
            config.gossip.check_neighbourhood(
                args.peers, where=f"--peers {args.peers} without --topology"
            )
    except ConfigurationError as error:
        parser.error(f"--{error.field.replace('_', '-')}: {error.reason}")
    except (ValueError, TypeError) as error:
        parser.error(flag_message(error))
    if args.device and args.device != "cpu":
        from peer.config import resolve_device

        try:
            resolve_device(args.device)
        except ValueError as error:
            parser.error(f"--device: {error}")


# --------------------------------------------------------------------------- processes


@dataclass
class PeerProcess:
    """One child ``gossipnet peer`` and the files it writes in the run directory."""

    index: int
    peer_id: str
    process: subprocess.Popen[bytes]
    directory: Path
    client_only: bool
    address: str | None = None
    status: dict[str, Any] = field(default_factory=dict)
    rate: float = 0.0
    last_bytes: tuple[float, float] | None = None

    @property
    def stdout(self) -> Path:
        return self.directory / f"{self.peer_id}.out"

    @property
    def stderr(self) -> Path:
        return self.directory / f"{self.peer_id}.err"

    @property
    def eval_file(self) -> Path:
        return self.directory / f"{self.peer_id}.eval.json"

    @property
    def address_file(self) -> Path:
        return self.directory / f"{self.peer_id}.address"

    def last_error(self) -> str:
        lines = [line for line in _read(self.stderr).splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {self.process.returncode}"

    def last_status_line(self) -> dict[str, Any]:
        for line in reversed(_read(self.stdout).splitlines()):
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    loaded = json.loads(line)
                    if isinstance(loaded, dict):
                        return loaded
        return {}


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Swarm:
    """The children of one launch, in one process group (stopped together, never orphaned)."""

    def __init__(self, args: argparse.Namespace, directory: Path) -> None:
        self.args = args
        self.directory = directory
        self.peers: list[PeerProcess] = []
        self.group: int | None = None
        self.secret_file = directory / "swarm.secret"
        fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(secrets.token_hex(32))
        self.peer_file: Path | None = None
        if args.topology:
            self.peer_file = directory / "peers.txt"
            ports = free_ports(args.peers)
            self.peer_file.write_text("".join(f"127.0.0.1:{port}\n" for port in ports))

    def _common(self, index: int) -> list[str]:
        args = self.args
        flags: list[str] = []
        for name in PASS_THROUGH:
            value = getattr(args, name)
            if value is not None:
                flags += ["--" + name.replace("_", "-"), str(value)]
        flags += [
            "--id", f"peer-{index}", "--num-peers", str(args.peers), "--peer-index", str(index),
            "--secret-file", str(self.secret_file), "--progress", "lines",
            "--status-every", str(max(1, args.steps // 10)),
            "--wait-for-peers", str(args.peers - 1),
            "--eval-out", str(self.directory / f"peer-{index}.eval.json"),
        ]  # fmt: skip
        if args.algorithm in (None, "ad-psgd") and args.mode in (None, "async"):
            # Finished peers keep answering until every peer is done (then SIGTERM), so
            # no straggler ends its run averaging with nobody.
            flags.append("--hold")
        if args.checkpoint_every:
            flags += ["--checkpoint-dir", str(self.directory / f"peer-{index}.checkpoints")]
        if self.peer_file is not None:
            flags += ["--peers", str(self.peer_file), "--rank", str(index)]
        return [*flags, *shlex.split(args.peer_args)]

    def spawn(self, index: int, extra: Sequence[str]) -> PeerProcess:
        peer_id = f"peer-{index}"
        command = [sys.executable, "-m", "gossipnet", "peer", *self._common(index), *extra]
        (self.directory / f"{peer_id}.command").write_text(shlex.join(command) + "\n")
        with (
            open(self.directory / f"{peer_id}.out", "wb") as out,
            open(self.directory / f"{peer_id}.err", "wb") as err,
        ):
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                process_group=0 if self.group is None else self.group,
            )
        if self.group is None:
            self.group = process.pid
        (self.directory / f"{peer_id}.pid").write_text(f"{process.pid}\n")
        client_only = "--client-only" in extra
        peer = PeerProcess(index, peer_id, process, self.directory, client_only)
        self.peers.append(peer)
        return peer

    def signal_all(self, sig: int) -> None:
        if self.group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.group, sig)

    def alive(self) -> list[PeerProcess]:
        return [p for p in self.peers if p.process.poll() is None]

    def stop(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM the group, wait ``grace_s`` for clean exits, then SIGKILL what is left."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            self.signal_all(signal.SIGKILL)
        for peer in self.peers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                peer.process.wait(timeout=5)


# --------------------------------------------------------------------------- centralized


@dataclass
class Centralized:
    """The reference: one model on all training data, batch N x B, the peers' step count."""

    accuracy: float | None = None
    loss: float | None = None
    samples: int = 0
    error: str | None = None


def train_centralized(
    args: argparse.Namespace, dataset: str, result: Centralized, stop: threading.Event | None = None
) -> None:
    """Train the reference model in this process (one thread; the launcher is idle anyway).

    Setting ``stop`` ends it early (Ctrl-C): ``result.error`` then says so.
    """
    try:
        import torch

        from workloads import build_model, load_dataset, peer_batches

        torch.set_num_threads(1)
        data = load_dataset(dataset)
        model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        batch = args.peers * args.batch_size
        indices = torch.arange(int(data.y_train.shape[0]))
        batches = peer_batches(data, indices, batch_size=batch, seed=args.seed, peer=args.peers)
        for _, (x, y) in zip(range(args.steps), batches, strict=False):
            if stop is not None and stop.is_set():
                result.error = "stopped before the end"
                return
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            output = model(data.x_test)
            result.loss = float(torch.nn.functional.cross_entropy(output, data.y_test))
            result.accuracy = float((output.argmax(-1) == data.y_test).float().mean())
        result.samples = args.steps * batch
    except Exception as error:  # shown in the final table instead of a traceback
        result.error = f"{type(error).__name__}: {error}"


# --------------------------------------------------------------------------- progress


async def _poll(session: aiohttp.ClientSession, peer: PeerProcess) -> None:
    if peer.address is None and not peer.client_only and peer.address_file.exists():
        peer.address = _read(peer.address_file).strip() or None
    status: dict[str, Any] = {}
    if peer.address is not None and peer.process.poll() is None:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
            async with session.get(f"http://{peer.address}/v1/status") as response:
                if response.status == 200:
                    status = await response.json()
    if not status:
        status = peer.last_status_line()
    if not status:
        return
    total = float(status.get("bytes_in", 0)) + float(status.get("bytes_out", 0))
    now = time.monotonic()
    if peer.last_bytes is not None and now > peer.last_bytes[0]:
        peer.rate = max(0.0, (total - peer.last_bytes[1]) / (now - peer.last_bytes[0]))
    peer.last_bytes = (now, total)
    peer.status = status


def _finished(peer: PeerProcess, steps: int) -> bool:
    """Exited, or reached ``steps`` (a holding peer waits for the launcher's SIGTERM)."""
    return peer.process.poll() is not None or int(peer.status.get("step", 0)) >= steps


def _neighbours(status: dict[str, Any]) -> int:
    listed = status.get("neighbours", [])
    if listed and isinstance(listed[0], dict):
        return sum(1 for m in listed if m.get("status") != "evicted")
    return len(listed)


def _row(peer: PeerProcess) -> list[str]:
    from peer.cli import human_bytes

    status = peer.status
    code = peer.process.poll()
    state = "running" if code is None else ("done" if code == 0 else f"exit {code}")
    loss = status.get("loss")
    exchanges = status.get("exchanges")
    if not isinstance(exchanges, dict):  # not polled yet, or a client-only peer's status line
        exchanges = {}
    return [
        peer.peer_id
        + (" (client-only)" if peer.client_only else "")
        + (" ISOLATED" if status.get("isolated") else ""),
        str(status.get("step", "-")),
        "-" if loss is None else f"{loss:.4f}",
        str(_neighbours(status)) if status else "-",
        str(exchanges.get("ok", "-")),
        str(exchanges.get("failed", "-")),
        human_bytes(peer.rate) + "/s",
        state,
    ]


def _table(swarm: Swarm) -> Any:
    """The live table; an isolated peer (no successful exchange lately) is shown in bold red."""
    from rich.table import Table

    table = Table(title=f"gossipnet swarm ({len(swarm.peers)} peers)")
    columns = ("peer", "step", "loss", "neighbours", "exchanges ok", "failed", "bytes/s", "state")
    for column in columns:
        table.add_column(column, justify="left" if column in ("peer", "state") else "right")
    for peer in swarm.peers:
        table.add_row(*_row(peer), style="bold red" if peer.status.get("isolated") else None)
    return table


async def _watch(swarm: Swarm, mode: str, stop: asyncio.Event) -> None:
    """Poll every peer until all exited or ``stop`` is set; draw the progress."""
    timeout = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        live = None
        if mode == "live":
            from rich.console import Console
            from rich.live import Live

            live = Live(_table(swarm), console=Console(stderr=True), auto_refresh=False)
            live.start()
        last_line = time.monotonic()
        try:
            while swarm.alive() and not stop.is_set():
                await asyncio.gather(*(_poll(session, p) for p in swarm.peers))
                if all(_finished(p, swarm.args.steps) for p in swarm.peers):
                    break
                if live is not None:
                    live.update(_table(swarm), refresh=True)
                elif mode == "lines" and time.monotonic() - last_line >= 5.0:
                    last_line = time.monotonic()
                    parts = [
                        f"{row[0]} step {row[1]} loss {row[2]}" for row in map(_row, swarm.peers)
                    ]
                    print("progress: " + "; ".join(parts), file=sys.stderr, flush=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            await asyncio.gather(*(_poll(session, p) for p in swarm.peers))
            if live is not None:
                live.update(_table(swarm), refresh=True)
        finally:
            if live is not None:
                live.stop()


# --------------------------------------------------------------------------- run


async def _wait_for_address(
    peer: PeerProcess, stop: asyncio.Event, timeout_s: float = 120.0
) -> str | None:
    """The bootstrap's ``HOST:PORT`` once it listens; ``None`` if ``stop`` is set first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = _read(peer.address_file).strip()
        if text:
            return text
        if peer.process.poll() is not None:
            raise RuntimeError(f"{peer.peer_id} exited before listening: {peer.last_error()}")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
        if stop.is_set():
            return None
    raise RuntimeError(f"{peer.peer_id} did not start listening within {timeout_s:.0f} s")


async def _launch(swarm: Swarm, args: argparse.Namespace, progress: str) -> bool:
    """Start the peers, watch them; True if stopped by a signal."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    first_listening = args.client_only < args.peers
    listening = args.peers - args.client_only
    extras: list[list[str]] = []
    for index in range(args.peers):
        extra = ["--address-file", str(swarm.directory / f"peer-{index}.address")]
        if index >= listening:
            extra = ["--client-only"]
        extras.append(extra)
    if swarm.peer_file is not None:  # every rank knows every address: start all at once
        for index in range(args.peers):
            swarm.spawn(index, extras[index])
    else:
        bootstrap = swarm.spawn(0, extras[0])
        assert first_listening
        address = await _wait_for_address(bootstrap, stop)
        if address is None:
            return True
        for index in range(1, args.peers):
            swarm.spawn(index, [*extras[index], "--join", address])
    if progress != "none" and progress != "live":
        print(
            f"launched {args.peers} peers (files in {swarm.directory}); {args.steps} steps each",
            file=sys.stderr,
            flush=True,
        )
    await _watch(swarm, progress, stop)
    return stop.is_set()


def _results(swarm: Swarm, centralized: Centralized) -> dict[str, Any]:
    peers = []
    for peer in swarm.peers:
        entry: dict[str, Any] = {
            "id": peer.peer_id,
            "client_only": peer.client_only,
            "exit_code": peer.process.returncode,
        }
        text = _read(peer.eval_file)
        if text:
            report = json.loads(text)
            entry.update(step=report["step"], test_accuracy=report["test_accuracy"])
            entry["test_loss"] = report["test_loss"]
            for key in ("exchanges_ok", "exchanges_failed", "isolated"):
                entry[key] = report.get(key)
        elif peer.process.returncode not in (0, None):
            entry["error"] = peer.last_error()
        peers.append(entry)
    accuracies = [p["test_accuracy"] for p in peers if "test_accuracy" in p]
    return {
        "peers": peers,
        "centralized": {
            "test_accuracy": centralized.accuracy,
            "test_loss": centralized.loss,
            "samples": centralized.samples,
            "error": centralized.error,
        },
        "mean_test_accuracy": sum(accuracies) / len(accuracies) if accuracies else None,
        "directory": str(swarm.directory),
    }


def _count(value: object) -> str:
    """A count for the results table; ``-`` if the peer did not report it."""
    return "-" if value is None else str(value)


def _print_results(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The final table: per peer its step, test accuracy, gap to the centralized run, exchanges.

    The exchange columns are the peer's successful and failed exchanges over the run; a
    peer that ended isolated (training alone, :mod:`peer.health`) is marked ``ISOLATED``.
    """
    from rich.console import Console
    from rich.table import Table

    reference = results["centralized"]["test_accuracy"]
    table = Table(title=f"test accuracy after {args.steps} steps of batch {args.batch_size}")
    for column in ("", "step", "test accuracy", "vs centralized", "exchanges ok", "failed"):
        table.add_column(column, justify="left" if not column else "right")
    for entry in results["peers"]:
        accuracy = entry.get("test_accuracy")
        if accuracy is None:
            table.add_row(entry["id"], "-", entry.get("error", "no result"), "-", "-", "-")
            continue
        diff = "-" if reference is None else f"{100 * (accuracy - reference):+.1f} pts"
        isolated = bool(entry.get("isolated"))
        table.add_row(
            entry["id"] + (" ISOLATED" if isolated else ""),
            str(entry["step"]),
            f"{100 * accuracy:.1f}%",
            diff,
            _count(entry.get("exchanges_ok")),
            _count(entry.get("exchanges_failed")),
            style="bold red" if isolated else None,
        )
    if reference is not None:
        samples = results["centralized"]["samples"]
        table.add_row(
            "centralized",
            str(args.steps),
            f"{100 * reference:.1f}%",
            f"batch {args.peers * args.batch_size}, {samples} samples",
            "-",
            "-",
        )
    elif results["centralized"]["error"]:
        table.add_row("centralized", "-", results["centralized"]["error"], "-", "-", "-")
    Console(width=max(100, os.get_terminal_size(sys.stdout.fileno()).columns)
            if sys.stdout.isatty() else 100).print(table)  # fmt: skip


def main(argv: Sequence[str], prog: str = "gossipnet launch", *, demo: bool = False) -> int:
    parser = _parser(prog, demo)
    args = parser.parse_args([*(DEMO_DEFAULTS if demo else ()), *argv])
    _check(args, parser)
    progress = args.progress
    if progress == "auto":
        progress = "live" if sys.stderr.isatty() else "lines"
    dataset = with_cache(args.dataset)
    try:
        from workloads import load_dataset

        load_dataset(dataset)  # fail fast on a bad spec; fills the cache for the peers
    except (ValueError, ImportError, OSError) as error:
        parser.error(f"--dataset: {error}")
    args.dataset = dataset
    keep = args.dir is not None
    if keep:
        directory = Path(args.dir)
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="gossipnet-launch-"))
    swarm = Swarm(args, directory)
    centralized = Centralized()
    halt = threading.Event()
    reference = threading.Thread(
        target=train_centralized, args=(args, dataset, centralized, halt), daemon=True
    )
    reference.start()
    interrupted = False
    failed: str | None = None
    try:
        interrupted = asyncio.run(_launch(swarm, args, progress))
    except RuntimeError as error:
        failed = str(error)
    finally:
        if interrupted or failed:
            halt.set()
        swarm.stop(GRACE_S)
    reference.join()
    results = _results(swarm, centralized)
    _print_results(results, args)
    bad = [p for p in results["peers"] if p["exit_code"] not in (0, -signal.SIGTERM)]
    if args.json:
        print(json.dumps(results), flush=True)
    if failed is not None:
        print(f"{prog}: error: {failed}", file=sys.stderr)
    for entry in bad:
        print(f"{prog}: {entry['id']} failed: {entry.get('error', '')}", file=sys.stderr)
    if not keep and not interrupted and not bad and failed is None:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    elif not keep:
        print(f"{prog}: run files kept in {directory}", file=sys.stderr)
    if interrupted:
        return 130
    return 1 if bad or failed else 0


def demo_main(argv: Sequence[str], prog: str = "gossipnet demo") -> int:
    """``gossipnet demo``: :func:`main` with :data:`DEMO_DEFAULTS`."""
    return main(argv, prog, demo=True)
