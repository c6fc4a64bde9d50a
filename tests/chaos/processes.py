"""Real ``gossipnet peer`` OS processes for the reliability suite, on 127.0.0.1.

Every peer the suite attacks is the real command (``python -m gossipnet peer ...``) in its
own session (so a signal reaches it alone), its stdout and stderr appended to files in the
attack's directory across restarts. A peer that exits with an error while the suite did not
signal it has *crashed*; :attr:`PeerProcess.crashes` counts those exits over every start.

Example::

    peer = PeerProcess(directory, "a", ["--steps", "1", "--hold"])
    peer.start()
    address = await peer.wait_listening()
    ...
    peer.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

from peer.app.swarm import free_ports

STARTUP_S = 120.0
"""How long a peer may take to listen (importing torch on a busy 2-core machine)."""

RESUMED = re.compile(r"resumed from (?P<path>\S+) at step (?P<step>\d+)")


class PeerExited(RuntimeError):
    """A peer process ended before it listened (its stderr's last line attached)."""


class PeerProcess:
    """One ``gossipnet peer`` child and the files it writes in ``directory``.

    Args:
        directory: where ``ID.out``, ``ID.err`` and ``ID.address`` go.
        peer_id: the ``--id``.
        flags: every other flag of the command (``--port`` fixed by the caller if it must
            survive a restart).
        port: the listening port; ``None`` picks a free one now, so a restart with the same
            command listens on the same address.
    """

    def __init__(
        self, directory: Path, peer_id: str, flags: Sequence[str], *, port: int | None = None
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.peer_id = peer_id
        self.port = free_ports(1)[0] if port is None else port
        self.address = f"127.0.0.1:{self.port}"
        self.command = [
            sys.executable, "-m", "gossipnet", "peer", "--id", peer_id,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--address-file", str(self.address_file), "--progress", "lines",
            *flags,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.crashes = 0
        self.exit_codes: list[int] = []
        self._signalled = False

    @property
    def stdout_file(self) -> Path:
        return self.directory / f"{self.peer_id}.out"

    @property
    def stderr_file(self) -> Path:
        return self.directory / f"{self.peer_id}.err"

    @property
    def address_file(self) -> Path:
        return self.directory / f"{self.peer_id}.address"

    def start(self, extra: Iterable[str] = ()) -> None:
        """Start the command (plus ``extra`` flags, e.g. ``--resume``); the old run must be over."""
        if self.alive:
            raise RuntimeError(f"peer {self.peer_id} is still running")
        self._reap()
        with contextlib.suppress(FileNotFoundError):
            self.address_file.unlink()
        command = [*self.command, *extra]
        with open(self.directory / f"{self.peer_id}.command", "a") as log:
            log.write(shlex.join(command) + "\n")
        with open(self.stdout_file, "ab") as out, open(self.stderr_file, "ab") as err:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )
        self._signalled = False

    async def wait_listening(self, timeout_s: float = STARTUP_S) -> str:
        """The peer's ``HOST:PORT`` once it listens; :class:`PeerExited` if it ends first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.address_file.exists():
                text = self.address_file.read_text().strip()
                if text:
                    return text
            if self.process is None or self.process.poll() is not None:
                raise PeerExited(
                    f"peer {self.peer_id} exited before listening: {self.last_error()}"
                )
            await asyncio.sleep(0.05)
        raise PeerExited(f"peer {self.peer_id} did not listen within {timeout_s:g} s")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def crashed(self) -> bool:
        """Whether a run ended in an error the suite did not cause (each exit counted once)."""
        self._reap()
        return self.crashes > 0

    def _reap(self) -> None:
        if self.process is None or self.process.poll() is None:
            return
        code = self.process.returncode
        self.exit_codes.append(code)
        if not self._signalled and code != 0:
            self.crashes += 1
        self.process = None

    def rss_mib(self) -> float | None:
        """Resident memory of the process in MiB, or None when it is not running."""
        if not self.alive or self.pid is None:
            return None
        try:
            return float(psutil.Process(self.pid).memory_info().rss) / 2**20
        except psutil.Error:
            return None

    def signal(self, sig: int) -> None:
        """Send ``sig`` (the suite's own: not a crash when the peer ends of it)."""
        if self.alive and self.pid is not None:
            self._signalled = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> int | None:
        """SIGKILL and wait; returns the exit code."""
        self.signal(signal.SIGKILL)
        return self._wait(10.0)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM, wait ``grace_s`` for the final checkpoint and a clean exit, then SIGKILL."""
        if not self.alive:
            self._reap()
            return None
        self.signal(signal.SIGTERM)
        code = self._wait(grace_s)
        if code is None:
            return self.kill()
        return code

    def _wait(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reap()
        return code

    def stdout_text(self) -> str:
        return _read(self.stdout_file)

    def stderr_text(self) -> str:
        return _read(self.stderr_file)

    def last_error(self) -> str:
        lines = [line for line in self.stderr_text().splitlines() if line.strip()]
        return lines[-1] if lines else "no stderr"

    def resumed_steps(self) -> list[int]:
        """The step of every ``resumed from ... at step N`` line printed so far."""
        return [int(m["step"]) for m in RESUMED.finditer(self.stdout_text())]

    def resumed_paths(self) -> list[str]:
        return [m["path"] for m in RESUMED.finditer(self.stdout_text())]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class PeerGroup:
    """Peers started for one attack, all stopped on exit (never left running)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.peers: list[PeerProcess] = []

    def add(
        self, peer_id: str, flags: Sequence[str], *, port: int | None = None, start: bool = True
    ) -> PeerProcess:
        peer = PeerProcess(self.directory, peer_id, flags, port=port)
        self.peers.append(peer)
        if start:
            peer.start()
        return peer

    async def wait_all(self, timeout_s: float = STARTUP_S) -> None:
        await asyncio.gather(*(p.wait_listening(timeout_s) for p in self.peers if p.alive))

    def crashes(self) -> int:
        """Exits the suite did not cause, over every peer and every start."""
        for peer in self.peers:
            peer.crashed()
        return sum(peer.crashes for peer in self.peers)

    def stop(self) -> None:
        for peer in self.peers:
            peer.signal(signal.SIGTERM)
        for peer in self.peers:
            peer.stop()

    def __enter__(self) -> PeerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
