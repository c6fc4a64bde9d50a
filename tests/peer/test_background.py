"""BackgroundPeer: gossip from a plain synchronous PyTorch loop (issue 19's drop-in).

In-process tests run two BackgroundPeers on 127.0.0.1 (real HTTP, each with its own event
loop thread); the end-to-end test runs a user's script in two processes."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
import threading
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from peer import BackgroundPeer, PeerConfig
from peer.app.swarm import free_ports
from peer.node.peer import JoinError

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"background-test-secret-0123456789"
STATISTICS = ("1.running_mean", "1.running_var")


def bn_model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def batch(seed: int, shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 4, generator=g) + shift, torch.randint(0, 2, (16,), generator=g)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, data: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """One iteration of an ordinary loop."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data[0]), data[1])
    loss.backward()
    optimizer.step()
    return loss


def config(peer_id: str, **overrides: Any) -> PeerConfig:
    overrides.setdefault("secret", SECRET)
    overrides.setdefault("request_timeout_s", 5.0)
    return PeerConfig(peer_id=peer_id, **overrides)


def floats(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items() if t.is_floating_point()}


def get(address: str | None, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
        body: bytes = response.read()
    return body


@pytest.fixture
def pair() -> Iterator[tuple[BackgroundPeer, BackgroundPeer]]:
    """Peers ``a`` (started first) and ``b`` (joins a), BatchNorm models, plain SGD, AD-PSGD."""
    a_model, b_model = bn_model(0), bn_model(1)
    a = BackgroundPeer(a_model, torch.optim.SGD(a_model.parameters(), lr=0.1), config("a"))
    a.start()
    b = BackgroundPeer(
        b_model, torch.optim.SGD(b_model.parameters(), lr=0.1), config("b", join=(a.address,))
    )
    try:
        b.start()
        yield a, b
    finally:
        b.close()
        a.close()


# --------------------------------------------------------------------------- status and buffers


def test_status_and_metrics_report_the_loops_steps_and_loss(
    pair: tuple[BackgroundPeer, BackgroundPeer],
) -> None:
    a, b = pair
    model = a.peer.model
    for i in range(5):
        loss = train_step(model, a.optimizer, batch(i))
        a.report(loss)
    a.wait()
    status = json.loads(get(a.address, "/v1/status"))
    assert status["step"] == 5 and status["round"] == 5
    assert status["loss"] == pytest.approx(loss.item())
    assert status["exchanges"]["ok"] == 5
    samples = dict(
        line.split(" ", 1) for line in get(a.address, "/metrics").decode().splitlines()
        if line.startswith(("gossipnet_step ", "gossipnet_loss "))
    )  # fmt: skip
    assert float(samples["gossipnet_step"]) == 5
    assert float(samples["gossipnet_loss"]) == pytest.approx(loss.item())
    assert b.status()["step"] == 0  # b only answered


def test_an_exchange_averages_the_batchnorm_statistics(
    pair: tuple[BackgroundPeer, BackgroundPeer],
) -> None:
    """AD-PSGD's pair average covers the running statistics: after a's step and its
    exchange with idle b, both hold exactly (a after its step + b) / 2, buffers included,
    while the integer counter stays each peer's own."""
    a, b = pair
    a_model, b_model = a.peer.model, b.peer.model
    # a's step replayed on a copy: what a holds right before the exchange
    replay = copy.deepcopy(a_model)
    train_step(replay, torch.optim.SGD(replay.parameters(), lr=0.1), batch(7, shift=3.0))
    a_stepped, b_before = floats(replay), floats(b_model)
    assert not torch.allclose(a_stepped["1.running_mean"], b_before["1.running_mean"])
    train_step(a_model, a.optimizer, batch(7, shift=3.0))
    assert a.wait() == 1
    for name, value in floats(b_model).items():
        expected = (a_stepped[name] + b_before[name]) / 2
        assert torch.allclose(value, expected, atol=1e-6), name
        assert torch.allclose(floats(a_model)[name], expected, atol=1e-6), name
    assert int(a_model[1].num_batches_tracked) == 1  # type: ignore[index]
    assert int(b_model[1].num_batches_tracked) == 0  # type: ignore[index]


def test_average_buffers_off_warns_and_keeps_statistics_local(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a_model, b_model = bn_model(0), bn_model(1)
    caplog.set_level(logging.WARNING, logger="peer.node.peer")
    with BackgroundPeer(
        a_model, torch.optim.SGD(a_model.parameters(), lr=0.1), config("a", average_buffers=False)
    ) as a:
        warned = [
            r.getMessage() for r in caplog.records if "average_buffers is off" in r.getMessage()
        ]
        assert len(warned) == 1 and "1.running_mean, 1.running_var" in warned[0]
        with BackgroundPeer(
            b_model,
            torch.optim.SGD(b_model.parameters(), lr=0.1),
            config("b", join=(a.address,), average_buffers=False),
        ):
            before = floats(b_model)
            train_step(a_model, a.optimizer, batch(7, shift=3.0))
            assert a.wait() == 1
            after = floats(b_model)
    assert not torch.equal(after["0.weight"], before["0.weight"])  # the parameters were mixed
    for name in STATISTICS:
        assert torch.equal(after[name], before[name]), name  # the statistics were not


# --------------------------------------------------------------------------- the user's optimizer


@pytest.mark.parametrize("scheduler_made", ["before", "after"])
def test_momentum_and_steplr_train_exactly_as_without_the_peer(scheduler_made: str) -> None:
    """Alone, the drop-in changes nothing: the same loop with and without it ends with the
    same weights, statistics, momentum and learning rate (a scheduler made before or after
    the peer wraps optimizer.step)."""
    model, reference = bn_model(0), bn_model(0)

    def optimizer_and_scheduler(
        module: nn.Module,
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)

    ref_optimizer, ref_scheduler = optimizer_and_scheduler(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = None
    if scheduler_made == "before":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)
    schedulers_step = optimizer.__dict__.get("step")
    with (
        warnings.catch_warnings(record=True) as caught,
        BackgroundPeer(model, optimizer, config("alone")) as swarm,
    ):
        warnings.simplefilter("always")
        if scheduler is None:
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)
        for i in range(5):
            train_step(model, optimizer, batch(i))
            scheduler.step()
            train_step(reference, ref_optimizer, batch(i))
            ref_scheduler.step()
        swarm.wait()  # async mode: the fifth exchange may still be in flight
        assert swarm.step == 5 and swarm.round == 5
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.1**2)
    assert set(map(id, optimizer.state)) == set(map(id, model.parameters()))
    for mine, theirs in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.allclose(mine, theirs, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(
            optimizer.state[p]["momentum_buffer"], ref_optimizer.state[q]["momentum_buffer"]
        )
    if scheduler_made == "before":  # close() gave the optimizer back its step as it was
        assert optimizer.__dict__["step"] is schedulers_step


@pytest.mark.parametrize("every", [1, 3])
def test_gossip_every_k_exchanges_k_times_less(
    pair: tuple[BackgroundPeer, BackgroundPeer], every: int
) -> None:
    a, _ = pair
    a.gossip_every = every
    for i in range(6):
        train_step(a.peer.model, a.optimizer, batch(i))
        a.wait()
    status = a.status()
    assert status["step"] == 6
    assert status["round"] == status["exchanges"]["ok"] == 6 // every


def test_gossip_every_must_agree_with_local_steps() -> None:
    model = bn_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    local = config("a", algorithm="local-sgd", local_steps=4)
    assert BackgroundPeer(model, optimizer, local).gossip_every == 4
    with pytest.raises(ValueError, match=r"gossip_every=2 contradicts PeerConfig\.local_steps=4"):
        BackgroundPeer(model, optimizer, local, gossip_every=2)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="gossip_every must be an integer >= 1"):
            BackgroundPeer(model, optimizer, config("a"), gossip_every=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"optimizer must be a torch\.optim\.Optimizer"):
        BackgroundPeer(model, lambda p: torch.optim.SGD(p, lr=0.1), config("a"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="are not the model's"):
        BackgroundPeer(model, torch.optim.SGD(bn_model(1).parameters(), lr=0.1), config("a"))


# --------------------------------------------------------------------------- errors and stopping


def test_an_exchange_that_fails_in_the_background_is_raised_in_the_loop() -> None:
    model = bn_model(0)
    swarm = BackgroundPeer(model, torch.optim.SGD(model.parameters(), lr=0.1), config("a"))
    swarm.start()

    async def broken() -> int:
        raise OSError("the exchange broke")

    swarm.peer.gossip = broken  # type: ignore[method-assign]
    train_step(model, swarm.optimizer, batch(0))  # async: the exchange overlaps, fails later
    with pytest.raises(OSError, match="the exchange broke"):
        swarm.wait()
    train_step(model, swarm.optimizer, batch(1))
    with pytest.raises(OSError, match="the exchange broke"):
        swarm.close()  # the last one is not lost either
    swarm.close()  # idempotent
    assert "step" not in swarm.optimizer.__dict__


def test_sync_rounds_wait_and_raise_in_optimizer_step() -> None:
    model = bn_model(0)
    swarm = BackgroundPeer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), config("a", algorithm="dpsgd")
    )
    assert swarm.waits_for_exchange
    with swarm:

        async def broken() -> int:
            raise OSError("the round broke")

        swarm.peer.gossip = broken  # type: ignore[method-assign]
        with pytest.raises(OSError, match="the round broke"):
            train_step(model, swarm.optimizer, batch(0))
        assert swarm.step == 1


