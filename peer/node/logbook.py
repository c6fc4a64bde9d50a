"""A training record in formats people already read: ``metrics.csv`` and TensorBoard.

``--log-dir DIR`` (``PeerConfig.log_dir``) gives a peer a :class:`Logbook` in DIR:

- ``DIR/metrics.csv``, one row per record under a fixed header (:data:`CSV_COLUMNS`):
  ``time_s`` (Unix time, seconds), ``step``, ``loss``, the test metrics of every task under
  their names (``accuracy``, ``bits_per_byte``, ``mse``: :data:`workloads.task.METRIC_NAMES`),
  ``bytes_in``, ``bytes_out``, ``exchanges_ok``, ``exchanges_failed``. A value the record
  does not know (no loss before the first step, no accuracy between evaluations, no mean
  squared error for a classifier) is a blank cell, never a made-up zero. Each row is flushed as it is written, so a crash loses nothing already
  recorded; a resumed run appends to the same file (the header is written once), and a
  file whose header differs is an error that names it (:class:`LogbookError`).
- TensorBoard event files in DIR (``torch.utils.tensorboard.SummaryWriter``), one scalar
  per known value with the step as x: ``tensorboard --logdir DIR``. This needs the
  ``tensorboard`` package (``pip install 'gossipnet[logging]'``); without it ``--log-dir``
  is one error line before anything starts (:func:`check_log_dir`), not a CSV-only run.
- MLflow, optionally: when ``mlflow`` is importable and ``MLFLOW_TRACKING_URI`` is set,
  the same values go to a run named ``run_name`` (in ``MLFLOW_EXPERIMENT_NAME``, or the
  default experiment). gossipnet never installs mlflow. MLflow is best effort: a failure
  there logs one warning and drops MLflow for the rest of the run; the CSV and the event
  files go on.

The swarm's view (``gossipnet launch --log-dir``) is the same record with a ``peer``
column (:data:`SWARM_COLUMNS`, ``Logbook.open(..., peer_column=True)``); its TensorBoard
tags are ``loss/peer-0``, ``loss/peer-1``, ... so that one chart shows every peer.

Threads and event loops: :meth:`Logbook.record_status` blocks for as long as its writes
take: a CSV line and its flush (small, local), a handoff to TensorBoard's own writer thread
(cheap), and, with MLflow on, MLflow's calls to the tracking server (network round trips).
A caller on an event loop therefore calls it through ``asyncio.to_thread`` (as
``gossipnet peer`` and ``launch`` do); the logbook holds a lock, so calls from several
threads are safe. :meth:`Logbook.close` flushes everything and is idempotent.

Example::

    with Logbook.open("runs/a", run_name="a") as book:
        book.record_status({"step": 100, "loss": 0.71, "bytes_in": 4096, "bytes_out": 4096,
                            "exchanges": {"ok": 9, "failed": 1}})
        book.record_status({"step": 200, "loss": 0.52}, accuracy=0.81)
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from workloads.task import METRIC_NAMES

__all__ = [
    "CSV_COLUMNS",
    "CSV_NAME",
    "SWARM_COLUMNS",
    "TENSORBOARD_MISSING",
    "Logbook",
    "LogbookError",
    "check_log_dir",
    "mlflow_enabled",
]

log = logging.getLogger(__name__)

CSV_NAME = "metrics.csv"
"""The CSV file's name inside the log directory."""
CSV_COLUMNS = (
    "time_s", "step", "loss", *(name for name in METRIC_NAMES if name != "loss"), "bytes_in",
    "bytes_out", "exchanges_ok", "exchanges_failed",
)  # fmt: skip
"""The header of a peer's ``metrics.csv``, in this order."""
SWARM_COLUMNS = ("time_s", "peer", *CSV_COLUMNS[1:])
"""The header of the swarm's ``metrics.csv`` (``launch --log-dir``): one row per peer."""
METRICS = CSV_COLUMNS[2:]
"""The values a record can carry besides its time and step (TensorBoard and MLflow tags)."""
TENSORBOARD_MISSING = (
    "--log-dir: TensorBoard logging needs the tensorboard package; pip install 'gossipnet[logging]'"
)
"""The one line a missing ``tensorboard`` package gives."""
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"


class LogbookError(ValueError):
    """A log directory that cannot be used; the message starts with ``--log-dir:`` and
    names the file or the package at fault."""


def _tensorboard_installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def mlflow_enabled() -> bool:
    """True when records also go to MLflow: ``mlflow`` is importable and
    ``MLFLOW_TRACKING_URI`` is set (and not empty)."""
    return bool(os.environ.get(MLFLOW_URI_ENV)) and importlib.util.find_spec("mlflow") is not None


