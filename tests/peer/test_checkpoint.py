"""Atomic safetensors checkpoints, retention, and fallback past corrupt files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peer import checkpoint as ckpt


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "flat": torch.randn(100, generator=g),
        "optimizer.state.0.momentum_buffer": torch.randn(100, generator=g),
        "buffer.bn.running_mean": torch.randn(3, generator=g).to(torch.bfloat16),
    }


def test_round_trip_with_metadata(tmp_path: Path) -> None:
    saved = tensors(0)
    path = ckpt.save_checkpoint(
        tmp_path, saved, step=40, round=4, peer_id="a", metadata={"codec": "none"}
    )
    assert path.name == "checkpoint-000000000040.safetensors"
    loaded = ckpt.load_checkpoint(path)
    assert (loaded.step, loaded.round, loaded.peer_id) == (40, 4, "a")
    assert loaded.metadata == {"codec": "none"}
    assert loaded.tensors.keys() == saved.keys()
    for name, t in saved.items():
        assert torch.equal(loaded.tensors[name], t)
    assert not list(tmp_path.glob(".checkpoint-*")), "temp file left behind"


def test_latest_and_retention(tmp_path: Path) -> None:
    assert ckpt.latest_checkpoint(tmp_path) is None
    assert ckpt.load_latest(tmp_path) is None
    for step in (5, 10, 100, 20):
        ckpt.save_checkpoint(tmp_path, tensors(step), step=step, round=0, peer_id="a", keep=3)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [
        "checkpoint-000000000010.safetensors",
        "checkpoint-000000000020.safetensors",
        "checkpoint-000000000100.safetensors",
    ]
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name.endswith("100.safetensors")


def test_truncated_newest_falls_back_to_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt.save_checkpoint(tmp_path, tensors(1), step=1, round=0, peer_id="a")
    newest = ckpt.save_checkpoint(tmp_path, tensors(2), step=2, round=0, peer_id="a")
    newest.write_bytes(newest.read_bytes()[:-50])
    with pytest.raises(ckpt.CheckpointError, match="000000000002"):
        ckpt.load_checkpoint(newest)
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.tensors["flat"], tensors(1)["flat"])
    assert "skipping checkpoint" in caplog.text


def test_flipped_bit_is_caught_by_the_checksum(tmp_path: Path) -> None:
    path = ckpt.save_checkpoint(tmp_path, tensors(1), step=1, round=0, peer_id="a")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="checksum mismatch"):
        ckpt.load_checkpoint(path)


def test_all_corrupt_raises_naming_every_file(tmp_path: Path) -> None:
    for step in (1, 2):
        ckpt.checkpoint_path(tmp_path, step).write_bytes(b"garbage")
    with pytest.raises(ckpt.CheckpointError, match="no valid checkpoint") as info:
        ckpt.load_latest(tmp_path)
    assert "000000000001" in str(info.value) and "000000000002" in str(info.value)


def test_pickle_file_is_not_loaded(tmp_path: Path) -> None:
    path = ckpt.checkpoint_path(tmp_path, 3)
    torch.save({"flat": torch.ones(3)}, path)  # a pickle archive under our name
    with pytest.raises(ckpt.CheckpointError, match="not a valid safetensors"):
        ckpt.load_checkpoint(path)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="step"):
        ckpt.save_checkpoint(tmp_path, tensors(0), step=-1, round=0, peer_id="a")
    with pytest.raises(ValueError, match="keep"):
        ckpt.save_checkpoint(tmp_path, tensors(0), step=1, round=0, peer_id="a", keep=0)
    with pytest.raises(ValueError, match="reserved"):
        ckpt.save_checkpoint(
            tmp_path, tensors(0), step=1, round=0, peer_id="a", metadata={"step": "9"}
        )
