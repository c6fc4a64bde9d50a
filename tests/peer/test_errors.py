"""Errors that help: each user mistake is one line on stderr, exit code 2, before anything
expensive starts, the exact line asserted. What is about the process (a port taken, an
unexpected error and its traceback) runs real ``gossipnet`` processes (that the open-swarm
warning is printed once: tests/peer/test_cli.py's Ctrl-C run, which has no secret); a
mistake in the arguments goes through the command's entry point (``gossipnet.cli.main``) in
this process: the same parsing and checks, without a Python and torch start-up each
(tests/peer/test_cli.py and tests/test_front_door.py refuse arguments in real processes
too)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "errors-test-swarm-secret-0123456789"
WORKLOAD = ["--dataset", "synthetic:num_samples=200,seed=0", "--steps", "3"]


def gossipnet(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GOSSIPNET_SECRET"}
    env["GOSSIPNET_SECRET"] = SECRET
    return subprocess.run(
        [sys.executable, "-m", "gossipnet", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused command (exit code 2, nothing else printed)."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr
    return lines[0]


Refused = Callable[..., str]


@pytest.fixture
def refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Refused]:
    """``refused(*args)``: run ``gossipnet ARGS`` in this process, assert it exits 2 with one
    stderr line (no traceback, no usage block) and return that line. The logging set up by
    the command is undone afterwards."""
    from gossipnet.cli import main

    monkeypatch.setenv("GOSSIPNET_SECRET", SECRET)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*args: str) -> str:
        try:
            code = main(list(args))
        except SystemExit as exited:
            code = exited.code
        err = capsys.readouterr().err
        assert code == 2, (code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, lines
        assert "Traceback" not in err and "usage:" not in err
        return lines[0]

    yield run
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_port_already_in_use_is_one_line_naming_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = gossipnet("peer", "--id", "a", "--port", str(port), *WORKLOAD)
    assert one_error_line(result) == (
        f"gossipnet peer: error: --port: 127.0.0.1:{port} is already in use; allowed: a free "
        "port, or 0 for one the system picks"
    )


def test_a_missing_secret_file_names_the_flag(tmp_path: Path, refused: Refused) -> None:
    missing = tmp_path / "swarm.secret"
    line = refused("peer", "--id", "a", "--secret-file", str(missing), *WORKLOAD)
    assert line == (
        f"gossipnet peer: error: --secret-file: cannot read {missing} (No such file or "
        "directory); allowed: a readable file holding the swarm secret (at least 16 bytes)"
    )


def test_a_short_secret_file_names_the_flag(tmp_path: Path, refused: Refused) -> None:
    short = tmp_path / "swarm.secret"
    short.write_text("too-short\n")
    line = refused("peer", "--id", "a", "--secret-file", str(short), *WORKLOAD)
    assert line == (
        f"gossipnet peer: error: --secret-file: {short}: the swarm secret must be at least 16 "
        "bytes, got 9"
    )


def test_a_bad_peer_args_value_is_found_before_any_peer_or_the_baseline(
    tmp_path: Path, refused: Refused
) -> None:
    run_dir = tmp_path / "run"
    line = refused(
        "launch", "--peers", "2", "--dataset", "synthetic:num_samples=200", "--dir", str(run_dir),
        "--peer-args", "--momentum 0.9 --fanout 0",
    )  # fmt: skip
    assert line == (
        "gossipnet launch: error: --peer-args: --fanout: must be an integer >= 1, got 0"
    )
    assert not run_dir.exists()  # no secret, no peer file, no process
    line = refused("launch", "--peers", "2", "--peer-args", "--lr x", "--dir", str(run_dir))
    assert line == ("gossipnet launch: error: --peer-args: --lr: invalid float value: 'x'")
    assert not run_dir.exists()


def test_a_fanout_on_a_sync_peer_is_refused_naming_the_flag(refused: Refused) -> None:
    line = refused("peer", "--id", "a", "--mode", "sync", "--fanout", "2", *WORKLOAD)
    assert line == (
        "gossipnet peer: error: --fanout: async mode only (dpsgd rounds exchange with every "
        "neighbour, or the topology's); got 2, leave it unset"
    )


def test_a_serving_share_on_a_sync_peer_is_refused_naming_the_flag(refused: Refused) -> None:
    line = refused("peer", "--id", "a", "--mode", "sync", "--max-serving-share", "0.8", *WORKLOAD)
    assert line == (
        "gossipnet peer: error: --max-serving-share: async mode only (dpsgd rounds serve each "
        "neighbour once a round); got 0.8, leave it unset"
    )


def test_an_invalid_choice_lists_the_allowed_values_in_the_one_format(refused: Refused) -> None:
    assert (refused("peer", "--id", "a", "--mode", "gossip")) == (
        "gossipnet peer: error: --mode: invalid choice 'gossip'; allowed: async, sync"
    )
    assert (refused("launch", "--compressor", "zip")) == (
        "gossipnet launch: error: --compressor: unknown compressor 'zip'; allowed: bf16, "
        "chunked-topk, fp16, none, qsgd, randk, topk"
    )
    assert (refused("no-such-command")).startswith(
        "gossipnet: error: COMMAND: invalid choice 'no-such-command'; allowed: demo, peer, "
    )


USER_MODEL = textwrap.dedent(
    """
    from torch import nn


    def not_a_model(input_shape, num_classes):
        return {"layers": 2}


    class Broken(nn.Module):
        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.linear = nn.Linear(input_shape[0], num_classes)

        def forward(self, x):
            if self.training:  # the check before the start runs in eval mode and passes
                raise RuntimeError("forward is not written yet")
            return self.linear(x)
    """
)


def test_user_code_mistakes_name_the_flag(tmp_path: Path, refused: Refused) -> None:
    model = tmp_path / "mymodel.py"
    model.write_text(USER_MODEL)
    assert (refused("peer", "--id", "a", "--model", f"{model}:Missing")) == (
        f"gossipnet peer: error: --model: {model} has no attribute 'Missing'; allowed: Broken, "
        "not_a_model"
    )
    line = refused("peer", "--id", "a", "--model", f"{model}:not_a_model", *WORKLOAD)
    assert line == (
        f"gossipnet peer: error: --model: {model}:not_a_model returned a value of type dict; "
        "allowed: a torch.nn.Module"
    )
    missing = tmp_path / "data.npz"
    assert (refused("peer", "--id", "a", "--dataset", str(missing))) == (
        f"gossipnet peer: error: --dataset: {missing}: no such file; allowed: an existing .npz file"
    )


@pytest.mark.slow
def test_an_unexpected_error_is_one_line_unless_debug(tmp_path: Path) -> None:
    model = tmp_path / "mymodel.py"
    model.write_text(USER_MODEL)
    args = ["peer", "--id", "a", "--model", f"{model}:Broken", *WORKLOAD]
    result = gossipnet(*args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (
        "gossipnet peer: error: unexpected RuntimeError: forward is not written yet (run with "
        "--log-level DEBUG for the traceback)"
    )
    assert "Traceback" not in result.stderr
    debug = gossipnet(*args, "--log-level", "DEBUG")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


def test_the_peer_file_is_named_by_its_flag(tmp_path: Path, refused: Refused) -> None:
    peers = tmp_path / "peers.txt"
    peers.write_text("127.0.0.1:7001\n")
    line = refused(
        "peer", "--id", "a", "--topology", "ring", "--peers-file", str(peers), "--rank", "0"
    )
    assert line == (
        f"gossipnet peer: error: --peers-file: {peers} must list at least 2 HOST:PORT lines, got 1"
    )


def test_the_old_name_of_the_peer_file_is_refused(tmp_path: Path, refused: Refused) -> None:
    peers = tmp_path / "peers.txt"
    peers.write_text("127.0.0.1:7001\n127.0.0.1:7002\n")
    line = refused("peer", "--id", "a", "--topology", "ring", "--peers", str(peers))
    # --peers is the peer count now (as on launch); the file is --peers-file
    assert line == f"gossipnet peer: error: --peers: invalid int value: '{peers}'"


@pytest.mark.parametrize(
    ("message", "line"),
    [
        (
            "argument --mode: invalid choice: 'x' (choose from 'async', 'sync')",
            "--mode: invalid choice 'x'; allowed: async, sync",
        ),
        (
            "--aggregator: unknown aggregator 'x'; choices: mean, median",
            "--aggregator: unknown aggregator 'x'; allowed: mean, median",
        ),
        (
            "--topology: unknown topology 'x'; choose one of: ring, torus",
            "--topology: unknown topology 'x'; allowed: ring, torus",
        ),
        (
            "--compressor: unknown compressor 'x'; choose one of ['bf16', 'fp16']",
            "--compressor: unknown compressor 'x'; allowed: bf16, fp16",
        ),
        (
            "--compressor: qsgd parameter bits must be one of (2, 4, 8), got 3",
            "--compressor: qsgd parameter bits: got 3; allowed: 2, 4, 8",
        ),
        ("--steps: must be >= 0, got -1\nsecond line", "--steps: must be >= 0, got -1"),
    ],
)
def test_every_way_of_listing_allowed_values_becomes_one(message: str, line: str) -> None:
    from peer.app.usage import one_line

    assert one_line(message) == line


def test_save_model_whose_description_is_eval_out_is_refused_before_training(
    tmp_path: Path, refused: Refused
) -> None:
    model, evaluation = tmp_path / "m.safetensors", tmp_path / "m.json"
    line = refused(
        "peer", "--id", "a", "--save-model", str(model), "--eval-out", str(evaluation), *WORKLOAD
    )
    line = line
    assert line.startswith("gossipnet peer: error: --eval-out: ") and "--save-model" in line
    assert not evaluation.exists() and not model.exists()
