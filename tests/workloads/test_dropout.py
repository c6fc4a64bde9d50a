"""``workloads.dropout.SeededDropout``: torch's dropouts with masks from a given source."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workloads.dropout import SeededDropout, has_dropout


def source(seed: int) -> SeededDropout:
    generator = torch.Generator().manual_seed(seed)
    return SeededDropout(lambda shape, device: torch.rand(list(shape), generator=generator))


def test_the_source_decides_the_mask_not_the_global_generator() -> None:
    x = torch.ones(64, 100)
    layer = nn.Dropout(0.4)
    with source(1):
        torch.manual_seed(1)
        first = layer(x)
    with source(1):
        torch.manual_seed(2)
        again = layer(x)
    with source(2):
        other = layer(x)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    kept = first != 0
    assert abs(kept.double().mean().item() - 0.6) < 0.02
    assert torch.allclose(first[kept], torch.full_like(first[kept], 1 / 0.6))


@pytest.mark.parametrize(
    ("layer", "shape", "channel"),
    [
        (nn.Dropout1d(0.5), (8, 16, 5), (8, 16, 1)),
        (nn.Dropout1d(0.5), (16, 5), (16, 1)),
        (nn.Dropout2d(0.5), (8, 16, 4, 4), (8, 16, 1, 1)),
        (nn.Dropout3d(0.5), (8, 16, 2, 2, 2), (8, 16, 1, 1, 1)),
        (nn.Dropout3d(0.5), (16, 2, 2, 2), (16, 1, 1, 1)),
    ],
)
def test_channel_dropouts_drop_whole_channels(
    layer: nn.Module, shape: tuple[int, ...], channel: tuple[int, ...]
) -> None:
    x = torch.ones(shape)
    with source(0):
        out = layer(x)
    assert out.shape == x.shape
    # every channel (the leading dimensions of ``channel``) is all zeros or all 2s
    flat = out.reshape(*channel[: channel.index(1)], -1)
    assert ((flat == 0).all(dim=-1) | (flat == 2).all(dim=-1)).all()
    assert (flat == 0).any() and (flat == 2).any()


def test_evaluation_and_p_zero_leave_the_input_and_bad_p_is_refused() -> None:
    x = torch.randn(4, 10)
    with source(0):
        assert torch.equal(nn.Dropout(0.5).eval()(x), x)
        assert torch.equal(nn.functional.dropout(x, 0.0), x)
        assert torch.equal(nn.functional.dropout(x, 1.0), torch.zeros_like(x))
        with pytest.raises(ValueError, match=r"between 0 and 1, but got 1\.5"):
            nn.functional.dropout(x, 1.5)
        kept = x.clone()
        out = nn.Dropout(0.5, inplace=True)(kept)
    assert torch.equal(kept, x)  # the input is left as it was; the result is masked
    assert not torch.equal(out, x)


def test_gradients_flow_through_the_kept_elements() -> None:
    x = torch.ones(4, 50, requires_grad=True)
    with source(3):
        out = nn.functional.dropout(x, 0.5)
    out.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, out.detach())


def test_has_dropout_sees_the_dropout_modules_only() -> None:
    assert has_dropout(nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout2d(0.1))))
    assert not has_dropout(nn.Sequential(nn.Linear(2, 2), nn.AlphaDropout(0.1), nn.RReLU()))
