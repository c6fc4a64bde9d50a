"""Atomic safetensors checkpoints, retention, fallback past corrupt files, what a peer records in
them (buffers, members), stale temporaries, and SIGKILL in the middle of writes (real processes)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from peer.node import checkpoint as ckpt
from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.node.training_state import module_state

from .conftest import SECRET, make_data, make_model, sgd, started_peer


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


# --------------------------------------------------------------------------- stale temporaries


def test_only_stale_temporaries_are_removed_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved = ckpt.save_checkpoint(tmp_path, tensors(0), step=1, round=0, peer_id="a")
    stale = [tmp_path / ".checkpoint-abc123_x.tmp", tmp_path / ".checkpoint-9.tmp"]
    kept = [
        tmp_path / "checkpoint-notes.tmp",
        tmp_path / ".checkpoint-x.tmp.bak",
        tmp_path / "other.tmp",
        tmp_path / ".checkpoint-.tmp",
    ]
    for path in stale + kept:
        path.write_bytes(b"partial")
    (tmp_path / ".checkpoint-dir.tmp").mkdir()  # not a file: left alone
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".checkpoint-deep.tmp").write_bytes(b"x")  # not in the folder itself
    caplog.set_level("INFO", logger="peer.node.checkpoint")
    assert ckpt.remove_stale_temporaries(tmp_path) == 2
    assert not any(path.exists() for path in stale)
    assert all(path.exists() for path in kept) and saved.exists()
    assert (tmp_path / ".checkpoint-dir.tmp").is_dir()
    assert (tmp_path / "sub" / ".checkpoint-deep.tmp").exists()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "removed 2 stale temporary checkpoint" in messages[0]
    assert str(tmp_path) in messages[0]
    assert ckpt.remove_stale_temporaries(tmp_path) == 0
    assert ckpt.remove_stale_temporaries(tmp_path / "missing") == 0
    assert len(caplog.records) == 1  # nothing removed: nothing logged


def test_write_atomically_leaves_the_old_file_when_it_fails(tmp_path: Path) -> None:
    target = tmp_path / "model.bin"
    ckpt.write_atomically(target, b"old", prefix=".model-")
    with pytest.raises(TypeError):
        ckpt.write_atomically(target, "not bytes", prefix=".model-")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


# --------------------------------------------------------------------------- what a peer saves


def normalized_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )


def peer_of(model: torch.nn.Module, seed: int, **config: Any) -> Peer:
    return Peer(
        model,
        sgd,
        torch.nn.functional.cross_entropy,
        make_data(seed),
        PeerConfig(peer_id=config.pop("peer_id", "a"), secret=SECRET, **config),
    )


@pytest.mark.parametrize("average_buffers", [True, False])
async def test_buffers_are_checkpointed_and_restored(tmp_path: Path, average_buffers: bool) -> None:
    """Averaged float buffers live in ``flat`` (and its layout); local ones, and the integer
    counter always, are ``buffer.*`` entries; either way resume restores every one."""
    first = peer_of(
        normalized_model(0), 0, checkpoint_dir=str(tmp_path), average_buffers=average_buffers
    )
    await first.start()
    await first.run(steps=3)
    await first.stop()
    statistics = first.model[1].running_mean.clone()
    variances = first.model[1].running_var.clone()
    assert statistics.abs().sum() > 0 and int(first.model[1].num_batches_tracked) == 3
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None
    statistics_names = {"1.running_mean", "1.running_var"}
    local = {name.removeprefix("buffer.") for name in loaded.tensors if name.startswith("buffer.")}
    in_flat = {name for name, _ in json.loads(loaded.metadata["layout"])}
    assert "1.num_batches_tracked" in local and "1.num_batches_tracked" not in in_flat
    if average_buffers:
        assert statistics_names <= in_flat and not statistics_names & local
        assert (
            loaded.tensors["flat"].numel()
            == first.flat.vector.numel()
            == (4 * 4 + 4) + (4 + 4) + (4 * 2 + 2) + 8
        )
    else:
        assert statistics_names <= local and not statistics_names & in_flat
    state = module_state(loaded)
    assert set(state) == set(first.model.state_dict())
    for name, value in first.model.state_dict().items():
        assert torch.equal(state[name], value), name
    second = peer_of(
        normalized_model(5), 5, checkpoint_dir=str(tmp_path), resume=True,
        average_buffers=average_buffers,
    )  # fmt: skip
    await second.start()
    try:
        assert torch.equal(second.model[1].running_mean, statistics)
        assert torch.equal(second.model[1].running_var, variances)
        assert int(second.model[1].num_batches_tracked) == 3
        assert torch.equal(second.flat.vector, first.flat.vector)
    finally:
        await second.stop()


async def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    first = peer_of(torch.nn.Linear(4, 2), 0, checkpoint_dir=str(tmp_path))
    await first.start()
    await first.stop()
    # the same number of parameters in another arrangement: only the layout tells them apart
    other = peer_of(torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)), 0,
                    checkpoint_dir=str(tmp_path), resume=True)  # fmt: skip
    assert other.flat.vector.numel() == first.flat.vector.numel()
    with pytest.raises(ckpt.CheckpointError, match="checkpoint of another model"):
        await other.start()


async def test_checkpoints_remember_the_members(tmp_path: Path) -> None:
    async with (
        started_peer("a", checkpoint_dir=str(tmp_path / "a")) as a,
        started_peer("b", seed=1, join=(a.address,)) as b,
        started_peer("c", seed=2, client_only=True, join=(a.address,)),
    ):
        await a.run(steps=1)
    loaded = ckpt.load_latest(tmp_path / "a")
    assert loaded is not None
    assert json.loads(loaded.metadata["members"]) == [{"id": "b", "address": b.address}]
    # b is gone: the resumed peer tries its remembered member once and starts alone
    async with started_peer("a", checkpoint_dir=str(tmp_path / "a"), resume=True) as resumed:
        assert resumed.resumed_from == loaded.path
        assert resumed.remembered_members == (b.address,)


async def test_resume_without_a_checkpoint_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with started_peer("a", checkpoint_dir=str(tmp_path / "none"), resume=True) as peer:
        assert peer.resumed_from is None and peer.step == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    found = [m for m in warnings if "found no checkpoint" in m]
    assert len(found) == 1
    assert "starting from scratch" in found[0] and str(tmp_path / "none") in found[0]


async def test_checkpoints_of_the_previous_format_still_resume(tmp_path: Path) -> None:
    """Before layout, buffers, members and the recipe were recorded: flat and optimizer only."""
    model = make_model(3)
    vector = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    optimizer = {"param_groups": sgd([torch.nn.Parameter(vector)]).state_dict()["param_groups"]}
    ckpt.save_checkpoint(
        tmp_path,
        {"flat": vector, "optimizer.0.momentum_buffer": torch.ones_like(vector)},
        step=12,
        round=6,
        peer_id="a",
        metadata={"optimizer": json.dumps({**optimizer, "scalars": {}})},
    )
    async with started_peer("a", checkpoint_dir=str(tmp_path), resume=True) as peer:
        assert (peer.step, peer.round, peer.remembered_members) == (12, 6, ())
        assert torch.equal(peer.flat.vector, vector)
        assert torch.equal(peer.optimizer.state_dict()["state"][0]["momentum_buffer"],
                           torch.ones_like(vector))  # fmt: skip
        with pytest.raises(ckpt.CheckpointError, match="records no layout"):
            module_state(ckpt.load_latest(tmp_path))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- SIGKILL while writing

# Every other kill waits for a write in progress (its temporary file) and lands in it; the
# others land at a random moment (between writes, in one, in the rename). Landing at random
# alone almost never hits a write: 0 of 8 such kills left a temporary when measured.
KILLS = 4


def _newest_step(folder: Path) -> int:
    newest = ckpt.latest_checkpoint(folder)
    return -1 if newest is None else int(newest.name.split("-")[1].split(".")[0])


def wait_until(
    what: str, condition: Callable[[], bool], timeout: float = 60, poll_s: float = 0.02
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_during_writes_leaves_no_temporary_and_no_corrupt_checkpoint(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "checkpoints"
    out, err = tmp_path / "peer.out", tmp_path / "peer.err"
    env = {**os.environ, "GOSSIPNET_SECRET": SECRET.decode()}
    command = [sys.executable, "-m", "gossipnet", "peer", "--id", "k", "--dataset",
               "synthetic:num_samples=400,seed=0", "--model", "mlp:hidden=384",
               "--checkpoint-dir", str(folder), "--checkpoint-every", "1",
               "--keep-checkpoints", "2", "--progress", "lines"]  # fmt: skip
    rng = random.Random(17)
    stale_after_kill = []
    for run in range(KILLS + 1):
        expected = ckpt.load_latest(folder)  # what a resume must take: the newest valid one
        final = run == KILLS
        if final:  # a temporary of our own making too, and names that only look like one
            (folder / ".checkpoint-planted.tmp").write_bytes(b"half a checkpoint")
            for decoy in ("checkpoint-notes.tmp", ".checkpoint-x.tmp.bak", "other.tmp"):
                (folder / decoy).write_bytes(b"not ours")
        stale = len(list(folder.glob(".checkpoint-*.tmp")))
        flags = (["--resume"] if run else []) + (["--steps", "1"] if final else [])
        with out.open("ab") as stdout, err.open("ab") as stderr:
            process = subprocess.Popen(command + flags, stdout=stdout, stderr=stderr, env=env)
        try:
            if final:
                assert process.wait(timeout=120) == 0, err.read_text()[-2000:]
            else:
                before = expected.step if expected is not None else -1
                wait_until("a newer checkpoint", lambda b=before: _newest_step(folder) > b)
                if run % 2:  # in the middle of a write (the start removed older temporaries)
                    wait_until("a checkpoint being written",
                               lambda: any(folder.glob(".checkpoint-*.tmp")), poll_s=0)  # fmt: skip
                else:
                    time.sleep(rng.uniform(0.0, 0.25))  # somewhere in the next writes
                process.kill()
                process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if run:  # the resume took the newest valid checkpoint, which the test read before
            assert expected is not None
            lines = re.findall(r"^resumed from (\S+) at step (\d+)", out.read_text(), re.M)
            assert len(lines) == run, out.read_text()[-2000:]
            assert lines[-1] == (str(expected.path), str(expected.step))
        if not final:
            stale_after_kill.append(len(list(folder.glob(".checkpoint-*.tmp"))))
        # never a corrupt checkpoint: every file there loads and verifies its checksum
        for path in ckpt.list_checkpoints(folder):
            ckpt.load_checkpoint(path)
    assert max(stale_after_kill) <= 1, stale_after_kill  # each start cleared the last one's
    assert any(stale_after_kill), stale_after_kill  # and some kill did land in a write
    assert not list(folder.glob(".checkpoint-*.tmp"))
    for decoy in ("checkpoint-notes.tmp", ".checkpoint-x.tmp.bak", "other.tmp"):
        assert (folder / decoy).read_bytes() == b"not ours"
    removed = re.findall(r"removed (\d+) stale temporary checkpoint", err.read_text())
    assert removed and int(removed[-1]) == stale  # the final start: its count, in one line
    assert len(removed) == sum(1 for n in stale_after_kill[:-1] if n) + 1