def check_log_dir(log_dir: str | Path, *, peer_column: bool = False) -> None:
    """Check a ``--log-dir`` before anything starts, creating nothing: the ``tensorboard``
    package is installed, DIR is a directory or can become one (not a file), and a
    ``metrics.csv`` already there has this record's header (a resumed run appends to it).
    Raises :class:`LogbookError` with one line naming the problem."""
    if not _tensorboard_installed():
        raise LogbookError(TENSORBOARD_MISSING)
    folder = Path(log_dir)
    for part in (folder, *folder.parents):
        if part.exists():
            if not part.is_dir():
                raise LogbookError(f"--log-dir: {part} exists and is not a directory")
            break
    target = folder / CSV_NAME
    if target.is_file():
        _check_header(target, SWARM_COLUMNS if peer_column else CSV_COLUMNS)


def _check_header(path: Path, columns: tuple[str, ...]) -> bool:
    """True if ``path`` already has a header (it is then ``columns``); False if empty.
    A different header is a :class:`LogbookError` naming the file."""
    try:
        with path.open(newline="") as stream:
            first = next(csv.reader(stream), None)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise LogbookError(f"--log-dir: cannot read {path} ({error})") from None
    if first is None:
        return False
    if tuple(first) != columns:
        raise LogbookError(
            f"--log-dir: {path} has the columns {','.join(first)}, not this record's "
            f"{','.join(columns)}; allowed: a new --log-dir, or that file moved away"
        )
    return True


def _number(value: Any) -> float | None:
    """A finite-or-not real number from a status value; None for unknown (None, missing,
    not a number). Booleans are not numbers here."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _cell(value: float | None) -> str:
    """A CSV cell: blank for unknown, an integer without ``.0``, else the float's repr."""
    if value is None:
        return ""
    if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _values(status: Mapping[str, Any], extra: Mapping[str, float | None]) -> dict[str, Any]:
    """The record's values: from a ``/v1/status`` object (``exchanges`` as ``{ok, failed}``
    or as flat ``exchanges_ok``/``exchanges_failed``), then ``extra`` on top."""
    exchanges = status.get("exchanges")
    if not isinstance(exchanges, Mapping):
        exchanges = {}
    values: dict[str, Any] = {
        "step": status.get("step"),
        "loss": status.get("loss"),
        **{name: status.get(name) for name in METRIC_NAMES if name != "loss"},
        "bytes_in": status.get("bytes_in"),
        "bytes_out": status.get("bytes_out"),
        "exchanges_ok": exchanges.get("ok", status.get("exchanges_ok")),
        "exchanges_failed": exchanges.get("failed", status.get("exchanges_failed")),
    }
    values.update(extra)
    return values


