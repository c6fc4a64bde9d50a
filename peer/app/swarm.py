"""The processes of a local swarm: ``gossipnet peer`` children, their ports and files.

:class:`Swarm` starts N ``gossipnet peer`` OS processes on 127.0.0.1, all in one process
group, all at once: ``peer-0`` is the bootstrap, on a port chosen by :func:`free_ports`,
and the others ``--join`` it (or, with ``--topology``, every rank gets a port in a generated
peer file).
A fresh 32-byte swarm secret is written to a file readable only by the user and passed with
``--secret-file``; peer i trains on shard i (``--peers N --peer-index i``) and writes its
stdout, stderr, address, final evaluation (and, with ``--save-model``, its model) into the
run directory (with ``launch --log-dir DIR``, its training record in ``DIR/peer-<i>/``)
(:class:`PeerProcess`; :func:`peer_flags` is the command line each gets,
which ``launch`` also checks before anything starts). :meth:`Swarm.stop` ends them
together, never leaving orphans: SIGTERM to the group, a grace period for the final
checkpoints, evaluations and model files (``launch --grace``; by default longer while a
peer says it is still finishing), then SIGKILL, each killed peer marked with why.
:meth:`PeerProcess.state` and :meth:`PeerProcess.exit_reason` say truthfully where a peer
is: starting, waiting for peers, running, finished, stopped before its steps, or failed,
and why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossip.settings import SETTING_NAMES
from peer.app.peer_flags import OPTIMIZER_FLAGS, PRIVACY_FLAGS

GRACE_S = 15.0
"""How long stopped peers get to checkpoint, evaluate, save and exit before SIGKILL; by
default (``launch`` without ``--grace``) longer for a peer that says it is still finishing
(a status line with a ``phase``), up to :data:`GRACE_LIMIT_S`."""
GRACE_LIMIT_S = 600.0
"""The longest a finishing peer is waited for by default: a peer evaluating a large model
on busy cores for more than 10 minutes is taken to hang."""
PASS_THROUGH = (
    "algorithm", "mode", *SETTING_NAMES, "fanout", "round_deadline_s",
    "topology", "topology_weights", "dataset", "partition", "model", "batch_size",
    *OPTIMIZER_FLAGS, "seed", "steps", "device", "max_serving_share",
    "checkpoint_every", "log_level", "latency", "bandwidth", "jitter", "message_loss",
)  # fmt: skip
"""Launcher options handed to every peer unchanged (``--lr 0.1`` -> ``--lr 0.1``); every
algorithm setting (``gossip.settings.SETTING_NAMES``) among them."""


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
    killed: str | None = None
    """Why the launcher killed it (:meth:`Swarm.stop`), for :meth:`exit_reason`."""
    extra: tuple[str, ...] = ()
    """The flags :meth:`Swarm.spawn` added to its command (its port, ``--join``), which a
    restart (:meth:`Swarm.respawn`) gives it again."""
    crashes: list[dict[str, Any]] = field(default_factory=list)
    """``launch --crashes``: each crash as it happened (:mod:`peer.app.churn`)."""
    down: bool = False
    """Killed by ``launch --crashes`` and not restarted (yet): not a failure."""
    restart_pending: bool = False
    """Down, and its restart is still to come (the launcher keeps watching for it)."""

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

    @property
    def model_file(self) -> Path:
        """Where ``launch --save-model`` has this peer write its model."""
        return self.directory / f"{self.peer_id}.safetensors"

    def failed(self) -> bool:
        """Exited with an error: a non-zero exit code, or killed by a signal other than the
        launcher's SIGTERM (which a peer answers with a clean stop, exit code 0)."""
        code = self.process.returncode
        if self.down and code == -signal.SIGKILL:  # crashed on purpose (launch --crashes)
            return False
        return code is not None and code not in (0, -signal.SIGTERM)

    def exit_reason(self) -> str:
        """Why the process ended, never empty: for a peer that failed, its last stderr line
        (its one-line error) with the exit code, the launcher's reason for killing it
        (``killed after the grace of 15 s while evaluating``), or the signal that killed it."""
        code = self.process.returncode
        if code is None:
            return "still running"
        if self.killed is not None and code == -signal.SIGKILL:
            return self.killed
        if self.down and code == -signal.SIGKILL:
            return f"down since its crash at {self.crashes[-1]['at']:.1f} s (--crashes)"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        lines = [line.strip() for line in read_text(self.stderr).splitlines() if line.strip()]
        if code == 0:
            return "exit code 0"
        return f"{lines[-1]} (exit code {code})" if lines else f"exit code {code}"

    def last_error(self) -> str:
        """The reason a failed peer gave (:meth:`exit_reason`)."""
        return self.exit_reason()

    def state(self, steps: int | None = None) -> str:
        """Where the peer is, for the live table: ``starting`` (no status yet), ``waiting``
        (listening, step 0: waiting for the others), ``running``, ``finished`` (reached
        ``steps``, and holding or exited), ``stopped`` (exited cleanly before ``steps``:
        Ctrl-C), ``down`` (killed by ``launch --crashes`` and not back), or ``failed:
        REASON``."""
        step = int(self.status.get("step", 0) or 0)
        reached = steps is None or step >= steps
        if self.down:  # launch --crashes: killed, and not back (yet)
            return "down"
        if self.process.poll() is None:
            if not self.status:
                return "starting"
            if steps is not None and step >= steps:
                return "finished"
            return "waiting" if step == 0 else "running"
        if self.failed():
            return f"failed: {self.exit_reason()}"
        return "finished" if reached else "stopped"

    def phase(self) -> str | None:
        """What the peer said it is doing on its way out (its last status line's ``phase``:
        ``stopping``, ``evaluating``, ``saving``), or None."""
        phase = self.last_status_line().get("phase")
        return phase if isinstance(phase, str) else None

    def last_status_line(self) -> dict[str, Any]:
        for line in reversed(read_text(self.stdout).splitlines()):
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    loaded = json.loads(line)
                    if isinstance(loaded, dict):
                        return loaded
        return {}


