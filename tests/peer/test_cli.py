"""``gossipnet peer`` as real OS processes: a two-peer swarm, signals, resume, bad input."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from peer.app.swarm import free_ports

ROOT = Path(__file__).resolve().parents[2]
SECRET = "cli-test-swarm-secret-0123456789"
WORKLOAD = ["--dataset", "synthetic:num_samples=400,seed=0", "--peers", "2"]


def gossipnet(*args: str) -> list[str]:
    return [sys.executable, "-m", "gossipnet", "peer", *args]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GOSSIPNET_SECRET"}
    return {**env, "GOSSIPNET_SECRET": SECRET, **extra}


def wait_for_file(path: Path, process: subprocess.Popen[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if process.poll() is not None:
            raise AssertionError(f"peer exited early: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def status_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def metrics_rows(log_dir: Path) -> list[dict[str, str]]:
    """The rows of ``--log-dir``'s metrics.csv."""
    with (log_dir / "metrics.csv").open(newline="") as stream:
        return list(csv.DictReader(stream))


@pytest.mark.slow
def test_two_peer_processes_train_together(tmp_path: Path) -> None:
    address_file = tmp_path / "a.address"
    # both at once, as launch starts a swarm: a's port is chosen here and b retries its join
    # until a listens (not: a alone, training, while b starts up)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    first = subprocess.Popen(
        gossipnet("--id", "a", "--address-file", str(address_file), "--peer-index", "0",
                  "--port", address.rpartition(":")[2], "--status-every", "1000000",
                  *WORKLOAD),  # quiet: nobody reads its pipe yet
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(), cwd=ROOT,
    )  # fmt: skip
    try:
        second = subprocess.run(
            gossipnet("--id", "b", "--join", address, "--peer-index", "1", "--steps", "12",
                      "--status-every", "4", "--log-dir", str(tmp_path / "b-log"),
                      "--eval-out", str(tmp_path / "b.eval.json"), *WORKLOAD),
            capture_output=True, text=True, env=environment(), cwd=ROOT, timeout=100,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr
        assert wait_for_file(address_file, first) == address
        first.send_signal(signal.SIGTERM)  # a trains until told to stop
        out, err = first.communicate(timeout=100)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert status_lines(out)[-1]["bytes_in"] > 0  # b exchanged with a (then left)
    assert "listening on 127.0.0.1:" in second.stdout
    final = status_lines(second.stdout)[-1]
    assert final["stopped"] is True and final["step"] == 12 and final["neighbours"] == ["a"]
    assert final["bytes_out"] > 0 and final["bytes_in"] > 0
    assert "OPEN" not in second.stderr  # the secret came from GOSSIPNET_SECRET
    # --log-dir: a row per status line (steps 4, 8, 12) and one at the end with the accuracy
    rows = metrics_rows(tmp_path / "b-log")
    assert [row["step"] for row in rows] == ["4", "8", "12", "12"]
    assert [row["accuracy"] for row in rows[:3]] == ["", "", ""]  # not evaluated yet
    assert float(rows[-1]["accuracy"]) == final["test_accuracy"]
    assert float(rows[-1]["loss"]) == final["loss"]
    assert int(rows[-1]["bytes_in"]) == final["bytes_in"] > 0
    assert int(rows[-1]["exchanges_ok"]) > 0
    events = EventAccumulator(str(tmp_path / "b-log"))
    events.Reload()
    assert [event.step for event in events.Scalars("loss")] == [4, 8, 12, 12]
    assert [event.value for event in events.Scalars("accuracy")] == [
        pytest.approx(final["test_accuracy"])
    ]


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_continues(tmp_path: Path) -> None:
    address_file = tmp_path / "a.address"
    checkpoints = tmp_path / "checkpoints"
    common = ["--id", "a", "--checkpoint-dir", str(checkpoints), "--peer-index", "0",
              "--status-every", "5", "--log-dir", str(tmp_path / "log"), *WORKLOAD]  # fmt: skip
    running = subprocess.Popen(
        gossipnet(*common, "--address-file", str(address_file)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(), cwd=ROOT,
    )  # fmt: skip
    try:
        wait_for_file(address_file, running)
        deadline = time.monotonic() + 60
        while not (line := running.stdout.readline()).startswith("{"):  # type: ignore[union-attr]
            assert time.monotonic() < deadline and line, "no status line"
        running.send_signal(signal.SIGTERM)
        out, err = running.communicate(timeout=60)
    finally:
        running.kill()
    assert running.returncode == 0, err
    stopped = status_lines(out)[-1]
    assert stopped["stopped"] is True and stopped["step"] >= 5
    saved = sorted(checkpoints.glob("checkpoint-*.safetensors"))
    assert saved and saved[-1].name == f"checkpoint-{stopped['step']:012d}.safetensors"

    resumed = subprocess.run(
        gossipnet(*common, "--resume", "--steps", "5"),
        capture_output=True, text=True, env=environment(), cwd=ROOT, timeout=100,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"at step {stopped['step']}" in resumed.stdout
    assert status_lines(resumed.stdout)[-1]["step"] == stopped["step"] + 5
    # --log-dir: the resumed run appends to the same metrics.csv under its one header
    assert (tmp_path / "log" / "metrics.csv").read_text().count("time_s") == 1
    steps = [int(row["step"]) for row in metrics_rows(tmp_path / "log")]
    assert steps[-2:] == [stopped["step"] + 5] * 2  # its chunk, then the end
    assert stopped["step"] in steps[:-2] and steps == sorted(steps)


def refused(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """``gossipnet peer ARGS`` through the command's entry point in this process (a mistake in
    the arguments needs no Python start-up of its own): exit code 2, and its stderr lines."""
    from gossipnet.cli import main

    monkeypatch.setenv("GOSSIPNET_SECRET", SECRET)
    with pytest.raises(SystemExit) as info:
        main(["peer", *args])
    assert info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_bad_arguments_exit_2_with_one_clear_line_in_a_real_process() -> None:
    result = subprocess.run(
        gossipnet("--id", "a", "--mode", "gossip", *WORKLOAD), capture_output=True, text=True,
        env=environment(), cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # one line, no usage block before it
    assert lines[0].startswith(
        "gossipnet peer: error: --mode: invalid choice 'gossip'; allowed: async, sync"
    ), lines


def test_a_compressor_that_drops_coordinates_without_error_feedback_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = refused(["--id", "a", "--compressor", "topk", *WORKLOAD], capsys, monkeypatch)
    assert len(lines) == 1, lines  # one line, no usage block before it
    assert lines[0].startswith("gossipnet peer: error: --compressor: topk drops most coordinates")


@pytest.mark.parametrize("old", ["--compress", "--codec"])
def test_the_old_names_of_renamed_flags_are_refused_in_one_line(
    old: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unreleased 0.1.0's renamed flags are gone, and not taken as abbreviations of
    their new names (``--compress`` of ``--compressor``). Its ``--peers FILE`` is now
    ``--peers-file``; ``--peers`` is the peer count, as on ``launch``."""
    assert refused(["--id", "a", old, "fp16", *WORKLOAD], capsys, monkeypatch) == [
        f"gossipnet peer: error: unrecognized arguments: {old} fp16"
    ]


def test_the_serving_share_reaches_the_config_and_a_bad_one_is_named_by_its_flag() -> None:
    from peer.app.cli import parse_peer_args
    from peer.app.usage import UsageError

    _, default = parse_peer_args(["--id", "a", *WORKLOAD])
    assert default.max_serving_share == 0.5
    _, config = parse_peer_args(["--id", "a", "--max-serving-share", "0.25", *WORKLOAD])
    assert config.max_serving_share == 0.25
    with pytest.raises(UsageError) as caught:
        parse_peer_args(["--id", "a", "--max-serving-share", "0", *WORKLOAD], raise_errors=True)
    assert str(caught.value) == "--max-serving-share: must be in (0, 1]; got 0.0"


def test_a_bad_setting_is_named_by_its_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["--id", "a", "--algorithm", "choco", "--consensus-step", "2", *WORKLOAD]
    assert refused(args, capsys, monkeypatch) == [
        "gossipnet peer: error: --consensus-step: must be in (0, 1]; got 2.0"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "a b"], "--id: must be"),
        (["--id", "a", "--algorithm", "choco"], "--topology: is required for choco"),
        (
            ["--id", "a", "--algorithm", "sgd"],
            "--algorithm: unknown algorithm 'sgd'; allowed: ad-psgd, dpsgd, local-sgd, push-sum,",
        ),
        (["--id", "a", "--algorithm", "dpsgd", "--mode", "async"], "--mode: 'async' contradicts"),
        (
            ["--id", "a", "--algorithm", "local-sgd", "--local-steps", "1"],
            "--local-steps: must be an integer >= 2 for local-sgd",
        ),
        (
            ["--id", "a", "--algorithm", "push-sum", "--aggregator", "krum"],
            "--aggregator: is not used by push-sum",
        ),
        (
            ["--id", "a", "--byzantine", "nosuch", "--mode", "sync"],
            "--byzantine: unknown attack 'nosuch'; allowed: sign-flip, gaussian,",
        ),
        (["--id", "a", "--byzantine", "sign-flip"], "--byzantine: needs a synchronous algorithm"),
        (
            ["--id", "a", "--aggregator", "trimmed-mean:b=1"],
            "--aggregator: trimmed-mean:b=1 cannot run: trimmed-mean needs n > 2b, got n=2",
        ),
        (["--id", "a", "--algorithm", "ad-psgd", "--order", "adapt-then-combine"], "--order:"),
        (
            ["--id", "a", "--device", "tpu"],
            "--device: got 'tpu'; allowed: auto, cpu, cuda, cuda:INDEX",
        ),
        (["--id", "a", "--max-concurrent-exchanges", "0"], "--max-concurrent-exchanges: must be"),
        (["--id", "a", "--topology", "ring"], "--topology: needs --peers-file FILE"),
        (
            ["--id", "a", "--log-level", "loud"],
            "--log-level: invalid choice 'LOUD'; allowed: DEBUG, INFO, WARNING, ERROR",
        ),
        (
            ["--id", "a", "--aggregator", "nosuch"],
            "--aggregator: unknown aggregator 'nosuch'; allowed: mean, median,",
        ),
        (
            ["--id", "a", "--peer-index", "2", "--peers", "2"],
            "--peer-index: must be in [0, --peers=2)",
        ),
        (["--id", "a", "--steps", "-1"], "--steps: must be >= 0"),
        (["--id", "a", "--client-only"], "--join: must name at least one peer"),
        (
            ["--id", "a", "--round-deadline-s", "0"],
            "--round-deadline-s: must be a finite number > 0",
        ),
        (["--id", "a", "--join-timeout-s", "0"], "--join-timeout-s: must be a finite number > 0"),
        (
            ["--id", "a", "--secret-file", "/nonexistent/secret"],
            "--secret-file: cannot read /nonexistent/secret (No such file or directory)",
        ),
        (
            ["--id", "a", "--dataset", "nosuch"],
            "--dataset: unknown dataset 'nosuch'; allowed: cifar10, mnist, mnist1d, npz,",
        ),
        (["--id", "a", "--partition", "nosuch"], "--partition: unknown partition 'nosuch'"),
        (["--id", "a", "--model", "mlp:width=3"], "--model: mlp: unknown parameter(s) width"),
        (
            ["--id", "a", "--log-dir", "/dev/null/run"],
            "--log-dir: /dev/null exists and is not a directory",
        ),
    ],
)
def test_more_bad_arguments_in_process(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from peer.app.cli import main

    monkeypatch.delenv("GOSSIPNET_SECRET", raising=False)
    with pytest.raises(SystemExit) as info:
        main([*WORKLOAD, *args], "gossipnet peer")
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("gossipnet peer: error: ") and message in err[-1], err
    assert len(err) == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from peer.app.cli import main

    with pytest.raises(SystemExit) as info:
        main([*WORKLOAD, "--id", "a", "--device", "cuda"], "gossipnet peer")
    assert info.value.code == 2
    assert "--device: device 'cuda': CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("lines", "extra", "message"),
    [
        (["127.0.0.1:7001", "127.0.0.1:7002"], ["--rank", "2"], "--rank: must be in [0, 2)"),
        (["127.0.0.1:7001", "nonsense"], ["--rank", "0"], "line 3 must be HOST:PORT"),
        (
            ["127.0.0.1:7001", "127.0.0.1:7001"],
            ["--rank", "0"],
            "line 3: 127.0.0.1:7001 is listed twice",
        ),
        (["127.0.0.1:7001"], ["--rank", "0"], "must list at least 2 HOST:PORT lines, got 1"),
        (["127.0.0.1:7001", "127.0.0.1:7002"], [], "--peers-file: FILE needs --rank"),
        (
            ["127.0.0.1:7001", "127.0.0.1:7002"],
            ["--rank", "0", "--topology", "nosuch"],
            "--topology",
        ),
        (
            ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"],
            ["--rank", "0", "--topology", "random-regular:degree=5"],
            "degree",
        ),
    ],
)
def test_bad_peer_files_and_ranks_exit_2(
    lines: list[str], extra: list[str], message: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from peer.app.cli import main

    peers = tmp_path / "peers.txt"
    peers.write_text("# the swarm\n" + "\n".join(lines) + "\n")
    args = ["--id", "a", "--peers-file", str(peers), *extra]
    if "--topology" not in extra:
        args += ["--topology", "ring"]
    with pytest.raises(SystemExit) as info:
        main([*WORKLOAD, *args], "gossipnet peer")
    assert info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert message in last, last


def test_missing_peer_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from peer.app.cli import main

    missing = tmp_path / "nope.txt"
    with pytest.raises(SystemExit) as info:
        main([*WORKLOAD, "--id", "a", "--topology", "ring", "--peers-file", str(missing), "--rank",
              "0"], "gossipnet peer")  # fmt: skip
    assert info.value.code == 2
    assert f"--peers-file: cannot read {missing}" in capsys.readouterr().err


def test_live_progress_line_and_json_logs_on_stderr() -> None:
    result = subprocess.run(
        gossipnet("--id", "a", "--steps", "30", "--progress", "live", "--log-json",
                  "--log-level", "info", *WORKLOAD),
        capture_output=True, text=True, env=environment(), cwd=ROOT, timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    logs = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert {"time", "level", "logger", "message"} <= set(logs[0])
    assert any(entry["message"].startswith("peer a started at 127.0.0.1:") for entry in logs)
    live = [line for line in result.stderr.splitlines() if line.startswith("peer a  step")]
    assert live[-1].startswith("peer a  step 30  loss ") and "neighbours 0" in live[-1]
    assert live[-1].endswith("B/s")
    assert len(status_lines(result.stdout)) == 1
    assert status_lines(result.stdout)[-1]["stopped"] is True  # no periodic lines when live


def test_ctrl_c_stops_a_peer_cleanly_like_sigterm(tmp_path: Path) -> None:
    """Ctrl-C stops a peer as SIGTERM does. The peer runs without a swarm secret, so the same
    run checks that the open-swarm warning is printed once over a whole run (this was
    tests/peer/test_errors.py's test_the_open_swarm_warning_is_printed_once, a process of its
    own)."""
    address_file = tmp_path / "a.address"
    checkpoints = tmp_path / "checkpoints"
    env = {k: v for k, v in os.environ.items() if k != "GOSSIPNET_SECRET"}
    running = subprocess.Popen(
        gossipnet("--id", "a", "--address-file", str(address_file), "--checkpoint-dir",
                  str(checkpoints), "--status-every", "5", *WORKLOAD),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        wait_for_file(address_file, running)
        running.send_signal(signal.SIGINT)
        out, err = running.communicate(timeout=60)
    finally:
        running.kill()
    assert running.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.count("NO SWARM SECRET") == 1, err
    final = status_lines(out)[-1]
    assert final["stopped"] is True
    assert list(checkpoints.glob("checkpoint-*.safetensors"))  # the final checkpoint


def test_every_peer_config_field_has_a_flag() -> None:
    """Each ``PeerConfig`` field is set by a flag: through ``CONFIG_FIELDS`` (one flag per
    field), or by the network flags and ``--mode``/``--secret-file``, which build it."""
    import dataclasses

    from gossip.settings import SETTING_NAMES
    from peer.app.peer_flags import CONFIG_FIELDS, peer_parser
    from peer.node.config import PeerConfig

    built = {"host", "port", "advertise", "join", "peer_list", "secret"}
    fields = {field.name for field in dataclasses.fields(PeerConfig)}
    assert fields - built == set(CONFIG_FIELDS)
    assert set(SETTING_NAMES) <= set(CONFIG_FIELDS)
    flags = set(re.findall(r"--[a-z0-9-]+", peer_parser("p").format_help()))  # what --help lists
    negated = {"fetch_state", "average_buffers"}  # --no-fetch-state, --no-average-buffers
    for name in CONFIG_FIELDS:
        flag = {"peer_id": "--id"}.get(
            name, "--" + ("no-" if name in negated else "") + name.replace("_", "-")
        )
        assert flag in flags, name


def test_log_dir_and_no_average_buffers_reach_the_config(tmp_path: Path) -> None:
    from peer.app.cli import parse_peer_args

    _, default = parse_peer_args(["--id", "a", *WORKLOAD])
    assert default.average_buffers is True and default.log_dir is None
    _, config = parse_peer_args(
        ["--id", "a", "--no-average-buffers", "--log-dir", str(tmp_path / "run"), *WORKLOAD]
    )
    assert config.average_buffers is False and config.log_dir == str(tmp_path / "run")
    assert not (tmp_path / "run").exists()  # checked, not created, by the parser


def test_log_dir_problems_are_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from peer.app.cli import main

    (tmp_path / "metrics.csv").write_text("epoch,val_loss\n")
    with pytest.raises(SystemExit) as info:
        main(["--id", "a", "--log-dir", str(tmp_path), *WORKLOAD])
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"gossipnet peer: error: --log-dir: {tmp_path / 'metrics.csv'} has the columns "
        "epoch,val_loss, not this record's time_s,step,loss,accuracy,bits_per_byte,mse,bytes_in,"
        "bytes_out,exchanges_ok,exchanges_failed; allowed: a new --log-dir, or that file moved "
        "away"
    ]
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(SystemExit) as info:
        main(["--id", "a", "--log-dir", str(tmp_path / "new"), *WORKLOAD])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "gossipnet peer: error: --log-dir: TensorBoard logging needs the tensorboard package; "
        "pip install 'gossipnet[logging]'"
    ]
    assert not (tmp_path / "new").exists()


def test_peer_help_lists_log_dir_and_no_average_buffers(capsys: pytest.CaptureFixture[str]) -> None:
    from peer.app.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--log-dir DIR" in text and "metrics.csv" in text
    assert "--no-average-buffers" in text and "BatchNorm" in text
