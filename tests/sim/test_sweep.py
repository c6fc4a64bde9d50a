"""Sweeps: the grid, validation before anything runs, the store that resumes, progress, the
tidy table, the figure, local processes and Ray giving the same rows, and the CLI."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gossipnet.cli import main as gossipnet_main
from sim.config import load_experiment
from sim.metrics import COLUMNS
from sim.sweep import (
    SweepError,
    SweepOutcome,
    apply,
    execute,
    parse_axis,
    parse_setting,
    parse_value,
    plan_sweep,
    result_table,
    run_key,
    split_values,
    write_outputs,
)
from sim.sweep_executors import LocalExecutor, RayExecutor, RunDone, RunFailed
from sim.sweep_figure import draw_sweep, final_accuracy
from sim.sweep_progress import SweepProgress, format_duration
from sim.sweep_store import RunStore
from sim.sweep_table import MissingDependency, flatten, table, write_csv, write_parquet

ROOT = Path(__file__).resolve().parents[2]

TINY = """
name = "tiny"
seed = 3
rounds = 2
eval_every = 1

[workload]
dataset = "synthetic:num_samples=200"
peers = 6
batch_size = 8
model = "mlp:hidden=8"

[optimizer]
lr = 0.1

[algorithm]
name = "dpsgd"
topology = "random-regular"
topology_params = {degree = 3, seed = 1}
aggregator = "trimmed-mean:b=1"

[byzantine]
count = 1
attack = "sign-flip"

