"""``peer.node.logbook``: metrics.csv (header, blank cells, append on resume, a foreign header
refused), TensorBoard event files read back with TensorBoard's own reader, a missing
tensorboard package, and MLflow only where it is installed and configured."""

from __future__ import annotations

import csv
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from peer.node.logbook import (
    CSV_COLUMNS,
    SWARM_COLUMNS,
    TENSORBOARD_MISSING,
    Logbook,
    LogbookError,
    check_log_dir,
    mlflow_enabled,
)

STATUS = {
    "id": "a",
    "step": 50,
    "loss": 0.75,
    "bytes_in": 4096,
    "bytes_out": 2048.0,
    "exchanges": {"ok": 9, "failed": 1},
    "neighbours": [],
}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def test_rows_follow_the_fixed_header_with_blank_cells_for_unknown_values(
    tmp_path: Path,
) -> None:
    with Logbook.open(tmp_path / "run", run_name="a") as book:
        book.record_status(STATUS)
        book.record_status({"step": 0, "loss": None}, accuracy=None)  # no loss yet, no accuracy
        book.record_status(
            {"step": 100, "loss": 0.5, "exchanges_ok": 12, "exchanges_failed": 2}, accuracy=0.875
        )
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS)
    first, second, third = rows(tmp_path / "run" / "metrics.csv")
    assert {k: v for k, v in first.items() if k != "time_s"} == {
        "step": "50", "loss": "0.75", "accuracy": "", "bits_per_byte": "", "mse": "",
        "bytes_in": "4096", "bytes_out": "2048", "exchanges_ok": "9", "exchanges_failed": "1",
    }  # fmt: skip
    assert float(first["time_s"]) > 1e9  # Unix time
    assert second["step"] == "0"
    assert all(second[name] == "" for name in CSV_COLUMNS[2:])  # never a made-up zero
    assert (third["accuracy"], third["exchanges_ok"], third["exchanges_failed"]) == (
        "0.875", "12", "2",
    )  # fmt: skip
    assert third["bytes_in"] == ""


def test_each_row_is_on_disk_before_close(tmp_path: Path) -> None:
    book = Logbook.open(tmp_path, run_name="a")
    try:
        book.record_status(STATUS)
        assert [row["step"] for row in rows(book.csv_path)] == ["50"]
    finally:
        book.close()
    book.close()  # idempotent


def test_a_resumed_run_appends_under_the_one_header(tmp_path: Path) -> None:
    with Logbook.open(tmp_path, run_name="a") as book:
        book.record_status(STATUS)
    with Logbook.open(tmp_path, run_name="a") as book:
        book.record_status({**STATUS, "step": 60, "loss": 0.7})
    text = (tmp_path / "metrics.csv").read_text()
    assert text.count("time_s") == 1
    assert [row["step"] for row in rows(tmp_path / "metrics.csv")] == ["50", "60"]
    # both runs' event files are read as one series
    assert scalars(tmp_path)["loss"] == [(50, 0.75), (60, pytest.approx(0.7))]


def test_a_metrics_csv_with_another_header_is_refused_naming_the_file(tmp_path: Path) -> None:
    target = tmp_path / "metrics.csv"
    target.write_text("epoch,val_loss\n1,0.5\n")
    with pytest.raises(LogbookError, match=r"^--log-dir: .*metrics\.csv has the columns epoch"):
        check_log_dir(tmp_path)
    with pytest.raises(LogbookError, match=r"metrics\.csv has the columns"):
        Logbook.open(tmp_path, run_name="a")
    assert target.read_text() == "epoch,val_loss\n1,0.5\n"  # untouched
    # a peer's record is not a swarm's either
    peer_dir = tmp_path / "peer"
    Logbook.open(peer_dir, run_name="a").close()
    with pytest.raises(LogbookError, match="not this record's time_s,peer"):
        Logbook.open(peer_dir, run_name="swarm", peer_column=True)


def test_a_file_where_the_directory_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    with pytest.raises(LogbookError, match=r"^--log-dir: .*taken exists and is not a directory"):
        check_log_dir(tmp_path / "taken" / "run")
    check_log_dir(tmp_path / "new" / "deeper")  # creates nothing
    assert not (tmp_path / "new").exists()


def test_tensorboard_reads_every_known_value_at_its_step(tmp_path: Path) -> None:
    with Logbook.open(tmp_path, run_name="a") as book:
        book.record_status(STATUS)
        book.record_status({"step": 80, "loss": None}, accuracy=0.5, lr=0.01)
    found = scalars(tmp_path)
    assert found["loss"] == [(50, 0.75)]  # no point for the unknown loss at step 80
    assert found["accuracy"] == [(80, 0.5)]
    assert found["bytes_in"] == [(50, 4096.0)]
    assert found["exchanges_failed"] == [(50, 1.0)]
    assert found["lr"] == [(80, pytest.approx(0.01))]  # an extra beyond the CSV's columns
    assert "lr" not in (tmp_path / "metrics.csv").read_text()


