"""Where a sweep's runs execute: local processes (default) or a Ray cluster.

A task is a plain dict, ``{"key": ..., "data": {...}, "base_dir": "..."}``: the experiment's
tables for one run (TOML values only) and the folder relative paths in them resolve from.
:func:`run_task` builds the run from it with :func:`sim.config.experiment_from_dict`, runs
it with torch on one thread and returns its records as plain dicts (``Record.as_dict``: every
field, the per-group metrics as their own keys), so nothing but plain data crosses a process
boundary.

An executor turns tasks into events (:class:`RoundDone`, :class:`RunDone`,
:class:`RunFailed`, and a :class:`Tick` about twice a second so progress can be drawn):

- :class:`LocalExecutor`: ``jobs`` worker processes started with the ``spawn`` method,
  each taking one task at a time. Workers report their rounds, so progress moves within a
  run. A worker that dies (killed, out of memory) fails its run only; a fresh worker takes
  its place. Ctrl-C is handled by the parent alone, which stops the workers.
- :class:`RayExecutor`: one Ray task per run (``num_cpus=1``, no retries) on the cluster at
  ``address`` (``auto``: the one ``ray start`` runs here; ``local``: a fresh local
  instance), or on the instance this process already started with ``ray.init``. The same
  :func:`run_task` runs, so results equal a local run's. Progress moves when a run ends.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from types import ModuleType
from typing import Any, Protocol

Task = dict[str, Any]
"""``{"key": str, "data": dict, "base_dir": str}``: one run as plain data."""


class ExecutorError(ValueError):
    """An executor that cannot start (Ray missing or unreachable); names the flag."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class RoundDone:
    """Run ``key`` finished round ``round`` (sent at most a few times a second)."""

    key: str
    round: int


@dataclass(frozen=True)
class RunDone:
    """Run ``key`` finished; its records as plain dicts."""

    key: str
    records: list[dict[str, Any]]


@dataclass(frozen=True)
class RunFailed:
    """Run ``key`` raised or its worker died; ``message`` says what happened."""

    key: str
    message: str


@dataclass(frozen=True)
class Tick:
    """Nothing happened for a while (progress may redraw its estimate)."""


Event = RoundDone | RunDone | RunFailed | Tick


class Executor(Protocol):
    """Runs tasks and reports what happens, as events, until every task is done or failed."""

    @property
    def where(self) -> str:
        """Where runs execute, for the progress line (``2 local processes``)."""
        ...

    def run(self, tasks: Sequence[Task]) -> Iterator[Event]: ...


def run_task(
    task: Mapping[str, Any], report: Callable[[int], None] | None = None
) -> list[dict[str, Any]]:
    """Build one run from its plain tables and run it with torch on one thread.

    ``report(round)`` is called after every round. Returns the records as flat dicts, one
    per evaluation (:meth:`sim.metrics.Record.as_dict`: every field, then the per-group
    metrics under their own keys).
    """
    import torch

    from sim.build import build
    from sim.config import experiment_from_dict
    from sim.runner import run

    torch.set_num_threads(1)
    config = experiment_from_dict(task["data"], base_dir=task["base_dir"])
    algorithm, ctx, evaluation = build(config)
    records = run(
        algorithm,
        ctx,
        evaluation,
        rounds=config.rounds,
        eval_every=config.eval_every,
        on_round=report,
    )
    return [record.as_dict() for record in records]


def describe_error(error: BaseException) -> str:
    """One line for a failed run: the message of a bad setting, else type and message."""
    if isinstance(error, ValueError) and str(error):
        return str(error).splitlines()[0]
    return f"{type(error).__name__}: {error}".splitlines()[0]