class Logbook:
    """One training record: ``metrics.csv`` and TensorBoard event files in one directory
    (and MLflow where enabled, :func:`mlflow_enabled`). Build it with :meth:`open`."""

    def __init__(
        self,
        folder: Path,
        *,
        run_name: str,
        columns: tuple[str, ...],
        stream: IO[str],
        writer: Any,
        mlflow: _MlflowRun | None,
    ) -> None:
        self.folder = folder
        self.run_name = run_name
        self.columns = columns
        self._stream: IO[str] | None = stream
        self._csv = csv.writer(stream, lineterminator="\n")
        self._writer = writer
        self._mlflow = mlflow
        self._lock = threading.Lock()

    @property
    def csv_path(self) -> Path:
        """``DIR/metrics.csv``."""
        return self.folder / CSV_NAME

    @classmethod
    def open(cls, log_dir: str | Path, *, run_name: str, peer_column: bool = False) -> Logbook:
        """Open (create, or append to after a resume) the record in ``log_dir``:
        ``metrics.csv`` with :data:`CSV_COLUMNS` (:data:`SWARM_COLUMNS` with
        ``peer_column``), a TensorBoard writer, and an MLflow run named ``run_name`` where
        enabled. Raises :class:`LogbookError` (see :func:`check_log_dir`)."""
        check_log_dir(log_dir, peer_column=peer_column)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise LogbookError(TENSORBOARD_MISSING) from None
        folder = Path(log_dir)
        columns = SWARM_COLUMNS if peer_column else CSV_COLUMNS
        try:
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / CSV_NAME
            has_header = target.is_file() and _check_header(target, columns)
            stream = target.open("a", newline="")
        except OSError as error:
            raise LogbookError(f"--log-dir: cannot write in {folder} ({error})") from None
        if not has_header:
            csv.writer(stream, lineterminator="\n").writerow(columns)
            stream.flush()
        writer = SummaryWriter(log_dir=str(folder))
        mlflow = _MlflowRun.start(run_name) if mlflow_enabled() else None
        return cls(
            folder, run_name=run_name, columns=columns, stream=stream, writer=writer, mlflow=mlflow
        )

    def record_status(
        self, status: Mapping[str, Any], *, peer: str | None = None, **extra: float | None
    ) -> None:
        """Write one row from a ``GET /v1/status`` object (``step``, ``loss``,
        ``bytes_in``, ``bytes_out``, ``exchanges`` ``{ok, failed}`` or flat
        ``exchanges_ok``/``exchanges_failed``) with ``extra`` values on top, such as
        ``accuracy=0.9`` (``None`` = unknown, a blank cell). An extra that is not a CSV
        column (``lr=0.01``) goes to TensorBoard and MLflow only. ``peer`` is the row's
        peer, required by a swarm record and refused by a peer's. Blocking: see the
        module's notes on event loops. Raises ``ValueError`` without a step."""
        if "time_s" in extra:
            raise ValueError("record_status: time_s is the logbook's own column, not an extra")
        values = _values(status, extra)
        step = _number(values.pop("step"))
        if step is None or not math.isfinite(step) or step != int(step):
            raise ValueError(f"record_status: step must be an integer, got {status.get('step')!r}")
        if ("peer" in self.columns) != (peer is not None):
            need = "needs a" if peer is None else "takes no"
            raise ValueError(f"record_status: peer: this record {need} peer name")
        numbers = {name: _number(value) for name, value in values.items()}
        now = time.time()
        row = {"time_s": round(now, 3), "step": step, **numbers}
        cells = [peer if name == "peer" else _cell(row.get(name)) for name in self.columns]
        known = {name: value for name, value in numbers.items() if value is not None}
        with self._lock:
            if self._stream is None:
                raise ValueError(f"record_status: the logbook in {self.folder} is closed")
            self._csv.writerow(cells)
            self._stream.flush()
            for name, value in known.items():
                tag = name if peer is None else f"{name}/{peer}"
                self._writer.add_scalar(tag, value, global_step=int(step), walltime=now)
            if self._mlflow is not None and known:
                prefix = "" if peer is None else f"{peer}."
                metrics = {prefix + name: value for name, value in known.items()}
                if not self._mlflow.log(metrics, step=int(step), time_s=now):
                    self._mlflow = None

    def close(self) -> None:
        """Flush and close the CSV, the event files and the MLflow run; safe to repeat."""
        with self._lock:
            if self._stream is None:
                return
            self._stream.close()
            self._stream = None
            self._writer.close()
            if self._mlflow is not None:
                self._mlflow.end()
                self._mlflow = None

    def __enter__(self) -> Logbook:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class _MlflowRun:
    """One MLflow run through ``mlflow.MlflowClient`` (explicit run id, so calls from any
    thread land in it); every failure is one warning and the run is dropped."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    @classmethod
    def start(cls, run_name: str) -> _MlflowRun | None:
        """A new run named ``run_name`` at ``MLFLOW_TRACKING_URI``, or None (warned)."""
        try:
            import mlflow

            client = mlflow.MlflowClient()
            experiment_id = "0"  # MLflow's default experiment
            name = os.environ.get(MLFLOW_EXPERIMENT_ENV)
            if name:
                found = client.get_experiment_by_name(name)
                experiment_id = (
                    found.experiment_id if found is not None else client.create_experiment(name)
                )
            run = client.create_run(experiment_id, run_name=run_name)
            return cls(client, run.info.run_id)
        except Exception as error:  # best effort: the CSV and TensorBoard go on
            log.warning("MLflow logging is off for this run: %s: %s", type(error).__name__, error)
            return None

    def log(self, metrics: Mapping[str, float], *, step: int, time_s: float) -> bool:
        """Log ``metrics`` at ``step``; False (warned) if MLflow failed."""
        try:
            for key, value in metrics.items():
                self.client.log_metric(
                    self.run_id, key, value, timestamp=int(time_s * 1000), step=step
                )
        except Exception as error:
            log.warning("MLflow logging stopped: %s: %s", type(error).__name__, error)
            return False
        return True

    def end(self) -> None:
        """Mark the run finished (a failure is one warning)."""
        try:
            self.client.set_terminated(self.run_id)
        except Exception as error:
            log.warning("MLflow run not closed: %s: %s", type(error).__name__, error)
