"""FlatParameters: one buffer, views back into the module, flat gradients, unflatten for torch.func."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

from gossip.flat import FlatParameters, ParameterLayout


def small_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


def test_vector_holds_the_parameters_and_the_module_views_it() -> None:
    model = small_model()
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat = FlatParameters(model)
    assert flat.numel == expected.numel() == 6 * 8 + 8 + 8 + 8 + 8 * 3 + 3
    assert torch.equal(flat.vector, expected)
    assert flat.views_intact()
    x = torch.randn(5, 6)
    model.eval()
    before = model(x)
    flat.vector.mul_(0)  # one vector op reaches every layer
    assert not torch.equal(model(x), before)
    assert all(bool((p == 0).all()) for p in model.parameters())
    flat.load_(expected)
    assert torch.equal(model(x), before)


def test_flat_gradient_and_one_optimizer_step_match_per_tensor_training() -> None:
    model = small_model()
    reference = copy.deepcopy(model)
    flat = FlatParameters(model)
    optimizer = torch.optim.SGD([flat.parameter], lr=0.1, momentum=0.9, weight_decay=1e-3)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    for _ in range(4):
        flat.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        ref_optimizer.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])  # type: ignore[union-attr]
        assert torch.allclose(flat.grad, grads, atol=1e-7)
        optimizer.step()
        ref_optimizer.step()
    for mine, theirs in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.allclose(mine, theirs, atol=1e-6)
    assert flat.views_intact()


def test_zero_grad_reattaches_after_module_zero_grad_set_to_none() -> None:
    model = small_model()
    flat = FlatParameters(model)
    model.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    flat.zero_grad()
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    nn.functional.cross_entropy(model(x), y).backward()
    assert flat.grad.abs().sum() > 0
    assert torch.equal(flat.grad, torch.cat([p.grad.reshape(-1) for p in model.parameters()]))  # type: ignore[union-attr]


def test_buffers_ride_along_after_the_parameters() -> None:
    model = small_model()
    flat = FlatParameters(model, buffers=True)
    names = flat.layout.names
    assert names[-2:] == ("1.running_mean", "1.running_var")
    assert flat.parameter.numel() == flat.layout.num_parameter_elements == flat.numel - 16
    assert flat.parameter.data_ptr() == flat.vector.data_ptr()
    model.train()
    model(torch.randn(32, 6) + 3)  # BatchNorm updates its running statistics in place
    running_mean = model[1].running_mean  # type: ignore[index]
    assert torch.equal(flat.vector[-16:-8], running_mean)
    assert running_mean.abs().sum() > 0
    # an optimizer over flat.parameter never touches the statistics
    optimizer = torch.optim.SGD([flat.parameter], lr=1.0, weight_decay=1.0)
    before = flat.vector[-16:].clone()
    optimizer.step()
    assert torch.equal(flat.vector[-16:], before)


def test_unflatten_feeds_functional_call_batched_over_models() -> None:
    """The simulator's path: n stacked flat models [n, d] -> vmap(functional_call)."""
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    flat = FlatParameters(model)
    stacked = torch.randn(5, flat.numel)
    x = torch.randn(5, 7, 6)
    views = flat.unflatten(stacked)
    assert views["0.weight"].shape == (5, 8, 6)
    assert views["0.weight"].data_ptr() == stacked.data_ptr()  # a view, not a copy
    batched = vmap(lambda p, xb: functional_call(model, p, (xb,)))(views, x)
    for i in range(5):
        flat.load_(stacked[i])
        assert torch.allclose(batched[i], model(x[i]), atol=1e-6)
    assert torch.equal(flat.layout.flatten(views), stacked)


def test_layout_is_the_same_for_every_copy_of_an_architecture() -> None:
    assert ParameterLayout.from_module(small_model()) == ParameterLayout.from_module(small_model())


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="module has no parameters"):
        FlatParameters(nn.ReLU())
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(
        ValueError, match=r"share one dtype and device; '1\.weight' is torch\.float64"
    ):
        FlatParameters(mixed)
    flat = FlatParameters(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"vector must have shape \(6,\)"):
        flat.load_(torch.zeros(5))
    with pytest.raises(ValueError, match="last dimension d=6"):
        flat.unflatten(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="missing entries"):
        flat.layout.flatten({"weight": torch.zeros(2, 2)})


