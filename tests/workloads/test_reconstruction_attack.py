"""The batch-of-one reconstruction (workloads.reconstruction): a dense first layer's gradient
gives the input exactly; DP-SGD's noise on the same gradient does not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workloads.privacy import clipped_sum, gaussian_noise, per_sample_gradients, privatize
from workloads.reconstruction import cosine_similarity, dense_input_layer, reconstruct_input
from workloads.task import cross_entropy


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))


def test_one_sgd_step_on_one_example_gives_the_input_and_noise_hides_it() -> None:
    model = mlp()
    x = torch.randn(1, 3, 4)  # flattened to 12 by the model
    y = torch.tensor([2])
    weight, bias = dense_input_layer(model, (3, 4))
    assert (weight, bias) == ("1.weight", "1.bias")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    cross_entropy(model(x), y).backward()
    optimizer.step()  # the neighbour sees the delta of this step
    delta = {name: p.detach() - before[name] for name, p in model.named_parameters()}
    recovered = reconstruct_input(delta[weight], delta[bias])
    assert float(cosine_similarity(recovered, x.flatten())) > 0.99
    torch.testing.assert_close(recovered, x.flatten(), rtol=1e-3, atol=1e-4)

    # DP-SGD's step on the same batch of one: clipped to C = 1, noise of sigma
    params = {name: p.detach() for name, p in model.named_parameters()}
    per_sample, _ = per_sample_gradients(model, params, {}, cross_entropy, x, y)
    clipped = clipped_sum(per_sample, 1.0)
    offsets = {}
    start = 0
    for name, p in params.items():
        offsets[name] = slice(start, start + p.numel())
        start += p.numel()
    cosines = []
    for sigma in (0.0, 1.0):
        noise = gaussian_noise(7, torch.arange(64), 0, start, dtype=clipped.dtype)
        private = privatize(
            clipped.expand(64, -1), noise, noise_multiplier=sigma, clip=1.0, batch_size=1
        )
        found = reconstruct_input(
            private[:, offsets[weight]].reshape(64, 16, 12), private[:, offsets[bias]]
        )
        cosines.append(cosine_similarity(found, x.flatten().expand(64, -1)).abs())
    assert bool((cosines[0] > 0.99).all())  # clipping alone scales row and bias alike
    assert float(cosines[1].mean()) < 0.3  # 64 draws of the noise


def test_no_bias_delta_recovers_nothing() -> None:
    recovered = reconstruct_input(torch.ones(2, 5), torch.zeros(2))
    assert recovered.eq(0).all() and float(cosine_similarity(recovered, torch.ones(5))) == 0.0


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten()), "is Conv1d"),
        (nn.Sequential(nn.Flatten(), nn.Linear(12, 3, bias=False)), "Linear without a bias"),
        (nn.Sequential(nn.Linear(4, 3)), "takes 4 features, not the whole flattened input"),
    ],
)
def test_a_model_without_a_dense_first_layer_is_refused(model: nn.Module, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dense_input_layer(model, (3, 4))
