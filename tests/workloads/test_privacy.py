"""DP-SGD's mechanism (workloads.privacy) and its accountant (workloads.accountant), real torch
and real Opacus (the ``privacy`` extra, installed by ``make test``)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from workloads import load_dataset
from workloads.accountant import PrivacyAccountant, PrivacyLedger, noise_multiplier_for
from workloads.privacy import (
    PoissonBatchSampler,
    PrivacyConfig,
    clipped_sum,
    gaussian_noise,
    poisson_batches,
    private_gradient,
)
from workloads.task import cross_entropy


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))


def test_without_noise_and_clipping_it_is_the_plain_mean_gradient() -> None:
    net = model()
    x, y = torch.randn(7, 5), torch.randint(0, 3, (7,))
    gradient, loss = private_gradient(
        net, cross_entropy, x, y, clip=1e3, noise_multiplier=1e-12, batch_size=7, seed=0,
        peer=0, step=0,
    )  # fmt: skip
    plain = cross_entropy(net(x), y)
    plain.backward()
    expected = torch.cat([p.grad.flatten() for p in net.parameters()])
    assert torch.allclose(gradient, expected, atol=1e-6)
    assert loss == pytest.approx(float(plain.detach()), rel=1e-6)


def test_each_sample_is_clipped_to_c_over_all_parameters() -> None:
    net = model()
    x, y = torch.randn(5, 5) * 50, torch.randint(0, 3, (5,))
    clip = 0.01
    for s in range(5):  # one sample at a time: its clipped gradient has norm min(‖g‖, C)
        gradient, _ = private_gradient(
            net, cross_entropy, x[s : s + 1], y[s : s + 1], clip=clip, noise_multiplier=1e-12,
            batch_size=1, seed=0, peer=0, step=0,
        )  # fmt: skip
        assert float(gradient.norm()) == pytest.approx(clip, rel=1e-3)
    per_sample = torch.randn(4, 3, 10)
    valid = torch.tensor([[True, False, True]] * 4)
    summed = clipped_sum(per_sample, 1.0, valid)
    by_hand = sum(
        per_sample[:, s] * (1.0 / (per_sample[:, s].norm(dim=1, keepdim=True) + 1e-6)).clamp(max=1)
        for s in (0, 2)
    )
    assert torch.allclose(summed, by_hand, atol=1e-6)


def test_the_noise_is_standard_normal_and_fixed_by_seed_peer_and_step() -> None:
    rows = gaussian_noise(5, torch.arange(3), step=2, dim=50_000, dtype=torch.float64)
    assert abs(float(rows.mean())) < 0.02 and abs(float(rows.std()) - 1) < 0.02
    assert float(rows.abs().max()) > 3.5  # tails exist (Box-Muller on 53-bit uniforms)
    alone = gaussian_noise(5, torch.tensor([1]), step=2, dim=50_000, dtype=torch.float64)
    assert torch.equal(alone[0], rows[1])  # a peer draws its own row alone
    assert not torch.equal(rows[0], rows[1])
    other_step = gaussian_noise(5, torch.tensor([1]), step=3, dim=50_000, dtype=torch.float64)
    assert not torch.equal(other_step[0], rows[1])
    # sigma C z: the private gradient of an all-zero clipped sum is exactly the scaled noise
    net = model()
    gradient, loss = private_gradient(
        net, cross_entropy, torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), clip=0.5,
        noise_multiplier=2.0, batch_size=4, seed=5, peer=1, step=2,
    )  # fmt: skip
    dim = sum(p.numel() for p in net.parameters())
    noise = gaussian_noise(5, torch.tensor([1]), step=2, dim=dim)[0]
    assert math.isnan(loss)
    assert torch.allclose(gradient, 2.0 * 0.5 * noise / 4)


def test_poisson_batches_are_the_stacked_samplers_rows_with_rate_b_over_n() -> None:
    data = load_dataset("synthetic:num_samples=400,seed=0")
    parts = [torch.arange(0, 100), torch.arange(100, 160), torch.arange(160, 320)]
    sampler = PoissonBatchSampler(parts, batch_size=10, seed=4)
    streams = [poisson_batches(data, part, 10, seed=4, peer=i) for i, part in enumerate(parts)]
    sizes = torch.zeros(3)
    steps = 60
    for step in range(steps):
        index, valid = sampler.indices(step)
        for i, stream in enumerate(streams):
            x, y = next(stream)
            chosen = index[i][valid[i]]
            assert torch.equal(y, data.y_train[chosen]) and torch.equal(x, data.x_train[chosen])
            assert set(chosen.tolist()) <= set(parts[i].tolist())
            sizes[i] += len(y)
    # E|batch| = q N = B for every shard size
    assert torch.allclose(sizes / steps, torch.full((3,), 10.0), atol=1.6)
    late = next(poisson_batches(data, parts[1], 10, seed=4, peer=1, start_step=7))
    index, valid = sampler.indices(7)
    assert torch.equal(late[1], data.y_train[index[1][valid[1]]])


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"noise": 1.0}, "clip: is required"),
        ({"clip": 1.0}, "noise: give the noise multiplier, or a target epsilon"),
        ({"clip": 1.0, "noise": -1.0}, "noise: must be > 0, got -1.0"),
        ({"clip": 0, "noise": 1.0}, "clip: must be > 0"),
        ({"clip": 1.0, "noise": 1.0, "delta": 1.0}, "delta: must be > 0 and < 1"),
        ({"clip": 1.0, "epsilon": float("inf")}, "epsilon: must be a finite number"),
        (
            {"clip": 1.0, "noise": 1.0, "sampling": "shuffle"},
            "sampling: got 'shuffle'; allowed: poisson, fixed",
        ),
        (
            {"clip": 1.0, "noise": 1.0, "accountant": "gdp"},
            "accountant: got 'gdp'; allowed: rdp, prv",
        ),
        ({"clip": 1.0, "noise": 1.0, "sigma": 1.0}, "sigma: unknown key; allowed: noise, clip"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(table: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.split(":")[0]) as info:
        PrivacyConfig.from_table(table)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")  # Opacus' own, q = 1
def test_the_accountant_is_opacus_rdp_and_composes_what_it_is_given() -> None:
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    accountant = PrivacyAccountant("rdp")
    for _ in range(30):
        accountant.record(1.1, 0.02)
    accountant.record(0.8, 1.0, steps=2)  # a later mechanism (e.g. noisy gossip, q = 1)
    reference = RDPAccountant()
    reference.history = [(1.1, 0.02, 30), (0.8, 1.0, 2)]
    assert accountant.history == reference.history
    assert accountant.epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    ledger = PrivacyLedger(1.1, 0.02, 1e-5, target=2.0)
    budget = ledger.budget_steps(10_000)
    assert ledger.epsilon_at(budget) <= 2.0 < ledger.epsilon_at(budget + 1)
    sigma = noise_multiplier_for(3.0, 1e-5, 0.02, 500)
    assert sigma == get_noise_multiplier(
        target_epsilon=3.0, target_delta=1e-5, sample_rate=0.02, steps=500, accountant="rdp"
    )
    assert list(itertools.islice(iter(accountant.history), 1)) == [(1.1, 0.02, 30)]


def test_the_prv_ledger_is_opacus_prv_and_searches_no_further_than_the_run() -> None:
    from opacus.accountants import PRVAccountant

    ledger = PrivacyLedger(1.0, 0.064, 1e-5, target=2.0, kind="prv")
    reference = PRVAccountant()
    reference.history = [(1.0, 0.064, 5)]
    assert ledger.epsilon_at(5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)
    assert PrivacyLedger(1.0, 0.064, 1e-5, target=2.0, kind="prv").budget_steps(3) == 3