def read_text(path: Path) -> str:
    """The text of a file a peer writes, or ``""`` while it does not exist yet."""
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


async def wait_for_address(
    peer: PeerProcess, stop: asyncio.Event, timeout_s: float = 120.0
) -> str | None:
    """The bootstrap's ``HOST:PORT`` once it listens; ``None`` if ``stop`` is set first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = read_text(peer.address_file).strip()
        if text:
            return text
        if peer.process.poll() is not None:
            raise RuntimeError(f"{peer.peer_id} exited before listening: {peer.last_error()}")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
        if stop.is_set():
            return None
    raise RuntimeError(f"{peer.peer_id} did not start listening within {timeout_s:.0f} s")


def holds(args: argparse.Namespace) -> bool:
    """Whether the peers hold after their steps: asynchronous peers keep answering until
    every peer is done (then the launcher's SIGTERM), so no straggler ends its run averaging
    with nobody. Synchronous peers evaluate, write their results and exit by themselves."""
    return args.algorithm in (None, "ad-psgd") and args.mode in (None, "async")


def peer_flags(
    args: argparse.Namespace,
    index: int,
    directory: Path,
    *,
    secret_file: Path | None,
    peer_file: Path | None,
) -> list[str]:
    """The ``gossipnet peer`` flags of peer ``index``: the launcher's options passed through
    (:data:`PASS_THROUGH`, and the DP-SGD flags given), its shard and files in ``directory`` (checkpoints too when the
    run is kept, ``--dir``, so that it can be resumed), the topology's peer file,
    ``--byzantine`` for the Byzantine peers (:func:`byzantine_peers`), ``--slowdown`` for a
    straggler (``args.slowdowns``, index -> factor: ``launch --stragglers``), then
    ``--peer-args`` and this peer's ``--peer-args-for``. With ``launch --resume``
    (``args.resumed``: index -> the step of that peer's newest checkpoint) each peer gets
    ``--resume`` and the steps left to ``--steps`` in all. ``launch`` parses them with the
    peer's own parser before anything starts."""
    flags: list[str] = []
    resumed: dict[int, int] | None = getattr(args, "resumed", None)  # launch --resume
    for name in PASS_THROUGH:
        value = getattr(args, name)
        if name == "steps" and resumed is not None:  # on to --steps in all; 1 if already there
            value = max(1, args.steps - resumed.get(index, 0))
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    for name in PRIVACY_FLAGS:  # DP-SGD's, when given (docs/privacy.md)
        value = getattr(args, name, None)
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    if getattr(args, "dp_seeded", False):
        flags.append("--dp-seeded")
    flags += [
        "--id", f"peer-{index}", "--peers", str(args.peers), "--peer-index", str(index),
        "--progress", "lines",
        "--status-every", str(max(1, args.steps // 10)),
        "--wait-for-peers", str(args.peers - 1),
        "--eval-out", str(directory / f"peer-{index}.eval.json"),
    ]  # fmt: skip
    slowdown = getattr(args, "slowdowns", {}).get(index)  # launch --stragglers
    if slowdown is not None:
        flags += ["--slowdown", repr(slowdown)]
    if secret_file is not None:
        flags += ["--secret-file", str(secret_file)]
    if holds(args):
        flags.append("--hold")
    crashing = index in {crash.peer for crash in getattr(args, "crash_plan", ())}
    if args.checkpoint_every or getattr(args, "dir", None) is not None or crashing:
        # a kept run resumes; a peer that --crashes rejoins from its newest checkpoint
        flags += ["--checkpoint-dir", str(directory / f"peer-{index}.checkpoints")]
    if crashing and not args.checkpoint_every:
        flags += ["--checkpoint-every", str(crash_checkpoint_every(args.steps))]
    if resumed is not None:
        flags.append("--resume")
    if getattr(args, "save_model", None):
        flags += ["--save-model", str(directory / f"peer-{index}.safetensors")]
    if getattr(args, "eval_every", None):  # launch --eval-every N: the run's timed curve
        flags += ["--eval-every", str(args.eval_every)]
        flags += ["--eval-log", str(directory / f"peer-{index}.evals.jsonl")]
    if getattr(args, "log_dir", None):  # launch --log-dir DIR: each peer's record in its folder
        flags += ["--log-dir", str(Path(args.log_dir) / f"peer-{index}")]
    if peer_file is not None:
        flags += ["--peers-file", str(peer_file), "--rank", str(index)]
    if index in byzantine_peers(args):
        flags += ["--byzantine", str(args.byzantine_attack)]
    extra = getattr(args, "peer_args_of", {}).get(index, [])  # launch --peer-args-for
    return [*flags, *shlex.split(args.peer_args), *extra]


def byzantine_peers(args: argparse.Namespace) -> frozenset[int]:
    """The indices of launch's Byzantine peers: ``--byzantine-peers``, else the last K of
    ``--byzantine K:ATTACK`` (none without it)."""
    chosen = getattr(args, "byzantine_set", None)
    if chosen is not None:
        return frozenset(chosen)
    count = getattr(args, "byzantine_count", 0)
    return frozenset(range(args.peers - count, args.peers))


def crash_checkpoint_every(steps: int) -> int:
    """How often a peer that ``launch --crashes`` kills checkpoints without
    ``--checkpoint-every``: every 5 % of ``--steps``, so it rejoins at most that many steps
    older than it crashed (the simulator's crashed peer keeps its model to the step)."""
    return max(1, steps // 20)


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
        return peer_flags(
            self.args,
            index,
            self.directory,
            secret_file=self.secret_file,
            peer_file=self.peer_file,
        )

    def spawn(self, index: int, extra: Sequence[str]) -> PeerProcess:
        peer_id = f"peer-{index}"
        stales = ["address", "eval.json", "safetensors", "json"]
        if getattr(self.args, "resumed", None) is None:  # a resumed run's curve goes on
            stales.append("evals.jsonl")
        for stale in stales:
            # a run resumed in the same --dir: nothing of the last run may pass for this one's
            (self.directory / f"{peer_id}.{stale}").unlink(missing_ok=True)
        command = [sys.executable, "-m", "gossipnet", "peer", *self._common(index), *extra]
        process = self._popen(peer_id, command)
        client_only = "--client-only" in extra
        peer = PeerProcess(index, peer_id, process, self.directory, client_only, extra=tuple(extra))
        self.peers.append(peer)
        return peer

    def _popen(self, peer_id: str, command: list[str]) -> subprocess.Popen[bytes]:
        """Start ``command`` in the swarm's process group, its output in the run directory."""
        (self.directory / f"{peer_id}.command").write_text(shlex.join(command) + "\n")
        with (
            open(self.directory / f"{peer_id}.out", "wb") as out,
            open(self.directory / f"{peer_id}.err", "wb") as err,
        ):
            try:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    process_group=0 if self.group is None else self.group,
                )
            except PermissionError:  # every member of the group has exited: a new group
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, process_group=0
                )
                self.group = None
        if self.group is None:
            self.group = process.pid
        (self.directory / f"{peer_id}.pid").write_text(f"{process.pid}\n")
        return process

    def respawn(self, peer: PeerProcess, args: argparse.Namespace, more: Sequence[str]) -> None:
        """Start ``peer`` again (``launch --crashes``): its command with ``args`` (the
        launch's, with ``resumed`` for this peer when it has a checkpoint), its spawn flags
        and ``more``; its last life's output is kept as ``peer-<i>.life<k>.out``/``.err``."""
        life = len(peer.crashes)
        for suffix in ("out", "err"):
            with contextlib.suppress(OSError):
                os.replace(
                    self.directory / f"{peer.peer_id}.{suffix}",
                    self.directory / f"{peer.peer_id}.life{life}.{suffix}",
                )
        for stale in ("address", "eval.json"):
            (self.directory / f"{peer.peer_id}.{stale}").unlink(missing_ok=True)
        flags = peer_flags(
            args, peer.index, self.directory, secret_file=self.secret_file, peer_file=self.peer_file
        )
        command = [sys.executable, "-m", "gossipnet", "peer", *flags, *peer.extra, *more]
        peer.process = self._popen(peer.peer_id, command)
        peer.address, peer.status, peer.last_bytes, peer.rate = None, {}, None, 0.0

    async def start(self, stop: asyncio.Event) -> bool:
        """Spawn every peer at once: with a peer file (``--topology``) every rank on its
        port, else the bootstrap on a port chosen here and the others ``--join`` it (retrying
        until it listens); the last ``--client-only`` K never listen. False if ``stop`` was
        set before the bootstrap listened (the caller stops them all)."""
        args = self.args
        first_listening = args.client_only < args.peers
        listening = args.peers - args.client_only
        extras: list[list[str]] = []
        for index in range(args.peers):
            extra = ["--address-file", str(self.directory / f"peer-{index}.address")]
            if index >= listening:
                extra = ["--client-only"]
            extras.append(extra)
        if self.peer_file is not None:  # every rank knows every address: start all at once
            for index in range(args.peers):
                self.spawn(index, extras[index])
            return True
        assert first_listening
        # the bootstrap's port is chosen here, so the others start with it at once and join
        # as soon as it listens (their --join retries until then) instead of waiting for it
        # to start: a swarm is up in one peer's start-up time, not two
        [port] = free_ports(1)
        bootstrap = self.spawn(0, [*extras[0], "--port", str(port)])
        for index in range(1, args.peers):
            self.spawn(index, [*extras[index], "--join", f"127.0.0.1:{port}"])
        return await wait_for_address(bootstrap, stop) is not None

    def signal_all(self, sig: int) -> None:
        if self.group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.group, sig)

    def alive(self) -> list[PeerProcess]:
        return [p for p in self.peers if p.process.poll() is None]

    def stop(
        self,
        grace_s: float | None = None,
        *,
        base_s: float = GRACE_S,
        limit_s: float = GRACE_LIMIT_S,
        say: Callable[[str], None] | None = None,
    ) -> list[PeerProcess]:
        """SIGTERM the group, wait for clean exits, then SIGKILL what is left; returns the
        peers killed, each with its reason (:attr:`PeerProcess.killed`).

        ``grace_s``: wait exactly this long. ``None`` (the default): ``base_s``, and
        for as long as a live peer's last status line says it is still finishing (a
        ``phase``: stopping, evaluating, saving) up to ``limit_s`` in all. ``say`` gets one
        line the first time the wait is extended."""
        self.signal_all(signal.SIGTERM)
        start = time.monotonic()
        allowed = base_s if grace_s is None else grace_s
        extended = False
        while self.alive():
            waited = time.monotonic() - start
            if waited >= base_s and grace_s is None:  # past the base: only while finishing
                finishing = [p for p in self.alive() if p.phase() is not None]
                if not finishing:
                    allowed = base_s if not extended else waited
                    break
                if not extended:
                    extended, allowed = True, limit_s
                    if say is not None:
                        names = ", ".join(f"{p.peer_id} ({p.phase()})" for p in finishing)
                        say(
                            f"waiting for {names} to finish, up to {limit_s:g} s in all "
                            "(--grace SECONDS sets a fixed grace)"
                        )
            if waited >= allowed:
                break
            time.sleep(0.05)
        killed = self.alive()
        for peer in killed:
            phase = peer.phase()
            doing = f"while {phase}" if phase else "before it began to stop"
            peer.killed = f"killed after the grace of {allowed:.3g} s {doing}"
        if killed:
            self.signal_all(signal.SIGKILL)
        for peer in self.peers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                peer.process.wait(timeout=5)
        return killed
