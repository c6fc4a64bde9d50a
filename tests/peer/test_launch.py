"""``gossipnet launch``, ``demo`` and ``status`` as real OS processes."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .conftest import started_peer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def cache(dataset_cache: Path) -> str:
    """The run's MNIST-1D cache (tests/conftest.py): the launcher generates a data set once,
    its peers and later launches read it."""
    return str(dataset_cache)


def gossipnet(*args: str) -> list[str]:
    return [sys.executable, "-m", "gossipnet", *args]


def environment(cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GOSSIPNET_SECRET"}
    return {**env, "GOSSIPNET_CACHE": cache}


def final_status(path: Path) -> dict[str, Any]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def test_launch_reaches_the_centralized_accuracy_with_a_client_only_peer(
    tmp_path: Path, cache: str
) -> None:
    """Two listening peers and a client-only one (three listening before: one more start-up
    and 300 rounds of exchanges; the accuracies stay as close to the centralized run)."""
    result = subprocess.run(
        gossipnet("launch", "--peers", "3", "--client-only", "1", "--steps", "300",
                  "--dataset", "mnist1d:num_samples=4000", "--dir", str(tmp_path), "--json"),
        capture_output=True, text=True, env=environment(cache), cwd=ROOT, timeout=110,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(result.stdout.splitlines()[-1])
    reference = results["centralized"]["test_accuracy"]
    accuracies = [peer["test_accuracy"] for peer in results["peers"]]
    assert reference > 0.45  # far above chance (0.1)
    assert [peer["step"] for peer in results["peers"]] == [300] * 3
    assert min(accuracies) > reference - 0.08, (accuracies, reference)
    assert sum(accuracies) / 3 > reference - 0.05, (accuracies, reference)
    assert results["centralized"]["samples"] == 300 * 3 * 32
    # The client-only peer listened nowhere yet exchanged with the swarm both ways,
    # and the listening peers knew it (while it trained: when it stops it says goodbye, and
    # a peer's last lines no longer count it as a neighbour).
    client = final_status(tmp_path / "peer-2.out")
    assert not (tmp_path / "peer-2.address").exists()
    assert client["bytes_in"] > 0 and client["bytes_out"] > 0 and client["neighbours"]
    seen_by = [
        i
        for i in range(2)
        for line in (tmp_path / f"peer-{i}.out").read_text().splitlines()
        if line.startswith("{") and "peer-2" in json.loads(line)["neighbours"]
    ]
    assert seen_by
    assert "centralized" in result.stdout and "vs centralized" in result.stdout
    # Every peer averaged throughout: exchanges counted, none isolated, in the table too.
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "vs centralized" in line)
    assert "exchanges ok" in header and "failed" in header
    for peer in results["peers"]:
        assert peer["exchanges_ok"] > 150, peer  # one call a round (fanout 1), 300 rounds
        assert 0 <= peer["exchanges_failed"] < peer["exchanges_ok"], peer
        assert peer["isolated"] is False, peer
        row = next(line for line in lines if f" {peer['id']} " in line and "%" in line)
        assert f" {peer['exchanges_ok']} " in row and "ISOLATED" not in row
    secret = tmp_path / "swarm.secret"
    assert secret.stat().st_mode & 0o077 == 0 and len(secret.read_text()) == 64


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def step_of(address: str) -> int:
    with urllib.request.urlopen(f"http://{address}/v1/status", timeout=5) as response:
        return int(json.loads(response.read())["step"])


def test_ctrl_c_stops_every_peer_and_leaves_no_orphans(tmp_path: Path, cache: str) -> None:
    """Two peers (three before: each is a Python and torch start-up, and each trains flat out
    until the signal; two already stop as a group and report apart)."""
    launcher = subprocess.Popen(
        gossipnet("launch", "--peers", "2", "--steps", "1000000", "--dataset",
                  "synthetic:num_samples=600", "--dir", str(tmp_path), "--progress", "lines",
                  "--json"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(cache), cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            files = [tmp_path / f"peer-{i}.pid" for i in range(2)]
            addresses = [tmp_path / f"peer-{i}.address" for i in range(2)]
            if all(f.exists() for f in [*files, *addresses]):
                break
            assert launcher.poll() is None, launcher.communicate()
            time.sleep(0.1)
        pids = [int((tmp_path / f"peer-{i}.pid").read_text()) for i in range(2)]
        for i in range(2):  # every peer is training
            address = (tmp_path / f"peer-{i}.address").read_text()
            while step_of(address) < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for i in range(2):  # each stopped cleanly: a final line and an evaluation
        assert final_status(tmp_path / f"peer-{i}.out")["stopped"] is True
        assert json.loads((tmp_path / f"peer-{i}.eval.json").read_text())["step"] > 0
    # The final table tells the truth: the steps reached, not the 1,000,000 asked for.
    results = json.loads(out.splitlines()[-1])
    reached = sorted(peer["step"] for peer in results["peers"])
    assert reached[0] > 0 and reached[-1] < 1_000_000 and results["all_reached_steps"] is False
    span = str(reached[0]) if reached[0] == reached[-1] else f"{reached[0]}-{reached[-1]}"
    assert f"test accuracy after {span} of 1000000 steps of batch 32 (stopped early)" in out
    assert [peer["state"] for peer in results["peers"]] == ["stopped"] * 2
    assert not any("error" in peer for peer in results["peers"])  # a clean stop, not a failure
    assert "failed" not in err


def test_the_old_compress_flag_of_launch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from gossipnet.cli import main

    with pytest.raises(SystemExit) as info:
        main(["launch", "--compress", "fp16"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gossipnet launch: error: unrecognized arguments: --compress fp16"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launch", "--peers", "1"], "--peers: must be an integer in [2, 64], got 1"),
        (
            ["launch", "--peers", "3", "--client-only", "3"],
            "--client-only: must be in [0, --peers=3)",
        ),
        (
            ["launch", "--topology", "ring", "--client-only", "1"],
            "--client-only: cannot be combined",
        ),
        (["launch", "--steps", "0"], "--steps: must be >= 1"),
        (["launch", "--dataset", "nosuch"], "--dataset: unknown dataset 'nosuch'"),
        (["demo", "--lr", "-1"], "--lr: must be a finite number > 0"),
        (
            ["launch", "--aggregator", "krum:f=x"],
            "--aggregator: krum: parameter f must be an integer",
        ),
        (["launch", "--compressor", "topk"], "--compressor: topk drops most coordinates"),
        (["demo", "--algorithm", "choco"], "--topology: is required for choco"),
        (["launch", "--byzantine", "sign-flip"], "--byzantine: must be K:ATTACK"),
        (["launch", "--byzantine", "4:sign-flip"], "--byzantine: K must be in [1, 4)"),
        (
            ["launch", "--byzantine", "1:nosuch", "--algorithm", "dpsgd"],
            "--byzantine: unknown attack 'nosuch'",
        ),
        (
            ["launch", "--byzantine", "1:sign-flip", "--algorithm", "ad-psgd"],
            "--byzantine: needs a synchronous algorithm",
        ),
        (["launch", "--algorithm", "dpsgd", "--mode", "async"], "--mode: 'async' contradicts"),
        (["launch", "--topology", "moebius"], "--topology: topology spec 'moebius': unknown"),
        # issue 15: a robust rule that cannot run is refused before any process starts
        (
            ["launch", "--peers", "3", "--aggregator", "trimmed-mean:b=1", "--steps", "200"],
            "--aggregator: trimmed-mean:b=1 cannot run: trimmed-mean needs n > 2b, got n=2, b=1; "
            "an AD-PSGD exchange averages 2 models",
        ),
        (
            [
                "launch",
                "--peers",
                "4",
                "--algorithm",
                "dpsgd",
                "--topology",
                "ring",
                "--aggregator",
                "krum:f=1",
            ],
            "--aggregator: krum:f=1 cannot run: krum needs n > 2f+2, got n=3, f=1; topology "
            "'ring' on 4 peers gives a node as few as 2 neighbour(s)",
        ),
        (
            ["launch", "--peers", "4", "--algorithm", "dpsgd", "--aggregator", "krum:f=1"],
            "--aggregator: krum:f=1 cannot run: krum needs n > 2f+2, got n=4, f=1; --peers 4 "
            "without --topology",
        ),
        (["launch", "--peers", "3", "--topology", "hypercube"], "--topology: "),
        (
            ["launch", "--max-serving-share", "2"],
            "gossipnet launch: error: --max-serving-share: must be in (0, 1]; got 2.0",
        ),
        (
            ["launch", "--algorithm", "choco", "--topology", "ring", "--consensus-step", "0"],
            "gossipnet launch: error: --consensus-step: must be in (0, 1]; got 0.0",
        ),
        (["demo", "--peers", "x"], "--peers: invalid int value: 'x'"),
        (["status"], "the following arguments are required: URL"),
        (
            ["status", "ftp://127.0.0.1:7000"],
            "URL: scheme 'ftp' in 'ftp://127.0.0.1:7000'; allowed: http",
        ),
        (["status", "127.0.0.1"], "URL: must be HOST:PORT"),
        (
            ["launch", "--peer-args", "--lr x"],
            "gossipnet launch: error: --peer-args: --lr: invalid float value: 'x'",
        ),
        (
            ["launch", "--peer-args", "--topology ring"],
            "gossipnet launch: error: --peer-args: --topology: needs --peers-file FILE",
        ),
        (["launch", "--model", "no/such/model.py:Net"], "--model: file no/such/model.py does not"),
        (["status", "http://127.0.0.1:7000/v1/peers"], "with no path"),
        (
            ["launch", "--log-dir", "/dev/null/runs"],
            "gossipnet launch: error: --log-dir: /dev/null exists and is not a directory",
        ),
    ],
)
def test_bad_flags_exit_2_with_one_clear_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gossipnet.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"gossipnet {args[0]}: error: --") or args[0] == "status"
    assert message in err[-1]
    if args[0] in ("launch", "demo", "status"):
        assert len(err) == 1, err  # one line, no usage block before it


def test_the_issue_15_launch_commands_are_refused_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One stderr line, exit 2, and no peer started (nothing written to its run directory):
    a real ``gossipnet launch`` process for the first command, the entry point in this
    process for the second (the same checks, without a Python start-up)."""
    from gossipnet.cli import main

    first = ["--peers", "3", "--aggregator", "trimmed-mean:b=1", "--steps", "200"]
    run_dir = tmp_path / "first"
    result = subprocess.run(
        [sys.executable, "-m", "gossipnet", "launch", *first, "--dir", str(run_dir)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--aggregator:" in lines[0] and "cannot run" in lines[0]
    assert not run_dir.exists() or not any(run_dir.iterdir())
    second = ["--peers", "4", "--algorithm", "dpsgd", "--topology", "ring", "--aggregator",
              "krum:f=1"]  # fmt: skip
    run_dir = tmp_path / "second"
    with pytest.raises(SystemExit) as info:
        main(["launch", *second, "--dir", str(run_dir)])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--aggregator:" in lines[0] and "cannot run" in lines[0]
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_status_of_an_unreachable_peer_exits_1(cache: str) -> None:
    result = subprocess.run(
        gossipnet("status", "127.0.0.1:1", "--timeout-s", "2"),
        capture_output=True, text=True, env=environment(cache), cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith(
        "gossipnet status: error: cannot reach http://127.0.0.1:1/v1/status"
    )


async def _status_cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *gossipnet("status", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_status_of_a_running_peer_readable_and_json() -> None:
    async with started_peer("a") as a, started_peer("b", seed=1, join=(str(a.address),)) as b:
        await b.run(steps=3)
        code, out, err = await _status_cli(f"http://{a.address}")
        assert code == 0, err
        version = a.status()["v"]  # the protocol this peer speaks
        assert out.splitlines()[0] == f"peer a  ({a.address}, ad-psgd, protocol v{version})"
        assert "compressor none, aggregator mean" in out
        assert "neighbours (1):" in out and "b " in out and "alive" in out
        assert "exchanges 3 ok, 0 failed" in out and "ISOLATED" not in out  # b's 3 calls
        code, out, err = await _status_cli(str(a.address), "--json")
        assert code == 0, err
        status = json.loads(out)
        assert status["id"] == "a" and status["neighbours"][0]["id"] == "b"
        assert status["bytes_in"] > 0 and status["algorithm"] == "ad-psgd"
        assert status["exchanges"] == {"ok": 3, "failed": 0} and status["isolated"] is False


def test_the_tables_mark_an_isolated_peer_and_show_its_exchanges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from peer.app.progress import status_row
    from peer.app.report import print_results
    from peer.app.swarm import PeerProcess

    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait(timeout=60)
    isolated = PeerProcess(0, "peer-0", process, tmp_path, client_only=False)
    isolated.status = {"step": 40, "loss": 0.5, "neighbours": [], "isolated": True,
                       "exchanges": {"ok": 7, "failed": 31}}  # fmt: skip
    assert status_row(isolated, steps=40) == [
        "peer-0 ISOLATED",
        "40",
        "0.5000",
        "0",
        "7",
        "31",
        "0 B/s",
        "finished",
    ]
    isolated.status = {"step": 40, "neighbours": ["peer-1"]}  # a client-only peer's status line
    assert status_row(isolated)[0] == "peer-0" and status_row(isolated)[4:6] == ["-", "-"]
    results = {
        "peers": [
            {"id": "peer-0", "step": 40, "test_accuracy": 0.5, "exchanges_ok": 7,
             "exchanges_failed": 31, "isolated": True},
            {"id": "peer-1", "step": 40, "test_accuracy": 0.6, "exchanges_ok": 45,
             "exchanges_failed": 0, "isolated": False},
        ],
        "centralized": {"test_accuracy": 0.55, "test_loss": 1.0, "samples": 2560, "error": None},
    }  # fmt: skip
    print_results(results, argparse.Namespace(steps=40, batch_size=32, peers=2))
    out = capsys.readouterr().out.splitlines()
    assert "exchanges ok" in next(line for line in out if "vs centralized" in line)
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out if "pts" in line]
    assert cells == [
        ["peer-0 ISOLATED", "40", "50.0%", "-5.0 pts", "7", "31"],
        ["peer-1", "40", "60.0%", "+5.0 pts", "45", "0"],
    ]


def test_the_table_shows_a_regression_peers_loss_and_leaves_it_out_of_the_mean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A model that is not a classifier evaluates to ``test_accuracy: None``: its row shows
    its test loss, and the mean accuracy is of the classifiers only (not a 0 counted in)."""
    import argparse

    from peer.app.report import print_results

    results = {
        "peers": [
            {"id": "peer-0", "step": 40, "test_accuracy": None, "test_loss": 0.0123,
             "exchanges_ok": 7, "exchanges_failed": 0},
        ],
        "centralized": {"test_accuracy": None, "test_loss": None, "samples": 0, "error": None},
    }  # fmt: skip
    print_results(results, argparse.Namespace(steps=40, batch_size=32, peers=1))
    out = capsys.readouterr().out.splitlines()
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out if "peer-0" in line]
    assert cells == [["peer-0", "40", "loss 0.0123", "-", "7", "0"]]


def test_the_state_column_says_where_each_peer_is(tmp_path: Path) -> None:
    """Real processes: one still running, one that exited cleanly, one that failed."""
    from peer.app.progress import status_row
    from peer.app.swarm import PeerProcess

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        peer = PeerProcess(0, "peer-0", alive, tmp_path, client_only=False)
        assert status_row(peer, steps=100)[1:4] + status_row(peer, steps=100)[-1:] == [
            "-", "-", "-", "starting",
        ]  # fmt: skip
        peer.status = {"step": 0, "neighbours": []}
        assert peer.state(100) == "waiting"  # listening, waiting for the others
        peer.status = {"step": 40, "neighbours": []}
        assert peer.state(100) == "running"
        peer.status = {"step": 100, "neighbours": []}
        assert peer.state(100) == "finished"  # holding until every peer is done
    finally:
        alive.kill()
        alive.wait(timeout=60)
    done = PeerProcess(1, "peer-1", subprocess.Popen([sys.executable, "-c", ""]), tmp_path, False)
    assert done.process.wait(timeout=60) == 0
    done.status = {"step": 100}
    assert done.state(100) == "finished" and not done.failed()
    done.status = {"step": 37}
    assert done.state(100) == "stopped"  # exited cleanly before its steps: Ctrl-C


def _failed_peer(tmp_path: Path, index: int, code: str, stderr: str) -> Any:
    from peer.app.swarm import PeerProcess

    peer = PeerProcess(index, f"peer-{index}", subprocess.Popen([sys.executable, "-c", code]),
                       tmp_path, client_only=False)  # fmt: skip
    peer.stderr.write_text(stderr)
    peer.process.wait(timeout=60)
    return peer


def test_a_failed_peer_always_has_a_reason(tmp_path: Path) -> None:
    import argparse

    from peer.app.report import collect_results
    from workloads.baseline import CentralizedResult

    peers = [
        _failed_peer(tmp_path, 0, "raise SystemExit(3)", "log line\ngossipnet peer: error: boom\n"),
        _failed_peer(tmp_path, 1, "raise SystemExit(3)", ""),
        _failed_peer(tmp_path, 2, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", ""),
        _failed_peer(tmp_path, 3, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", ""),
    ]
    swarm = argparse.Namespace(peers=peers, args=argparse.Namespace(steps=10), directory=tmp_path)
    results = collect_results(swarm, CentralizedResult())  # type: ignore[arg-type]
    assert [peer.get("error") for peer in results["peers"]] == [
        "gossipnet peer: error: boom (exit code 3)",
        "exit code 3",
        "killed by SIGKILL",
        None,  # the launcher's own SIGTERM is a clean stop
    ]
    assert results["peers"][0]["state"] == "failed: gossipnet peer: error: boom (exit code 3)"
    assert results["peers"][3]["state"] == "stopped"


def test_launch_save_model_and_log_dir_write_the_swarm_average_and_every_record(
    tmp_path: Path, cache: str
) -> None:
    """One two-peer launch with ``--save-model`` and ``--log-dir``: the saved model is the
    average of the peers' models, and each peer's record and the swarm's are kept."""
    from safetensors.torch import load_file

    from peer.app.export import load_model

    target = tmp_path / "swarm.safetensors"
    run_dir = tmp_path / "run"
    logs = tmp_path / "logs"
    result = subprocess.run(
        gossipnet("launch", "--peers", "2", "--steps", "20", "--dataset",
                  "synthetic:num_samples=400", "--dir", str(run_dir), "--save-model", str(target),
                  "--log-dir", str(logs), "--progress", "none", "--json",
                  # the local optimizer's flags reach every peer and the baseline
                  "--optimizer", "adamw", "--lr", "0.01", "--betas", "0.9,0.95",
                  "--schedule", "cosine", "--warmup-steps", "5", "--clip-norm", "1.0"),
        capture_output=True, text=True, env=environment(cache), cwd=ROOT, timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(result.stdout.splitlines()[-1])
    # --save-model: the swarm's average
    assert results["model"] == str(target)
    assert f"saved the average of 2 peers' models to {target}" in result.stderr
    peers = [load_file(run_dir / f"peer-{i}.safetensors") for i in range(2)]
    averaged = load_file(target)
    assert set(averaged) == set(peers[0])
    for name, tensor in averaged.items():  # x_bar = (x_0 + x_1) / 2
        torch.testing.assert_close(tensor, (peers[0][name] + peers[1][name]) / 2)
    model = load_model(target)
    assert model(torch.zeros(3, 20)).shape == (3, 10)
    # --log-dir: each peer's record and the swarm's
    accuracy = {peer["id"]: peer["test_accuracy"] for peer in results["peers"]}
    for name in ("peer-0", "peer-1"):  # each peer's own --log-dir: a row per status line
        rows = read_rows(logs / name / "metrics.csv")
        assert [row["step"] for row in rows] == [str(s) for s in range(2, 21, 2)] + ["20"]
        assert float(rows[-1]["accuracy"]) == accuracy[name]
        assert list((logs / name).glob("events.out.tfevents.*"))
    swarm = read_rows(logs / "swarm" / "metrics.csv")
    assert list(swarm[0]) == ["time_s", "peer", "step", "loss", "accuracy", "bits_per_byte",
                              "mse", "bytes_in", "bytes_out", "exchanges_ok",
                              "exchanges_failed"]  # fmt: skip
    *polled, last_0, last_1, centralized = swarm
    assert {row["peer"] for row in polled} == {"peer-0", "peer-1"}
    assert all(row["accuracy"] == "" for row in polled)  # not evaluated while training
    assert all((row["loss"] == "") == (row["step"] == "0") for row in polled)  # no loss yet
    for name in ("peer-0", "peer-1"):  # a row per new step a poll found, in order, none past 20
        steps = [int(row["step"]) for row in polled if row["peer"] == name]
        assert steps == sorted(set(steps)) and steps[-1] <= 20, steps
    # (a peer that evaluates and exits between two polls has no polled step-20 row on a
    # loaded machine; its final row below is at step 20 either way)
    for row in (last_0, last_1):
        assert row["step"] == "20" and float(row["accuracy"]) == accuracy[row["peer"]]
        assert int(row["exchanges_ok"]) > 0
    assert centralized["peer"] == "centralized"
    assert float(centralized["accuracy"]) == results["centralized"]["test_accuracy"]
    events = EventAccumulator(str(logs / "swarm"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss/peer-0", "loss/peer-1", "accuracy/peer-0", "accuracy/centralized"} <= tags
    assert events.Scalars("accuracy/peer-1")[-1].value == pytest.approx(accuracy["peer-1"])
    # AdamW with warm-up and cosine beats launch's default SGD (lr 0.05, momentum 0.9) here:
    # the same steps on all the data in one model do worse than each AdamW peer on its half
    from workloads import build_model, load_dataset, train_centralized

    data = load_dataset("synthetic:num_samples=400")
    sgd = train_centralized(
        build_model("mlp", data.input_shape, data.num_classes, seed=0),
        data, steps=20, batch_size=64, optimizer="sgd", lr=0.05,
    )  # fmt: skip
    assert min(accuracy.values()) > sgd.accuracy + 0.05, (accuracy, sgd.accuracy)


def test_the_swarm_record_leaves_a_missing_accuracy_blank(tmp_path: Path) -> None:
    """A regression model evaluates to ``"test_accuracy": None``: a blank cell, and no
    centralized row without a centralized accuracy."""
    from types import SimpleNamespace

    from peer.app.launch import record_results
    from peer.node.logbook import Logbook

    results = {
        "peers": [
            {"id": "peer-0", "step": 30, "test_accuracy": None, "test_loss": 0.25,
             "exchanges_ok": 7, "exchanges_failed": 0},
            {"id": "peer-1", "step": 12, "state": "failed: killed by SIGKILL"},  # no evaluation
        ],
        "centralized": {"test_accuracy": None, "test_loss": None},
        "steps": 30,
    }  # fmt: skip
    swarm = SimpleNamespace(peers=[])  # nothing polled: the results alone
    with Logbook.open(tmp_path, run_name="swarm", peer_column=True) as book:
        record_results(book, swarm, results)  # type: ignore[arg-type]
    (row,) = read_rows(tmp_path / "metrics.csv")
    assert (row["peer"], row["step"], row["accuracy"], row["loss"]) == ("peer-0", "30", "", "")
    assert (row["exchanges_ok"], row["exchanges_failed"]) == ("7", "0")


def test_launch_help_explains_log_dir(capsys: pytest.CaptureFixture[str]) -> None:
    from gossipnet.cli import main

    with pytest.raises(SystemExit) as info:
        main(["launch", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--log-dir DIR" in text and "DIR/peer-<i>/" in text and "DIR/swarm/" in text
    assert "tensorboard --logdir DIR" in text