def test_a_failed_join_is_raised_by_start_and_leaves_the_optimizer_alone() -> None:
    model = bn_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    swarm = BackgroundPeer(model, optimizer, config("a", join=("127.0.0.1:9",), join_timeout_s=0.2))
    with pytest.raises(JoinError, match=r"127\.0\.0\.1:9"):
        swarm.start()
    assert "step" not in optimizer.__dict__
    swarm.close()
    with pytest.raises(RuntimeError, match="already started"):
        swarm.start()


def test_close_is_idempotent_and_works_without_with(caplog: pytest.LogCaptureFixture) -> None:
    model = bn_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    swarm = BackgroundPeer(model, optimizer, config("a"))
    swarm.close()  # never started: nothing to do
    swarm = BackgroundPeer(model, optimizer, config("a"))
    swarm.start()
    address = swarm.address
    for i in range(6):  # alone: every exchange phase finds nobody
        train_step(model, optimizer, batch(i))
    swarm.close()
    swarm.close()
    assert "step" not in optimizer.__dict__
    train_step(model, optimizer, batch(9))  # the plain optimizer again: not counted
    assert swarm.step == 6 and not any(
        t.name.startswith("gossipnet-peer-") for t in threading.enumerate()
    )
    with pytest.raises(OSError):
        get(address, "/v1/status")
    # a peer that has nobody to average with says so, as every peer does
    assert any("training alone" in r.getMessage() for r in caplog.records)


