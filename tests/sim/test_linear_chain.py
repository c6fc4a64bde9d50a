"""The hand-derived linear-chain kernels equal vmap(grad) and the per-peer reference."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from gossip.flat import ParameterLayout
from sim import linear_chain
from sim.batched import BatchedPeers
from sim.linear_chain import LinearChain, NotALinearChainError
from sim.optimizers import BlockedOptimizer, build_optimizer
from sim.reference import ReferencePeers
from workloads import build_model, layer_chain

ACTIVATION_FACTORIES = {
    "relu": nn.ReLU,
    "leaky": lambda: nn.LeakyReLU(0.1),
    "leaky-negative": lambda: nn.LeakyReLU(-0.2),
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
    "gelu-tanh": lambda: nn.GELU(approximate="tanh"),
    "silu": nn.SiLU,
    "identity": nn.Identity,
}


def chain_factory(widths: list[int], activations: list[str], biases: list[bool], nest: bool):
    def build() -> nn.Module:
        layers: list[nn.Module] = [nn.Flatten()]
        for index, (width_in, width_out) in enumerate(itertools.pairwise(widths)):
            layers.append(nn.Linear(width_in, width_out, bias=biases[index]))
            if index < len(widths) - 2:
                layers.append(ACTIVATION_FACTORIES[activations[index]]())
        if nest and len(layers) > 3:  # a Sequential inside the Sequential is unrolled
            return nn.Sequential(layers[0], nn.Sequential(*layers[1:3]), *layers[3:])
        return nn.Sequential(*layers)

    return build


@st.composite
def chains(draw: st.DrawFn):
    depth = draw(st.integers(1, 4))
    widths = [draw(st.integers(1, 9)) for _ in range(depth)] + [draw(st.integers(2, 5))]
    activations = [draw(st.sampled_from(sorted(ACTIVATION_FACTORIES))) for _ in range(depth)]
    biases = [draw(st.booleans()) for _ in range(depth)]
    return widths, activations, biases, draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(
    spec=chains(),
    n=st.integers(1, 5),
    batch=st.integers(1, 6),
    block=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    scratch=st.booleans(),
)
def test_linear_chain_gradients_equal_vmap_grad(spec, n, batch, block, seed, scratch) -> None:
    """Both ways of writing a weight gradient (contiguous scratch + copy for small layers,
    straight into the strided view for large ones) against vmap(grad)."""
    widths, activations, biases, nest = spec
    with mock.patch.object(linear_chain, "SCRATCH_MAX", 10**9 if scratch else 0):
        _check_against_vmap(widths, activations, biases, nest, n, batch, block, seed)


def _check_against_vmap(widths, activations, biases, nest, n, batch, block, seed) -> None:
    factory = chain_factory(widths, activations, biases, nest)
    fast = BatchedPeers(factory, n, init="independent", seed=seed, dtype=torch.float64)
    slow = BatchedPeers(
        factory, n, init="independent", seed=seed, dtype=torch.float64, kernel="vmap"
    )
    assert (fast.kernel, slow.kernel) == ("linear", "vmap")
    generator = torch.Generator().manual_seed(seed)
    # two trailing input dims: the leading Flatten folds them into widths[0] features
    x = torch.randn(n, batch, 1, widths[0], generator=generator, dtype=torch.float64)
    y = torch.randint(0, widths[-1], (n, batch), generator=generator)
    losses, grads = fast.gradients(x, y, block_rows=block)
    expected_losses, expected = slow.gradients(x, y)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads, expected, rtol=1e-10, atol=1e-12)


def test_workload_models_take_the_chain_and_others_stay_on_vmap() -> None:
    shape, classes = (40,), 10
    for name in ("mlp", "mlp-100k", "logistic"):
        model = lambda name=name: build_model(name, shape, classes, seed=0)  # noqa: E731
        assert BatchedPeers(model, 2).kernel == "linear", name
    cnn = lambda: build_model("cnn1d", shape, classes, seed=0)  # noqa: E731
    assert BatchedPeers(cnn, 2).kernel == "vmap"
    with pytest.raises(ValueError, match=r"kernel: 'linear' cannot run this model: .*CNN1d"):
        BatchedPeers(cnn, 2, kernel="linear")
    mlp = lambda: build_model("mlp", shape, classes, seed=0)  # noqa: E731
    # a custom loss: the kernels only know cross entropy
    assert BatchedPeers(mlp, 2, loss=nn.functional.multi_margin_loss).kernel == "vmap"
    with pytest.raises(ValueError, match="custom loss"):
        BatchedPeers(mlp, 2, loss=nn.functional.multi_margin_loss, kernel="linear")
    with pytest.raises(ValueError, match=r"kernel: got .*; allowed: auto, vmap, linear, gpt"):
        BatchedPeers(mlp, 2, kernel="fast")


def test_what_is_not_a_plain_chain_is_refused_with_the_reason() -> None:
    class Residual(nn.Sequential):  # a subclass may change forward: not a known chain
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + x

    hooked = nn.Sequential(nn.Linear(3, 3))
    hooked[0].register_forward_hook(lambda module, args, output: output * 2)
    tied = nn.Linear(3, 3)
    cases = {
        "is not an nn.Sequential": Residual(nn.Linear(3, 3)),
        "is not an nn.Sequential, workloads MLP": hooked,
        "Dropout is not supported": nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0)),
        "only Flatten": nn.Sequential(nn.Flatten(0), nn.Linear(3, 3)),
        "is not an nn.Sequential, workloads MLP or": nn.Sequential(tied, tied),
        "has no Linear layer": nn.Sequential(nn.Flatten(), nn.ReLU()),
    }
    for reason, model in cases.items():
        with pytest.raises(NotALinearChainError, match=reason):
            LinearChain.from_module(model, ParameterLayout.from_module(model))
    assert layer_chain(hooked) is None


def test_inputs_the_chain_does_not_take_go_to_vmap_with_its_errors() -> None:
    model = lambda: nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))  # noqa: E731
    fast = BatchedPeers(model, 3, init="independent", seed=1)
    slow = BatchedPeers(model, 3, init="independent", seed=1, kernel="vmap")
    chain = fast.chain
    assert chain is not None
    x = torch.randn(3, 4, 4)
    assert chain.accepts(fast.params, x, torch.randint(0, 3, (3, 4)))
    assert not chain.accepts(fast.params, x, torch.full((3, 4), 3))  # class out of range
    assert not chain.accepts(fast.params, x, torch.full((3, 4), -100))  # ignore_index
    assert not chain.accepts(fast.params, x.double(), torch.zeros(3, 4, dtype=torch.long))
    assert not chain.accepts(fast.params, x, torch.zeros(3, 4))  # soft labels
    # a class index out of range raises exactly what vmap(grad(cross_entropy)) raises
    bad = torch.full((3, 4), 7)
    with pytest.raises(Exception) as expected:
        slow.gradients(x, bad)
    with pytest.raises(type(expected.value)):
        fast.gradients(x, bad)


def test_training_with_the_chain_equals_the_per_peer_reference() -> None:
    n, steps = 6, 5
    model = lambda: build_model("mlp", (3, 4), 5, seed=2)  # noqa: E731
    peers = BatchedPeers(model, n, init="independent", seed=2)
    assert peers.kernel == "linear"

    def sgd(params: torch.Tensor) -> torch.optim.Optimizer:
        return build_optimizer(params, "sgd", lr=0.1, momentum=0.9)

    trainer = BlockedOptimizer(peers, peers.params, sgd, block_rows=4)
    reference = ReferencePeers(
        peers.template,
        n,
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        initial=peers.params,
    )
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(n, 7, 3, 4, generator=generator)
        y = torch.randint(0, 5, (n, 7), generator=generator)
        losses = trainer.step(x, y)
        torch.testing.assert_close(losses, reference.step(x, y), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(peers.params, reference.flat(), atol=1e-5, rtol=1e-5)


def test_reused_workspaces_keep_no_state_between_calls() -> None:
    """The intermediates are reused per block shape: a call must not see the last one's."""
    model = lambda: build_model("mlp", (6,), 4, seed=0)  # noqa: E731
    fast = BatchedPeers(model, 5, init="independent", seed=0)
    slow = BatchedPeers(model, 5, init="independent", seed=0, kernel="vmap")
    generator = torch.Generator().manual_seed(1)
    for batch in (3, 8, 3, 1, 8):
        x = torch.randn(5, batch, 6, generator=generator)
        y = torch.randint(0, 4, (5, batch), generator=generator)
        out = torch.full_like(fast.params, float("nan"))  # every coordinate must be written
        losses, grads = fast.gradients(x, y, block_rows=2, out=out)
        expected_losses, expected = slow.gradients(x, y)
        assert grads is out
        torch.testing.assert_close(losses, expected_losses)
        torch.testing.assert_close(grads, expected)
    assert fast.chain is not None
    shared = torch.randn(9, 6, generator=generator)
    logits = fast.chain.forward(fast.params, shared.expand(5, 9, 6))
    torch.testing.assert_close(logits, slow.logits(shared))
