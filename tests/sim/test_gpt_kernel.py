"""sim.gpt_kernel: the language model's gradients for every peer from one backward pass of a
forward written over the peers equal vmap(grad)'s and each peer's own module's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from sim.batched import BatchedPeers
from workloads import build_model
from workloads.task import cross_entropy


def _factory(spec: str, length: int) -> Callable[[], nn.Module]:
    return lambda: build_model(spec, (length,), 256, seed=0)


def _tokens(n: int, batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, batch, length), generator=generator)
    y = torch.randint(0, 256, (n, batch, length), generator=generator)
    return x, y


@settings(max_examples=12, deadline=None)
@given(
    layers=st.integers(1, 2),
    heads=st.sampled_from([1, 2, 4]),
    n=st.integers(1, 4),
    batch=st.integers(1, 3),
    length=st.integers(1, 8),
    block=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_gpt_kernel_gradients_equal_vmap_grad(layers, heads, n, batch, length, block, seed) -> None:
    """float64, peers with their own weights, contexts shorter than the model's (the
    positional embedding's first rows), any block of rows."""
    factory = lambda: build_model(  # noqa: E731
        f"gpt:layers={layers},width=8,heads={heads},context=8", (length,), 256, seed=seed
    )
    fast = BatchedPeers(factory, n, init="independent", seed=seed, dtype=torch.float64)
    slow = BatchedPeers(
        factory, n, init="independent", seed=seed, dtype=torch.float64, kernel="vmap"
    )
    assert (fast.kernel, slow.kernel) == ("gpt", "vmap")
    x, y = _tokens(n, batch, length, seed)
    losses, grads = fast.gradients(x, y, block_rows=block)
    expected_losses, expected = slow.gradients(x, y)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads, expected, rtol=1e-10, atol=1e-12)


def test_each_peers_gradient_is_its_own_modules() -> None:
    """Against one module per peer and loss.backward(), in float32."""
    n, batch, length = 3, 2, 16
    factory = _factory("gpt:layers=2,width=16,heads=2", length)
    peers = BatchedPeers(factory, n, init="independent", seed=5)
    x, y = _tokens(n, batch, length, seed=1)
    out = torch.full_like(peers.params, float("nan"))
    losses, grads = peers.gradients(x, y, out=out)
    assert grads is out
    for i in range(n):
        module = peers.module(i)
        loss = cross_entropy(module(x[i]), y[i])
        loss.backward()
        expected = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        torch.testing.assert_close(losses[i], loss.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[i], expected, rtol=1e-4, atol=1e-6)


def test_the_language_model_takes_the_kernel_and_what_it_cannot_run_stays_on_vmap() -> None:
    gpt = _factory("gpt:layers=1,width=8,heads=2", 4)
    peers = BatchedPeers(gpt, 2)
    assert peers.kernel == "gpt"
    # a custom loss: the kernel only knows cross entropy
    assert BatchedPeers(gpt, 2, loss=lambda z, t: z.square().mean()).kernel == "vmap"
    with pytest.raises(ValueError, match="kernel: 'gpt' cannot run this model: a custom loss"):
        BatchedPeers(gpt, 2, loss=lambda z, t: z.square().mean(), kernel="gpt")
    mlp = lambda: build_model("mlp", (4,), 3, seed=0)  # noqa: E731
    with pytest.raises(ValueError, match=r"kernel: 'gpt' cannot run this model: .*not workloads"):
        BatchedPeers(mlp, 2, kernel="gpt")

    class Changed(nn.Module):  # a subclass may change forward: not the kernel's
        pass

    changed = build_model("gpt:layers=1,width=8,heads=2", (4,), 256, seed=0)
    changed.__class__ = type("MyGPT", (type(changed), Changed), {})
    assert BatchedPeers(changed, 2).kernel == "vmap"
    # inputs the kernel does not take go to vmap(grad), which raises for malformed ones
    x, y = _tokens(2, 1, 4, seed=0)
    assert peers.gpt is not None
    assert peers.gpt.accepts(peers.params, x, y)
    assert not peers.gpt.accepts(peers.params, x.float(), y)
    assert not peers.gpt.accepts(peers.params, x, y[:, :, :3])
    too_long = torch.zeros(2, 1, 5, dtype=torch.int64)  # beyond the context of 4
    assert not peers.gpt.accepts(peers.params, too_long, too_long)
    with pytest.raises(ValueError, match="exceed the model's context"):
        peers.gradients(too_long, too_long)
