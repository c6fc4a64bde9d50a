"""The local optimizer declared once (workloads.optimizers): its keys and their checks, the
learning rate at step t, clipping, and the torch optimizer a peer and the centralized
reference step."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from workloads import build_model, load_dataset, train_centralized
from workloads.optimizers import OPTIMIZER_KEYS, LocalOptimizer, clip_rows_


def test_warm_up_is_linear_then_cosine_reaches_min_lr_and_stays() -> None:
    settings = LocalOptimizer(
        "adamw", lr=1.0, schedule="cosine", warmup_steps=4, min_lr=0.1, decay_steps=10
    )
    assert [settings.lr_at(t) for t in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert settings.lr_at(4) == 1.0  # the peak, the first step after the warm-up
    assert settings.lr_at(9) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 2)) / 2)
    assert settings.lr_at(14) == pytest.approx(0.1)  # warm-up + decay_steps: min_lr
    assert settings.lr_at(1000) == pytest.approx(0.1)
    values = [settings.lr_at(t) for t in range(4, 15)]
    assert all(a > b for a, b in itertools.pairwise(values))  # decreasing


def test_step_decay_multiplies_by_gamma_every_step_size_steps_after_the_warm_up() -> None:
    settings = LocalOptimizer(lr=0.8, schedule="step", gamma=0.5, step_size=3, warmup_steps=2)
    assert [settings.lr_at(t) for t in range(10)] == [
        0.4, 0.8, 0.8, 0.8, 0.8, 0.4, 0.4, 0.4, 0.2, 0.2
    ]  # fmt: skip
    assert LocalOptimizer(lr=0.3).lr_at(10_000) == 0.3  # constant


def test_cosine_without_decay_steps_decays_over_the_run() -> None:
    settings = LocalOptimizer(lr=1.0, schedule="cosine", warmup_steps=10)
    assert settings.for_run(110).decay_steps == 100
    with pytest.raises(ValueError, match=r"^decay_steps: the cosine schedule needs it"):
        settings.for_run(None)
    assert LocalOptimizer(lr=1.0).for_run(None) == LocalOptimizer(lr=1.0)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"name": "adamw", "momentum": 0.0}, "momentum: optimizer adamw does not read it"),
        ({"name": "sgd", "betas": [0.9, 0.95]}, "betas: optimizer sgd does not read it"),
        ({"schedule": "cosine", "gamma": 0.5}, "gamma: schedule cosine does not read it"),
        ({"schedule": "step", "step_size": 5, "min_lr": 0.0}, "min_lr: schedule step does not"),
        ({"min_lr": 0.01}, "min_lr: schedule constant does not read it"),
        ({"schedule": "step"}, "step_size: the step schedule needs it"),
        ({"schedule": "linear"}, "schedule: got 'linear'; allowed: constant, cosine, step"),
        ({"name": "lion"}, "name: got 'lion'; allowed: sgd, adam, adamw"),
        ({"lr": 0.0}, r"lr: must be a finite number > 0; got 0.0"),
        ({"momentum": 1.0}, r"momentum: must be a finite number in \[0, 1\)"),
        ({"nesterov": True}, "nesterov: needs momentum > 0"),
        ({"name": "adam", "betas": "0.9"}, "betas: must be two numbers in"),
        ({"clip_norm": -1.0}, "clip_norm: must be a finite number > 0"),
        ({"schedule": "cosine", "lr": 0.1, "min_lr": 0.2}, r"min_lr: .* in \[0, 0.1\]"),
        ({"warmup_steps": 1.5}, "warmup_steps: must be an integer >= 0"),
        ({"lrr": 0.1}, "lrr: unknown key; allowed: name, lr, momentum"),
    ],
)
def test_a_key_the_optimizer_or_schedule_does_not_read_or_a_bad_value_names_the_key(
    keys: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=r"^" + message):
        LocalOptimizer.from_keys(keys)


def test_given_keys_build_the_optimizer_and_a_non_default_unread_value_is_refused() -> None:
    settings = LocalOptimizer.from_keys(
        {"name": "adamw", "lr": 3e-3, "betas": "0.9,0.95", "weight_decay": 0.1}
    )
    assert settings.betas == (0.9, 0.95) and settings.eps == 1e-8
    # made directly: a key at its default is not "given"; any other value is
    assert LocalOptimizer("adam", momentum=0.0).momentum == 0.0
    with pytest.raises(ValueError, match=r"^momentum: optimizer adam does not read it"):
        LocalOptimizer("adam", momentum=0.5)
    assert set(OPTIMIZER_KEYS) == {f for f in LocalOptimizer.__dataclass_fields__}
    assert OPTIMIZER_KEYS["warmup_steps"].flag == "--warmup-steps"
    assert OPTIMIZER_KEYS["name"].flag == "--optimizer"


def test_clip_rows_is_torchs_clip_grad_norm_for_each_row() -> None:
    grads = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)) * 3
    grads[2] *= 1e-3  # under the norm: left as it is
    expected = grads.clone()
    # torch's clip_grad_norm_ over a [d] tensor whose .grad is the row
    for index in range(5):
        param = torch.zeros(7, requires_grad=True)
        param.grad = grads[index].clone()
        torch.nn.utils.clip_grad_norm_([param], 1.5)
        expected[index] = param.grad
    clipped = clip_rows_(grads.clone(), 1.5)
    torch.testing.assert_close(clipped, expected)
    assert torch.equal(clipped[2], grads[2])
    torch.testing.assert_close(clipped.norm(dim=1)[[0, 1, 3, 4]], torch.full((4,), 1.5))


def test_the_torch_optimizer_follows_the_schedule_clips_and_resumes_where_it_stopped() -> None:
    settings = LocalOptimizer(
        "adamw", lr=0.1, schedule="cosine", warmup_steps=2, decay_steps=4, clip_norm=0.5
    )
    net = torch.nn.Linear(3, 2)
    optimizer = settings.torch_optimizer(net.parameters())
    seen = []
    for _ in range(4):
        for p in net.parameters():
            p.grad = torch.full_like(p, 10.0)
        optimizer.step()
        seen.append(optimizer.param_groups[0]["lr"])
        norm = torch.cat([p.grad.flatten() for p in net.parameters()]).norm()
        assert float(norm) == pytest.approx(0.5, rel=1e-5)  # the peer's global norm
    assert seen == [settings.lr_at(t) for t in range(4)]
    state = optimizer.state_dict()  # what a checkpoint keeps
    again = settings.torch_optimizer(torch.nn.Linear(3, 2).parameters())
    again.load_state_dict(state)
    for p in again.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    again.step()
    assert again.param_groups[0]["lr"] == settings.lr_at(4)


def test_train_centralized_takes_the_local_optimizer_with_its_schedule() -> None:
    data = load_dataset("synthetic:num_samples=200,seed=0")
    results = {}
    for schedule in ("cosine", "constant"):
        settings = LocalOptimizer("adam", lr=0.05, schedule=schedule, warmup_steps=3)
        model = build_model("logistic", data.input_shape, data.num_classes, seed=0)
        results[schedule] = train_centralized(
            model, data, steps=40, batch_size=32, optimizer=settings
        )
    cosine = results["cosine"]
    assert cosine.error is None and cosine.accuracy is not None and cosine.accuracy > 0.8
    assert cosine.loss != results["constant"].loss  # the schedule changed the steps
    with pytest.raises(ValueError, match=r"^lr: give lr, momentum and weight_decay in the"):
        train_centralized(model, data, steps=2, batch_size=4, optimizer=settings, lr=0.1)
    with pytest.raises(ValueError, match=r"^momentum: optimizer adam does not read it"):
        train_centralized(model, data, steps=2, batch_size=4, optimizer="adam", lr=0.1,
                          momentum=0.9)  # fmt: skip