def frozen_model() -> nn.Module:
    """A frozen embedding-like first layer and a trainable head (fine-tuning)."""
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model[0].requires_grad_(False)  # type: ignore[index]
    return model


def test_frozen_parameters_stay_out_of_the_optimised_view() -> None:
    """Weight decay and momentum over flat.parameter never move frozen weights."""
    model = frozen_model()
    reference = copy.deepcopy(model)
    frozen_before = model[0].weight.detach().clone()  # type: ignore[index]
    flat = FlatParameters(model)
    assert flat.layout.names == ("2.weight", "2.bias", "0.weight", "0.bias")
    assert [e.kind for e in flat.layout.entries] == ["parameter", "parameter", "frozen", "frozen"]
    trainable = 8 * 3 + 3
    assert flat.parameter.numel() == flat.grad.numel() == trainable
    assert flat.layout.num_parameter_elements == trainable and flat.numel == trainable + 6 * 8 + 8
    assert model[0].weight.grad is None  # type: ignore[index]
    optimizer = torch.optim.SGD([flat.parameter], lr=0.1, momentum=0.9, weight_decay=0.5)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    for _ in range(3):
        flat.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        ref_optimizer.step()
    assert torch.equal(model[0].weight, frozen_before)  # type: ignore[index]
    for mine, theirs in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.allclose(mine, theirs, atol=1e-6)
    assert flat.views_intact()
    # frozen weights still ride in the flat vector (shipped and mixed with the model)
    assert torch.equal(flat.unflatten(flat.vector)["0.weight"], frozen_before)
    flat.vector.mul_(0.5)
    assert torch.equal(model[0].weight, frozen_before * 0.5)  # type: ignore[index]


def test_a_fully_frozen_module_has_an_empty_optimised_view() -> None:
    model = nn.Linear(3, 2).requires_grad_(False)
    flat = FlatParameters(model)
    assert flat.parameter.numel() == 0 and flat.numel == 8
    torch.optim.SGD([flat.parameter], lr=1.0, weight_decay=1.0).step()
    assert flat.views_intact() and bool(flat.vector.ne(0).any())


@pytest.mark.parametrize("foreach", [False, True])
def test_an_optimizer_built_before_wrapping_keeps_stepping_the_module(foreach: bool) -> None:
    """The drop-in's premise: the module keeps its Parameter objects, so the user's
    optimizer (built on model.parameters() before wrapping, with momentum state already
    made) and its LR scheduler go on exactly as without wrapping, writing into the flat
    vector, and never touch the buffers it carries."""
    model = small_model()
    reference = copy.deepcopy(model)
    optimizers = [
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, foreach=foreach)
        for m in (model, reference)
    ]
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in optimizers]
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))

    def step(module: nn.Module, index: int) -> None:
        optimizers[index].zero_grad()  # set_to_none: backward makes new .grad tensors
        nn.functional.cross_entropy(module(x), y).backward()
        optimizers[index].step()
        schedulers[index].step()

    step(model, 0)
    step(reference, 1)  # momentum buffers exist before wrapping
    parameters = list(model.parameters())
    flat = FlatParameters(model, buffers=True)
    assert all(a is b for a, b in zip(model.parameters(), parameters))
    assert all(a is b for a, b in zip(optimizers[0].param_groups[0]["params"], parameters))
    before = flat.vector.clone()
    for _ in range(4):
        step(model, 0)
        step(reference, 1)
    assert flat.views_intact()
    assert not torch.equal(flat.vector[: flat.parameter.numel()], before[: flat.parameter.numel()])
    for (name, mine), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(mine.float(), theirs.float(), atol=1e-6), name
    assert optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)
    # the statistics in the vector are the module's own, moved by its forward passes only
    assert torch.equal(flat.unflatten(flat.vector)["1.running_mean"], model[1].running_mean)  # type: ignore[index]