def test_the_swarm_record_has_a_peer_column_and_one_tag_per_peer(tmp_path: Path) -> None:
    with Logbook.open(tmp_path, run_name="swarm", peer_column=True) as book:
        book.record_status(STATUS, peer="peer-0")
        book.record_status({**STATUS, "loss": 0.25}, peer="peer-1")
        with pytest.raises(ValueError, match="peer: this record needs a peer name"):
            book.record_status(STATUS)
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0] == ",".join(SWARM_COLUMNS)
    assert [(r["peer"], r["loss"]) for r in rows(tmp_path / "metrics.csv")] == [
        ("peer-0", "0.75"), ("peer-1", "0.25"),
    ]  # fmt: skip
    found = scalars(tmp_path)
    assert found["loss/peer-0"] == [(50, 0.75)]
    assert found["loss/peer-1"] == [(50, 0.25)]


def test_bad_records_are_value_errors(tmp_path: Path) -> None:
    with Logbook.open(tmp_path, run_name="a") as book:
        with pytest.raises(ValueError, match="step must be an integer, got None"):
            book.record_status({"loss": 0.5})
        with pytest.raises(ValueError, match="peer: this record takes no peer name"):
            book.record_status(STATUS, peer="peer-0")
        with pytest.raises(ValueError, match="time_s"):
            book.record_status(STATUS, time_s=1.0)
    with pytest.raises(ValueError, match="closed"):
        book.record_status(STATUS)
    assert rows(tmp_path / "metrics.csv") == []


def test_without_tensorboard_log_dir_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package is absent (as an import sees it): one line before anything is written."""
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(LogbookError) as checked:
        check_log_dir(tmp_path / "run")
    with pytest.raises(LogbookError) as opened:
        Logbook.open(tmp_path / "run", run_name="a")
    assert str(checked.value) == str(opened.value) == TENSORBOARD_MISSING
    assert TENSORBOARD_MISSING == (
        "--log-dir: TensorBoard logging needs the tensorboard package; "
        "pip install 'gossipnet[logging]'"
    )
    assert list(tmp_path.iterdir()) == []


def test_mlflow_is_skipped_where_it_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not importable, as in our own venv
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "mlruns"))
    assert not mlflow_enabled()
    with Logbook.open(tmp_path / "run", run_name="a") as book:
        book.record_status(STATUS)
    assert not (tmp_path / "mlruns").exists()
    assert len(rows(tmp_path / "run" / "metrics.csv")) == 1


STAND_IN = '''
"""A stand-in for mlflow's client API (MlflowClient: get_experiment_by_name,
create_experiment, create_run(experiment_id, run_name=), log_metric(run_id, key, value,
timestamp=, step=), set_terminated(run_id)) that appends each call to calls.jsonl."""
import json, os, types

def _note(*call):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as out:
        out.write(json.dumps(call) + "\\n")

class MlflowClient:
    def get_experiment_by_name(self, name):
        return None
    def create_experiment(self, name):
        _note("create_experiment", name)
        return "7"
    def create_run(self, experiment_id, run_name=None):
        _note("create_run", experiment_id, run_name)
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))
    def log_metric(self, run_id, key, value, timestamp=None, step=None):
        if os.environ.get("STAND_IN_FAILS"):
            raise ConnectionError("tracking server down")
        _note("log_metric", run_id, key, value, step)
    def set_terminated(self, run_id):
        _note("set_terminated", run_id)
'''


@pytest.fixture
def stand_in_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable ``mlflow`` (the stand-in above); returns its calls file."""
    package = tmp_path / "site" / "mlflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(STAND_IN))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "mlflow", raising=False)
    return package / "calls.jsonl"


def calls(path: Path) -> list[list[Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_mlflow_gets_the_same_values_when_installed_and_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_in_mlflow: Path
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert not mlflow_enabled()  # installed but not configured: not used
    Logbook.open(tmp_path / "off", run_name="a").close()
    assert calls(stand_in_mlflow) == []
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "swarm-7")
    assert mlflow_enabled()
    with Logbook.open(tmp_path / "on", run_name="peer-a") as book:
        book.record_status({"step": 5, "loss": 0.5, "exchanges": {"ok": 2, "failed": 0}})
    assert calls(stand_in_mlflow) == [
        ["create_experiment", "swarm-7"],
        ["create_run", "7", "peer-a"],
        ["log_metric", "r1", "loss", 0.5, 5],
        ["log_metric", "r1", "exchanges_ok", 2.0, 5],
        ["log_metric", "r1", "exchanges_failed", 0.0, 5],
        ["set_terminated", "r1"],
    ]


def test_a_failing_mlflow_is_dropped_and_the_csv_goes_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stand_in_mlflow: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("STAND_IN_FAILS", "1")
    with Logbook.open(tmp_path, run_name="a") as book:
        book.record_status(STATUS)
        book.record_status({**STATUS, "step": 60})
    assert [row["step"] for row in rows(tmp_path / "metrics.csv")] == ["50", "60"]
    warnings = [r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()]
    assert warnings == ["MLflow logging stopped: ConnectionError: tracking server down"]
    assert [call[0] for call in calls(stand_in_mlflow)] == ["create_run"]  # never terminated
