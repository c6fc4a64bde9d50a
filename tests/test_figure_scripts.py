"""examples/outer_momentum_figure.py: its lead is averaging's loss less Nesterov's at the
evaluations both runs have, and it draws a figure from records as ``sim compare --jsonl`` and
``sim run --csv`` write them."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "outer_momentum_figure.py"


@pytest.fixture(scope="module")
def figure() -> ModuleType:
    spec = importlib.util.spec_from_file_location("outer_momentum_figure", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(run: str, steps: int, bits: float | None) -> dict[str, object]:
    return {"run": run, "round": steps, "steps": steps, "test_bits_per_byte": bits}


def test_lead_is_averaging_less_nesterov_where_both_evaluated(figure: ModuleType) -> None:
    nesterov = figure.curve([_record("n", 0, 8.0), _record("n", 16, 3.0), _record("n", 32, 2.5)], 8)
    averaging = figure.curve(
        [_record("a", 0, 8.0), _record("a", 16, 3.5), _record("a", 48, 2.9)], 8
    )
    assert nesterov == [(0.0, 8.0), (2.0, 3.0), (4.0, 2.5)]  # steps per peer
    assert figure.lead(nesterov, averaging) == [(2.0, 0.5)]  # step 0 left out, 4 unmatched
    assert figure.curve([_record("n", 8, None)], 8) == []  # not evaluated: no point


def test_draws_from_compare_jsonl_and_run_csv(figure: ModuleType, tmp_path: Path) -> None:
    records = tmp_path / "long.jsonl"
    lines = [
        json.dumps(
            _record(f"{outer}, H={h}", steps, 4.0 - steps / 1000 - (outer == "Nesterov") / 10)
        )
        for h in figure.H_VALUES
        for outer in ("Nesterov", "averaging")
        for steps in (0, 800, 1600)
    ]
    records.write_text("\n".join(lines) + "\n")
    dp = tmp_path / "dp.csv"
    with dp.open("w", newline="") as handle:  # sim run's CSV has no run column
        writer = csv.DictWriter(handle, ["round", "steps", "test_bits_per_byte"])
        writer.writeheader()
        writer.writerows(
            {"round": s, "steps": s, "test_bits_per_byte": 3.9 - s / 1000} for s in (0, 1600)
        )
    out = tmp_path / "figure.png"
    assert figure.main([str(records), "--data-parallel", str(dp), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_records_without_the_runs_are_one_line_and_exit_2(
    figure: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "other.jsonl"
    records.write_text(json.dumps(_record("data parallel", 0, 8.0)) + "\n")
    with pytest.raises(SystemExit) as exited:
        figure.main([str(records), "--out", str(tmp_path / "f.png")])
    assert exited.value.code == 2
    assert "no records of the runs Nesterov, H=10, averaging, H=10" in capsys.readouterr().err
    assert not (tmp_path / "f.png").exists()