[output]
csv = "ignored-by-sweeps.csv"
"""


def write(folder: Path, text: str = TINY, name: str = "tiny.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def exit_code(argv: list[str]) -> int:
    """``gossipnet ARGV`` run in this process: the exit code it returns or exits with."""
    try:
        return gossipnet_main(argv)
    except SystemExit as exit:
        assert isinstance(exit.code, int)
        return exit.code


def gossipnet(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gossipnet", "sim", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


# --- the grid -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        ("0.05", 0.05),
        ("1e-3", 1e-3),
        ("true", True),
        ("false", False),
        ("ring", "ring"),
        ("trimmed-mean:b=4", "trimmed-mean:b=4"),
        ('"8"', "8"),
        ("2026-01-01", "2026-01-01"),  # a TOML date is not a number: it stays text
    ],
)
def test_values_are_toml_numbers_and_booleans_else_text(text: str, value: Any) -> None:
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_a_specs_own_parameters_after_a_comma_stay_with_it() -> None:
    assert split_values("mean,krum:f=1,m=2,median") == ["mean", "krum:f=1,m=2", "median"]
    assert split_values("mean, trimmed-mean:b=4") == ["mean", "trimmed-mean:b=4"]
    # a key=value piece without a spec before it is a value of its own
    assert split_values("a=1,b=2") == ["a=1", "b=2"]


def test_short_names_map_to_the_files_fields_and_dotted_paths_pass_through() -> None:
    assert parse_axis("aggregator=mean,median").path == ("algorithm", "aggregator")
    assert parse_axis("attack=sign-flip").path == ("byzantine", "attack")
    assert parse_axis("peers=8,16").values == (8, 16)
    assert parse_axis("seed=0,1").path == ("seed",)
    degree = parse_axis("algorithm.topology_params.degree=3,4")
    assert degree.path == ("algorithm", "topology_params", "degree")
    assert degree.column == "algorithm.topology_params.degree"
    # `algorithm` is also a Record field: its column is the dotted path
    assert parse_axis("algorithm=dpsgd").column == "algorithm.name"
    assert parse_axis("aggregator=mean").column == "aggregator"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("aggregator", r"--grid: expected FIELD=VALUE1,VALUE2"),
        ("aggregator=mean,,median", r"--grid: aggregator: empty value"),
        ("aggregator=mean,mean", r"--grid: aggregator: value 'mean' is given twice"),
        ("aggregatr=mean", r"--grid: unknown field 'aggregatr'; allowed: algorithm, "),
        ("optimizer..lr=1", r"--grid: 'optimizer..lr' is not a field name"),
    ],
)
def test_bad_grid_text_names_the_flag_and_the_choices(text: str, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        parse_axis(text)


def test_a_setting_takes_one_value() -> None:
    assert parse_setting("rounds=3") == (("rounds",), 3)
    with pytest.raises(SweepError, match="--set: rounds: takes one value"):
        parse_setting("rounds=3,4")


def test_changing_the_algorithm_keeps_only_its_keys_and_goes_first() -> None:
    data = {"algorithm": {"name": "dpsgd", "topology": "torus", "aggregator": "median"}}
    pushed = apply(data, [(("algorithm", "name"), "push-sum")])
    assert pushed["algorithm"] == {"name": "push-sum", "topology": "torus"}
    # whatever the order given, the aggregator lands on the new algorithm's table
    later = apply(data, [(("algorithm", "aggregator"), "mean"), (("algorithm", "name"), "dpsgd")])
    assert later["algorithm"]["aggregator"] == "mean"
    assert data["algorithm"]["aggregator"] == "median"  # the base tables are not touched


def test_the_algorithm_axis_matches_with_algorithm(tmp_path: Path) -> None:
    text = TINY.replace("count = 1", "count = 0").replace('"random-regular"', '"graph"')
    text = text.replace("topology_params = {degree = 3, seed = 1}\n", "")
    text += "\n[graph]\nedges = [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0]]\n"
    path = write(tmp_path, text)
    plan = plan_sweep(path, [parse_axis("algorithm=dpsgd,push-sum,allreduce")])
    base = load_experiment(path)
    assert [p.config.graph is None for p in plan.points] == [False, False, True]
    for point in plan.points:
        expected = base.with_algorithm(point.config.algorithm.name)
        assert point.config == dataclasses.replace(expected, name=base.name)


# --- planning -------------------------------------------------------------------------------


def test_an_invalid_point_is_refused_before_anything_runs_naming_point_and_field(
    tmp_path: Path,
) -> None:
    path = write(tmp_path)
    axes = [parse_axis("aggregator=mean,krum:f=3"), parse_axis("attack=sign-flip,alie")]
    with pytest.raises(SweepError) as error:
        plan_sweep(path, axes)
    message = str(error.value)
    assert message.startswith("--grid: grid point aggregator=krum:f=3, attack=sign-flip")
    assert "algorithm.aggregator: krum:f=3 cannot run" in message
    assert "(and 1 more)" in message and "--skip-invalid" in message
    plan = plan_sweep(path, axes, skip_invalid=True)
    assert [p.label() for p in plan.points] == [
        "aggregator=mean, attack=sign-flip",
        "aggregator=mean, attack=alie",
    ]
    assert [p.label() for p in plan.invalid] == [
        "aggregator=krum:f=3, attack=sign-flip",
        "aggregator=krum:f=3, attack=alie",
    ]


def test_a_field_the_other_algorithm_does_not_read_is_an_invalid_point(tmp_path: Path) -> None:
    path = write(tmp_path, TINY.replace("count = 1", "count = 0"))
    axes = [parse_axis("algorithm=dpsgd,allreduce"), parse_axis("aggregator=mean")]
    with pytest.raises(SweepError, match=r"algorithm=allreduce, aggregator=mean is invalid: "):
        plan_sweep(path, axes)


def test_an_axis_given_twice_or_also_set_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    with pytest.raises(SweepError, match="--grid: aggregator is given twice"):
        plan_sweep(path, [parse_axis("aggregator=mean"), parse_axis("aggregator=median")])
    with pytest.raises(SweepError, match="--set: seed is also a --grid field"):
        plan_sweep(path, [parse_axis("seed=0,1")], settings=[(("seed",), 2)])
    with pytest.raises(SweepError, match="--grid: give at least one"):
        plan_sweep(path, [])


def test_the_run_key_is_the_resolved_config_without_output(tmp_path: Path) -> None:
    path = write(tmp_path)
    plan = plan_sweep(path, [parse_axis("aggregator=trimmed-mean:b=1,median")])
    first, second = plan.points
    assert first.key != second.key
    same = plan_sweep(path, [parse_axis("optimizer.lr=0.1")]).points[0]  # the file's own lr
    assert same.key == first.key
    no_output = write(tmp_path, TINY.replace('csv = "ignored-by-sweeps.csv"', ""), "b.toml")
    assert run_key(load_experiment(no_output)) == first.key
    # a default left out and the same default written resolve to one key
    implicit = write(tmp_path, TINY.replace('aggregator = "trimmed-mean:b=1"', ""), "c.toml")
    explicit = plan_sweep(implicit, [parse_axis("aggregator=mean")]).points[0]
    assert explicit.key == run_key(load_experiment(implicit))


def test_the_title_names_what_every_run_shares(tmp_path: Path) -> None:
    plan = plan_sweep(write(tmp_path), [parse_axis("aggregator=mean")])
    assert plan.describe() == "tiny: dpsgd, 6 peers (1 Byzantine, sign-flip), 2 rounds"
    plan = plan_sweep(write(tmp_path), [parse_axis("attack=alie"), parse_axis("rounds=1,2")])
    assert plan.describe() == "tiny: dpsgd, 6 peers (1 Byzantine)"


# --- the store ------------------------------------------------------------------------------


def test_the_store_keeps_finished_runs_and_forgets_broken_ones(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    assert store.load("abc") is None
    records = [{"round": 0, "train_loss": math.nan, "test_accuracy": 0.5}]
    store.save("abc", values={"seed": 1}, data={"seed": 1}, records=records)
    assert store.load("abc") == [{"round": 0, "train_loss": None, "test_accuracy": 0.5}]
    assert json.loads(store.path("abc").read_text())["grid"] == {"seed": 1}
    assert not list(store.folder.glob("*.tmp"))  # written atomically, nothing left behind
    store.path("abc").write_text(store.path("abc").read_text()[:40])  # truncated
    assert store.load("abc") is None
    store.save("abc", values={}, data={}, records=records)
    store.path("other").write_text(store.path("abc").read_text())  # another run's content
    assert store.load("other") is None


# --- progress -------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 4.2, 130, 3900)] == ["0s", "5s", "2m10s", "1h05m"]


def test_progress_writes_plain_lines_with_an_estimate_when_not_a_terminal() -> None:
    stream, clock = io.StringIO(), FakeClock()
    progress = SweepProgress(stream=stream, clock=clock, interval=30)
    progress.start({"a": 10, "b": 10, "c": 10}, reused=1, where="2 local processes")
    assert progress.seconds_left() is None
    clock.now += 10
    progress.round_done("a", 5)
    progress.tick()  # less than 30 s since the last line: nothing
    clock.now += 20
    progress.run_done("a")  # 10 of 30 rounds in 30 s: 20 rounds left, ~60 s
    clock.now += 31
    progress.round_done("b", 5)
    progress.tick()
    progress.run_failed("c", "seed=2", "workload.dataset: no such file")
    progress.run_done("b")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "sweep: 4 runs, 1 already done, 3 to run on 2 local processes",
        "sweep: 2/4 runs done, ~1m00s left",
        "sweep: 2/4 runs done, ~1m01s left",
        "sweep: run seed=2 failed: workload.dataset: no such file",
        "sweep: 3/4 runs done (1 failed), ~0s left",
        "sweep: 3/4 runs done, 1 failed in 1m01s",
    ]


def test_quiet_progress_writes_nothing_but_still_counts() -> None:
    stream = io.StringIO()
    progress = SweepProgress(stream=stream, quiet=True)
    progress.start({"a": 3}, reused=0, where="here")
    progress.run_done("a")
    progress.close()
    assert stream.getvalue() == "" and progress.finished == 1


# --- the table ------------------------------------------------------------------------------


def test_rows_are_grid_values_then_run_then_record_fields_flattened() -> None:
    assert flatten({"a": 1, "g": {"x": 2, "y": {"z": 3}}, "l": [1, 2]}) == {
        "a": 1,
        "g.x": 2,
        "g.y.z": 3,
        "l": "[1, 2]",
    }
    columns, rows = table(
        [
            ({"aggregator": "mean"}, "k1", [{"round": 0, "acc": 0.1}, {"round": 1, "acc": 0.2}]),
            ({"aggregator": "median"}, "k2", [{"round": 0, "acc": 0.3, "group/a/acc": 0.5}]),
        ]
    )
    assert columns == ["aggregator", "run", "round", "acc", "group/a/acc"]
    assert [row["run"] for row in rows] == ["k1", "k1", "k2"]


def test_csv_and_parquet_hold_the_same_table(tmp_path: Path) -> None:
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    columns = ["grid", "flag", "value", "missing"]
    rows = [
        {"grid": 4, "flag": True, "value": 0.5, "missing": None},
        {"grid": "ring", "flag": False, "value": None},
    ]
    write_csv(columns, rows, tmp_path / "t.csv")
    with (tmp_path / "t.csv").open() as handle:
        assert list(csv.reader(handle)) == [
            columns,
            ["4", "true", "0.5", ""],
            ["ring", "false", "", ""],
        ]
    write_parquet(columns, rows, tmp_path / "t.parquet", metadata={"k": "v"})
    loaded = pyarrow_parquet.read_table(tmp_path / "t.parquet")
    assert loaded.column_names == columns
    assert loaded.column("grid").to_pylist() == ["4", "ring"]  # mixed types: text
    assert loaded.column("flag").to_pylist() == [True, False]
    assert loaded.column("value").to_pylist() == [0.5, None]
    assert loaded.schema.metadata == {b"k": b"v"}


def test_parquet_without_pyarrow_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # what an install without it sees
    with pytest.raises(MissingDependency, match="pyarrow is not installed"):
        write_parquet(["a"], [{"a": 1}], tmp_path / "t.parquet")


def test_outputs_skip_parquet_without_pyarrow_unless_it_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_sweep(write(tmp_path), [parse_axis("seed=0,1")])
    outcome = SweepOutcome(plan, records={plan.points[0].key: records(0.1, 0.6)})
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    written = write_outputs(outcome, tmp_path / "out", figure=False)
    assert set(written) == {"csv"}
    with (tmp_path / "out" / "results.csv").open() as handle:
        assert [row["seed"] for row in csv.DictReader(handle)] == ["0", "0"]  # seed=1 not run
    with pytest.raises(MissingDependency):
        write_outputs(outcome, tmp_path / "out", parquet=True, figure=False)


# --- the figure -----------------------------------------------------------------------------


def records(*accuracies: float) -> list[dict[str, Any]]:
    return [{"round": i, "test_accuracy": a} for i, a in enumerate(accuracies)]


def texts(figure: Any) -> list[str]:
    return [t.get_text() for axis in figure.axes for t in axis.texts]


def test_final_accuracy_skips_missing_values() -> None:
    assert final_accuracy(records(0.1, 0.4)) == 0.4
    assert final_accuracy([*records(0.3), {"round": 1, "test_accuracy": None}]) == 0.3
    assert math.isnan(final_accuracy("invalid"))


def test_the_heatmap_writes_every_number_on_the_whole_accuracy_range() -> None:
    cells = {
        ("mean", "alie"): records(0.1, 0.25),
        ("mean", "ipm"): records(0.1, 0.875),
        ("median", "alie"): "invalid",
        ("median", "ipm"): records(0.1, 0.5),
    }
    figure = draw_sweep(
        ["aggregator", "attack"], [["mean", "median"], ["alie", "ipm"]], cells, title="t"
    )
    heat = figure.axes[0]
    assert heat.images[0].get_clim() == (0.0, 1.0)
    assert sorted(texts(figure)) == ["0.250", "0.500", "0.875", "invalid"]
    assert [t.get_text() for t in heat.get_yticklabels()] == ["mean", "median"]
    assert all(
        axis.get_xscale() == "linear" and axis.get_yscale() == "linear" for axis in figure.axes
    )
    assert "final test accuracy" in figure.get_suptitle()


def test_one_axis_draws_bars_and_more_draw_small_multiples() -> None:
    bars = draw_sweep(
        ["seed"], [["0", "1"]], {("0",): records(0.2, 0.9), ("1",): "failed"}, title="t"
    )
    assert sorted(texts(bars)) == ["0.900", "failed"]
    assert bars.axes[0].get_xlim() == (0.0, 1.0)
    labels = [["a", "b"], ["x"], ["p", "q"]]
    cells = {(a, x, p): records(0.1, 0.5) for a in labels[0] for x in labels[1] for p in labels[2]}
    cells[("b", "x", "q")] = "invalid"
    multiples = draw_sweep(["one", "two", "three"], labels, cells, title="t")
    visible = [axis for axis in multiples.axes if axis.get_visible()]
    assert len(visible) == 2  # one panel per (one, two)
    assert [len(axis.lines) for axis in visible] == [2, 1]
    assert any("q (invalid)" in text for text in texts(multiples))


# --- running --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_that_fails_is_reported_and_not_stored(tmp_path: Path) -> None:
    path = write(tmp_path)
    plan = plan_sweep(
        path, [parse_axis("workload.dataset=synthetic:num_samples=200,npz:path=missing.npz")]
    )
    store = RunStore(tmp_path / "out")
    stream = io.StringIO()
    outcome = execute(
        plan, LocalExecutor(2), store=store, progress=SweepProgress(stream=stream, live=False)
    )
    assert outcome.executed == 1 and len(outcome.failed) == 1
    (failed,) = outcome.failed.values()
    assert "missing.npz" in failed
    assert "failed: " in stream.getvalue()
    assert len(list(store.folder.glob("*.json"))) == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_local_processes_run_each_task_and_report_rounds(tmp_path: Path) -> None:
    plan = plan_sweep(write(tmp_path), [parse_axis("seed=0,1")])
    events = list(LocalExecutor(2, report_interval=0.0).run(plan.tasks()))
    done = {e.key: e.records for e in events if isinstance(e, RunDone)}
    assert set(done) == {p.key for p in plan.points}
    assert not [e for e in events if isinstance(e, RunFailed)]
    first = next(iter(done.values()))
    assert [r["round"] for r in first] == [0, 1, 2]
    assert list(first[0])[: len(COLUMNS)] == list(COLUMNS)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ray_gives_the_same_rows_as_local_processes(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    path = write(tmp_path)
    axes = [parse_axis("aggregator=mean,median"), parse_axis("attack=sign-flip,alie")]
    plan = plan_sweep(path, axes)
    local = execute(plan, LocalExecutor(2))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = execute(plan, RayExecutor("auto"))
        assert ray.is_initialized()  # an instance it did not start is left running
    finally:
        ray.shutdown()
    assert not local.failed and not remote.failed
    assert result_table(remote) == result_table(local)
    assert len(result_table(local)[1]) == 4 * 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweep_cli_writes_table_parquet_figure_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The done-when check, quick: aggregator x attack on examples/experiments/byzantine.toml,
    a few rounds; then the same command again redoes nothing, and a lost run is redone (the
    first command in a real process, the two after it through the same entry point in this
    process, which saves a Python start-up each)."""
    out = tmp_path / "out"
    command = [
        "sweep",
        str(ROOT / "examples/experiments/byzantine.toml"),
        "--grid",
        "aggregator=mean,trimmed-mean:b=4",
        "--grid",
        "attack=sign-flip,alie:f=4",
        "--rounds",
        "2",
        "--set",
        "workload.dataset=mnist1d:num_samples=1000",
        "--jobs",
        "2",
        "--out",
        str(out),
    ]
    first = gossipnet(*command, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # progress goes to stderr as plain lines when it is not a terminal
    assert "sweep: 4 runs, 4 to run on 2 local processes" in first.stderr
    assert "sweep: 4/4 runs done in " in first.stderr
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    header = list(rows[0])
    assert header[:3] == ["aggregator", "attack", "run"]
    assert header[3 : 3 + len(COLUMNS)] == list(COLUMNS)
    assert len(rows) == 4 * 2  # four runs, evaluated at rounds 0 and 2
    assert {(r["aggregator"], r["attack"]) for r in rows} == {
        (a, b) for a in ("mean", "trimmed-mean:b=4") for b in ("sign-flip", "alie:f=4")
    }
    assert {r["round"] for r in rows} == {"0", "2"}
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    assert pyarrow_parquet.read_table(out / "results.parquet").num_rows == 8
    assert (out / "accuracy.png").stat().st_size > 10_000
    stored = sorted((out / "runs").glob("*.json"))
    assert len(stored) == 4
    times = {path: path.stat().st_mtime_ns for path in stored}

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert exit_code(["sim", *command]) == 0
    assert "sweep: 4 runs, 4 already done, 0 to run" in capsys.readouterr().err
    assert {path: path.stat().st_mtime_ns for path in stored} == times
    with (out / "results.csv").open() as handle:
        assert list(csv.DictReader(handle)) == rows

    stored[0].unlink()  # as if that run had been interrupted before it was stored
    assert exit_code(["sim", *command]) == 0
    assert "sweep: 4 runs, 3 already done, 1 to run" in capsys.readouterr().err
    assert stored[0].exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweep_cli_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first case in a real process; the others through the same entry point in-process
    (``gossipnet.cli.main``), which saves a Python start-up each."""
    path = write(tmp_path)
    cases = [
        (["--grid", "aggregatr=mean"], "--grid: unknown field 'aggregatr'"),
        (["--grid", "aggregator=krum:f=3"], "--grid: grid point aggregator=krum:f=3 is invalid"),
        (["--grid", "seed=0", "--jobs", "0"], "--jobs: must be an integer >= 1"),
    ]
    flags, message = cases[0]
    result = gossipnet("sweep", str(path), *flags, "--out", "out", cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    monkeypatch.chdir(tmp_path)
    for flags, message in cases[1:]:
        assert exit_code(["sim", "sweep", str(path), *flags, "--out", "out"]) == 2
        err = capsys.readouterr().err
        assert message in err
        assert len(err.strip().splitlines()) == 1, err


def test_compare_errors_name_compares_own_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sim compare`` has no ``--grid`` and no ``--skip-invalid``: its errors name
    ``--over`` or ``--algorithms``, and never suggest a flag it lacks."""
    path = write(tmp_path)
    for flags, message in (
        (["--over", "aggregator=krum:f=3"], "--over: run aggregator=krum:f=3 is invalid"),
        (["--over", "aggregatr=mean"], "--over: unknown field 'aggregatr'"),
        (["--algorithms", "dpsgd,nope"], "--algorithms: unknown nope"),
    ):
        assert exit_code(["sim", "compare", str(path), *flags]) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert "--grid" not in err and "--skip-invalid" not in err, err
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compare_over_an_aggregator_writes_csv_with_progress_lines(tmp_path: Path) -> None:
    path = write(tmp_path)
    result = gossipnet(
        "compare",
        str(path),
        "--over",
        "aggregator=mean,median",
        "--jobs",
        "2",
        "--csv",
        "cmp.csv",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "compare: 2 runs, 2 to run on 2 local processes" in result.stderr
    assert "compare: 2/2 runs done in " in result.stderr
    assert "median" in result.stdout
    with (tmp_path / "cmp.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["aggregator"] for r in rows] == ["mean"] * 3 + ["median"] * 3
    assert list(rows[0])[:2] == ["aggregator", "run"]