def _worker(inbox: Any, outbox: Any, interval: float) -> None:
    """A local worker: run tasks from ``inbox`` until a None arrives, reporting to
    ``outbox`` as ``(kind, key, payload, pid)`` tuples."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    pid = os.getpid()
    while True:
        task = inbox.get()
        if task is None:
            return
        key = task["key"]
        outbox.put(("start", key, None, pid))
        last = 0.0

        def report(round_: int, key: str = key) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= interval:
                last = now
                outbox.put(("round", key, round_, pid))

        try:
            records = run_task(task, report)
        except Exception as error:
            outbox.put(("failed", key, describe_error(error), pid))
        else:
            outbox.put(("done", key, records, pid))


class LocalExecutor:
    """Runs tasks on ``jobs`` local worker processes (``spawn``), one task each at a time.

    Args:
        jobs: worker processes (default: the CPUs this process may use); never more than
            there are tasks.
        report_interval: seconds between two round reports of one worker.
    """

    def __init__(self, jobs: int | None = None, *, report_interval: float = 0.25) -> None:
        if jobs is None:
            jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            jobs = jobs or os.cpu_count() or 1
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ExecutorError("--jobs", f"must be an integer >= 1, got {jobs!r}")
        self.jobs = jobs
        self.report_interval = report_interval

    @property
    def where(self) -> str:
        return f"{self.jobs} local process{'es' if self.jobs != 1 else ''}"

    def run(self, tasks: Sequence[Task]) -> Iterator[Event]:
        if not tasks:
            return
        context = multiprocessing.get_context("spawn")
        inbox = context.Queue()
        outbox = context.Queue()
        for task in tasks:
            inbox.put(dict(task))
        remaining = {task["key"] for task in tasks}
        workers: list[BaseProcess] = []
        running: dict[int, str] = {}  # pid -> key of the task it runs

        def start_worker() -> None:
            worker = context.Process(
                target=_worker, args=(inbox, outbox, self.report_interval), daemon=True
            )
            worker.start()
            workers.append(worker)
            inbox.put(None)  # one stop sign per worker, behind every task

        def handle(message: tuple[str, str, Any, int]) -> Event | None:
            kind, key, payload, pid = message
            if kind == "start":
                running[pid] = key
                return None
            if kind == "round":
                return RoundDone(key, int(payload))
            running.pop(pid, None)
            remaining.discard(key)
            return RunDone(key, payload) if kind == "done" else RunFailed(key, str(payload))

        def drain() -> Iterator[Event]:
            while True:
                try:
                    message = outbox.get_nowait()
                except queue.Empty:
                    return
                event = handle(message)
                if event is not None:
                    yield event

        try:
            for _ in range(min(self.jobs, len(tasks))):
                start_worker()
            while remaining:
                try:
                    message = outbox.get(timeout=0.5)
                except queue.Empty:
                    pass
                else:
                    event = handle(message)
                    if event is not None:
                        yield event
                    yield from drain()
                    continue
                dead = [w for w in workers if not w.is_alive()]
                if dead:
                    yield from drain()  # what a worker sent before it exited comes first
                    for worker in dead:
                        workers.remove(worker)
                        key = running.pop(worker.pid or -1, None)
                        if key is not None and key in remaining:
                            remaining.discard(key)
                            yield RunFailed(
                                key, f"its worker process died (exit code {worker.exitcode})"
                            )
                    while remaining and len(workers) < min(self.jobs, len(remaining)):
                        start_worker()
                yield Tick()
        finally:
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()
            for worker in workers:
                worker.join(timeout=5)
                if worker.is_alive():
                    worker.kill()
                    worker.join()
            for channel in (inbox, outbox):
                channel.cancel_join_thread()
                channel.close()


def require_ray() -> ModuleType:
    """The ``ray`` module, or one clear :class:`ExecutorError` when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ExecutorError(
            "--ray", "Ray is not installed; install it with pip install 'gossipnet[ray]'"
        ) from None
    return ray


class RayExecutor:
    """One Ray task per run, on the cluster at ``address`` or on an instance already started.

    Args:
        address: ``auto`` (the cluster ``ray start`` runs on this machine), ``local`` (start
            a local instance for this sweep), or a cluster address (``ray://host:10001``,
            ``host:6379``). Ignored when this process already called ``ray.init``.
    """

    def __init__(self, address: str = "auto") -> None:
        if not isinstance(address, str) or not address.strip():
            raise ExecutorError(
                "--ray", f"must be auto, local or a cluster address; got {address!r}"
            )
        self.address = address.strip()
        self._owned = False

    @property
    def where(self) -> str:
        return f"Ray ({self.address})"

    def connect(self) -> None:
        """Connect to the cluster now (the CLI does, before any progress is drawn); an
        address nothing answers at is an :class:`ExecutorError`. A no-op when connected."""
        ray = require_ray()
        if ray.is_initialized():
            return
        import logging

        try:
            ray.init(
                address=None if self.address == "local" else self.address,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        except (ConnectionError, ValueError, RuntimeError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ExecutorError(
                "--ray",
                f"cannot connect to a Ray cluster at {self.address!r} ({first}); start one "
                "with `ray start --head`, or use --ray local",
            ) from None
        self._owned = True

    def run(self, tasks: Sequence[Task]) -> Iterator[Event]:
        ray = require_ray()
        if not tasks:
            return
        self.connect()
        remote = ray.remote(num_cpus=1, max_retries=0)(run_task)
        keys = {remote.remote(dict(task)): task["key"] for task in tasks}
        pending = list(keys)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
                for reference in ready:
                    try:
                        records = ray.get(reference)
                    except ray.exceptions.RayTaskError as error:
                        cause = getattr(error, "cause", None)
                        yield RunFailed(keys[reference], describe_error(cause or error))
                    except ray.exceptions.RayError as error:
                        yield RunFailed(keys[reference], describe_error(error))
                    else:
                        yield RunDone(keys[reference], records)
                yield Tick()
        finally:
            for reference in pending:
                ray.cancel(reference, force=True)
            if self._owned:  # this executor started the connection: it ends it
                ray.shutdown()
                self._owned = False
