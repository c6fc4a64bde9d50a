"""Trainer and Peer training hooks: evaluate for classifiers and regression, per-step
callbacks, learning-rate schedulers per step or per round, steps counted by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.node.trainer import Trainer, is_classification

from .conftest import SECRET, make_data, make_model

CPU = torch.device("cpu")


def trainer_of(model: torch.nn.Module, loss_fn: Any = F.cross_entropy) -> Trainer:
    return Trainer(model, lambda p: torch.optim.SGD(p, lr=0.1), loss_fn, [], CPU)


# --------------------------------------------------------------------------- evaluate


def test_a_classifier_reports_accuracy() -> None:
    torch.manual_seed(0)
    trainer = trainer_of(torch.nn.Linear(4, 3))
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    result = trainer.evaluate(x, y, batch_size=16)
    with torch.no_grad():
        output = trainer.model(x)
    assert result["accuracy"] == pytest.approx(float((output.argmax(-1) == y).float().mean()))
    assert result["samples"] == 50
    assert result["loss"] == pytest.approx(float(F.cross_entropy(output, y)), rel=1e-5)


@pytest.mark.parametrize(
    ("outputs", "targets", "loss_fn"),
    [
        (1, torch.randn(40, 1), F.mse_loss),  # regression, one output
        (3, torch.randn(40, 3), F.mse_loss),  # several outputs: argmax means nothing
        (1, torch.randint(0, 2, (40, 1)).float(), F.binary_cross_entropy_with_logits),
    ],
)
def test_a_model_that_is_not_a_classifier_reports_no_accuracy(
    outputs: int, targets: torch.Tensor, loss_fn: Any
) -> None:
    """Regression used to report accuracy 0.0; now the key is there with None."""
    torch.manual_seed(0)
    trainer = trainer_of(torch.nn.Linear(4, outputs), loss_fn)
    x = torch.randn(40, 4)
    result = trainer.evaluate(x, targets, batch_size=16)
    assert result["accuracy"] is None
    assert math.isfinite(result["loss"]) and result["samples"] == 40
    with torch.no_grad():
        expected = float(loss_fn(trainer.model(x), targets))
    assert result["loss"] == pytest.approx(expected, rel=1e-5)


def test_is_classification_rule() -> None:
    labels = torch.tensor([0, 2, 1])
    assert is_classification(torch.zeros(3, 3), labels)
    assert is_classification(torch.zeros(3, 2), labels.int())
    assert not is_classification(torch.zeros(3, 1), labels)  # one output
    assert not is_classification(torch.zeros(3, 3), labels.float())  # float targets
    assert not is_classification(torch.zeros(3, 3), labels.bool())
    assert not is_classification(torch.zeros(3, 4, 3), labels)  # not [N, C]
    assert not is_classification(torch.zeros(3, 3), torch.zeros(3, 3, dtype=torch.long))


def test_evaluate_with_another_loss_and_bad_arguments() -> None:
    trainer = trainer_of(torch.nn.Linear(4, 1), loss_fn=F.cross_entropy)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with torch.no_grad():
        expected = float(F.l1_loss(trainer.model(x), y))
    assert trainer.evaluate(x, y, loss_fn=F.l1_loss)["loss"] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        trainer.evaluate(x, y, batch_size=0)
    with pytest.raises(ValueError, match="at least one sample"):
        trainer.evaluate(x[:0], y[:0])


def test_an_optimizer_over_other_tensors_is_refused() -> None:
    model = torch.nn.Linear(4, 2)
    other = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"optimizer: 2 of its parameters .* are not the model's"):
        Trainer(model, other, F.cross_entropy, [], CPU)
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, [], CPU)


# --------------------------------------------------------------------------- Peer.run hooks


def lone_peer(**config: Any) -> Peer:
    return Peer(
        make_model(0),
        lambda params: torch.optim.SGD(params, lr=0.08),
        F.cross_entropy,
        make_data(0),
        PeerConfig(peer_id="a", secret=SECRET, **config),
    )


async def test_run_calls_back_after_every_step_and_steps_the_scheduler() -> None:
    peer = lone_peer()
    calls: list[tuple[int, float]] = []
    rates: list[float] = []

    def callback(step: int, loss: float) -> None:
        calls.append((step, loss))
        rates.append(peer.optimizer.param_groups[0]["lr"])

    scheduler = torch.optim.lr_scheduler.StepLR(peer.optimizer, step_size=2, gamma=0.5)
    await peer.start()
    try:
        await peer.run(5, callbacks=[callback], scheduler=scheduler)
    finally:
        await peer.stop()
    assert [step for step, _ in calls] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(loss) for _, loss in calls) and calls[-1][1] == peer.loss
    # the scheduler steps right after each optimizer step, before the callback sees it
    assert rates == pytest.approx([0.08, 0.04, 0.04, 0.02, 0.02])
    assert peer.optimizer.param_groups[0]["lr"] == pytest.approx(0.02)


async def test_run_steps_the_scheduler_per_round() -> None:
    """local SGD with 2 steps per round: per round, 4 steps are 2 scheduler steps."""
    per: dict[str, float] = {}
    for every in ("step", "round"):
        peer = lone_peer(algorithm="local-sgd", local_steps=2, round_deadline_s=0.5)
        scheduler = torch.optim.lr_scheduler.StepLR(peer.optimizer, step_size=1, gamma=0.5)
        await peer.start()
        try:
            await peer.run(4, scheduler=scheduler, scheduler_every=every)  # type: ignore[arg-type]
        finally:
            await peer.stop()
        assert (peer.step, peer.round) == (4, 2)
        per[every] = peer.optimizer.param_groups[0]["lr"]
    assert per == pytest.approx({"step": 0.08 * 0.5**4, "round": 0.08 * 0.5**2})


async def test_a_failing_callback_stops_run() -> None:
    peer = lone_peer()

    def broken(step: int, loss: float) -> None:
        if step == 2:
            raise RuntimeError("callback broke at step 2")

    await peer.start()
    try:
        with pytest.raises(RuntimeError, match="callback broke at step 2"):
            await peer.run(5, callbacks=[broken])
        assert peer.step == 2
    finally:
        await peer.stop()


@pytest.mark.parametrize(
    ("hooks", "message"),
    [
        ({"callbacks": [1]}, r"callbacks\[0\] must be callable"),
        ({"scheduler": object()}, "scheduler must be a learning-rate scheduler"),
        ({"scheduler_every": "epoch"}, "scheduler_every must be one of step, round, got 'epoch'"),
    ],
)
async def test_bad_hooks_are_refused_before_training(hooks: dict[str, Any], message: str) -> None:
    peer = lone_peer()
    with pytest.raises(ValueError, match=message):
        await peer.run(3, **hooks)
    assert peer.step == 0


async def test_steps_taken_by_hand_show_in_status_and_metrics() -> None:
    """A hand-driven loop (under peer.lock, then gossip) counts its steps with record_step."""
    peer = lone_peer()
    await peer.start()
    try:
        for inputs, targets in make_data(1, batches=3):
            with peer.lock:
                peer.flat.zero_grad()
                loss = F.cross_entropy(peer.model(inputs), targets)
                loss.backward()
                peer.optimizer.step()
            assert peer.record_step(loss) == peer.step
            await peer.gossip()
    finally:
        await peer.stop()
    status = peer.status()
    assert (status["step"], status["round"]) == (3, 3)
    assert status["loss"] == pytest.approx(loss.item())
    metrics = peer.render_metrics().decode()
    assert "gossipnet_step 3.0" in metrics
    with pytest.raises(ValueError, match="loss must be a scalar"):
        peer.record_loss(torch.zeros(2))
    with pytest.raises(ValueError, match="loss must be a number or a scalar tensor"):
        peer.record_loss("0.5")  # type: ignore[arg-type]