def test_device_must_be_the_models() -> None:
    model = bn_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    swarm = BackgroundPeer(model, optimizer, config("a", device="auto"))
    assert swarm.peer.config.device == "cpu"
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"PeerConfig\.device is 'cuda'"):
            BackgroundPeer(model, optimizer, config("a", device="cuda"))


# --------------------------------------------------------------------------- a user's script

SCRIPT = '''
"""A user's ordinary training loop, made a gossip peer by three lines."""
import json, os, sys, time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peer import BackgroundPeer, PeerConfig

name, folder, port, join = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), tuple(sys.argv[4:])
seed = {"a": 0, "b": 1}[name]
torch.manual_seed(seed)
torch.set_num_threads(1)
x = torch.randn(64, 4) + 2.0 * seed          # the peers' data differ
y = (x.sum(dim=1) > 4.0 * seed).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
config = PeerConfig(peer_id=name, port=port, join=join, join_timeout_s=60.0, algorithm="dpsgd",
                    round_deadline_s=20.0, log_dir=str(folder / f"{name}.logs"))
with BackgroundPeer(model, optimizer, config, log_every=2) as swarm:
    (folder / f"{name}.address").write_text(swarm.address)
    swarm.wait_for_members(1)
    for epoch in range(2):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            swarm.report(loss)
            scheduler.step()
    with swarm.lock:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(folder / f"{name}.safetensors"))
    (folder / f"{name}.lr").write_text(str(optimizer.param_groups[0]["lr"]))
    while not (folder / "stop").exists():
        time.sleep(0.05)
'''


