"""``launch --resume``: a run kept with ``--dir`` continues from each peer's newest checkpoint,
each peer on to ``--steps`` in all; a resume that cannot be is one line and exit 2 before
anything starts. (A peer's own ``--resume`` is tested end to end in ``test_cli.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peer.app.launch import _parser, main
from peer.app.swarm import peer_flags
from peer.node.checkpoint import save_checkpoint

DATASET = "synthetic:num_samples=200,seed=0"


def checkpoint(run: Path, index: int, step: int) -> None:
    """A valid checkpoint of ``peer-<index>`` at ``step``, where launch keeps it."""
    save_checkpoint(run / f"peer-{index}.checkpoints", {"w": torch.zeros(3)}, step=step,
                    round=step, peer_id=f"peer-{index}")  # fmt: skip


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit:
        main(["--dataset", DATASET, "--peers", "2", *argv])
    assert exit.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_resume_that_cannot_be_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(tmp_path)
    assert "--resume: needs --dir DIR" in refused(["--resume"], capsys)
    assert "--resume: no checkpoint in" in refused(["--resume", "--dir", run], capsys)
    checkpoint(tmp_path, 2, 10)
    assert "holds checkpoints of peer-2; resume with the run's own --peers (at least 3)" in (
        refused(["--resume", "--dir", run], capsys)
    )
    (tmp_path / "peer-2.checkpoints" / "checkpoint-000000000010.safetensors").unlink()
    checkpoint(tmp_path, 0, 8)
    checkpoint(tmp_path, 1, 9)
    assert "already --steps 8; raise --steps" in refused(
        ["--resume", "--dir", run, "--steps", "8"], capsys
    )
    (tmp_path / "peer-1.checkpoints" / "checkpoint-000000000009.safetensors").write_bytes(b"x")
    assert "--resume: no valid checkpoint in" in refused(["--resume", "--dir", run], capsys)


def test_each_resumed_peer_trains_on_to_the_steps_in_all(tmp_path: Path) -> None:
    args = _parser("gossipnet launch", False).parse_args(
        ["--peers", "2", "--steps", "8", "--dir", str(tmp_path), "--dataset", DATASET]
    )
    args.byzantine_count, args.byzantine_attack = 0, None
    kept = peer_flags(args, 0, tmp_path, secret_file=None, peer_file=None)
    assert "--resume" not in kept  # a kept run checkpoints when its peers stop
    assert kept[kept.index("--checkpoint-dir") + 1] == str(tmp_path / "peer-0.checkpoints")
    args.resumed = {0: 3}  # what launch found: peer-0 at step 3, peer-1 without a checkpoint
    for index, left in ((0, "5"), (1, "8")):
        flags = peer_flags(args, index, tmp_path, secret_file=None, peer_file=None)
        assert "--resume" in flags
        assert flags[flags.index("--steps") + 1] == left