@pytest.mark.slow
def test_a_plain_loop_in_two_processes_gossips_its_batchnorm_statistics(tmp_path: Path) -> None:
    """The issue's done-when: a plain PyTorch loop (DataLoader, BatchNorm, momentum, StepLR)
    in two processes; status over HTTP, TensorBoard files, and averaged statistics."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "GOSSIPNET_SECRET": SECRET.decode(), "PYTHONPATH": str(ROOT)}

    def start(name: str, port: int, *join: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.err", "wb") as err:
            return subprocess.Popen(
                [sys.executable, str(script), name, str(tmp_path), str(port), *join],
                stdout=err, stderr=err, env=env, cwd=tmp_path,
            )  # fmt: skip

    def wait_for(path: Path, process: subprocess.Popen[bytes]) -> None:
        import time

        deadline = time.monotonic() + 90
        while not path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{path.name} never came:\n" + read_errors())
            time.sleep(0.05)

    def read_errors() -> str:
        return "\n".join(
            (tmp_path / f"{n}.err").read_text() for n in "ab" if (tmp_path / f"{n}.err").exists()
        )

    # both at once: b's join is retried until a listens (ports picked free beforehand)
    a_port, b_port = free_ports(2)
    a = start("a", a_port)
    b = start("b", b_port, f"127.0.0.1:{a_port}")
    try:
        for name, process in (("a", a), ("b", b)):
            wait_for(tmp_path / f"{name}.lr", process)
        statuses = [
            json.loads(get((tmp_path / f"{n}.address").read_text(), "/v1/status")) for n in "ab"
        ]
        for status in statuses:
            assert status["step"] == status["round"] == 8, status
            assert isinstance(status["loss"], float)
            assert status["exchanges"]["ok"] >= 7 and not status["isolated"]
        (tmp_path / "stop").touch()
        assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0, read_errors()
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert "Traceback" not in read_errors()
    for name in "ab":
        assert float((tmp_path / f"{name}.lr").read_text()) == pytest.approx(0.1 * 0.5**2)
        logs = tmp_path / f"{name}.logs"
        assert list(logs.glob("events.out.tfevents.*")), f"no TensorBoard file for {name}"
        rows = (logs / "metrics.csv").read_text().splitlines()
        assert rows[0].startswith("time_s,step,loss")
        assert [row.split(",")[1] for row in rows[1:]] == ["2", "4", "6", "8", "8"]
    a_state, b_state = (load_file(str(tmp_path / f"{n}.safetensors")) for n in "ab")
    # the last round mixed both models, statistics included: both peers hold one model
    for name in ("0.weight", *STATISTICS):
        assert torch.allclose(a_state[name], b_state[name], atol=1e-5), name
    assert not torch.allclose(a_state[STATISTICS[0]], torch.zeros(8), atol=1e-3)
    # the counter is local, and each peer counted its own 8 batches
    assert int(a_state["1.num_batches_tracked"]) == int(b_state["1.num_batches_tracked"]) == 8


@pytest.mark.slow
def test_the_dropin_example_runs_and_both_peers_end_with_one_model() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "dropin_loop.py"), "--epochs", "1"],
        capture_output=True, text=True, timeout=110, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    epochs = [line for line in lines if " epoch 1 " in line]
    assert len(epochs) == 2, result.stdout
    assert all(float(line.split("test acc ")[1].split()[0]) > 0.5 for line in epochs)
    statistics = {line.split(":")[0]: json.loads(line.split("running_mean[:3] ")[1])
                  for line in lines if "running_mean" in line}  # fmt: skip
    assert set(statistics) == {"a", "b"}
    assert statistics["a"] == pytest.approx(statistics["b"], abs=2e-4)
