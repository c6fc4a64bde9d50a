"""Buffers and masks: a model with a ``-inf`` causal mask and constant counters joins a swarm
without the user knowing ``average_buffers``; a refused payload names its tensor."""

from __future__ import annotations

import math
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import torch
from torch import nn

from gossip.flat import FlatParameters, averageable
from peer.app.model_average import average_models
from peer.node.config import PeerConfig
from peer.node.model_file import load_model, save_model
from peer.node.peer import JoinError, Peer
from peer.node.recipe import ModelRecipe
from peer.protocol.codecs import CompressorCodec, DenseCodec
from peer.protocol.errors import NonFiniteValues
from peer.protocol.wire import ModelSpec
from workloads import cross_entropy

SECRET = b"buffers-test-swarm-secret-0123456789"
VOCAB, CONTEXT, WIDTH = 7, 5, 8


class TinyCausalLM(nn.Module):
    """One causal self-attention layer: a ``-inf`` mask buffer (PyTorch's own
    ``generate_square_subsequent_mask``), an integer counter buffer that never changes, and
    BatchNorm-free finite float buffer (a fixed temperature) that is averaged."""

    def __init__(self, input_shape: tuple[int, ...] = (CONTEXT,), num_classes: int = VOCAB):
        super().__init__()
        self.embed = nn.Embedding(num_classes, WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, num_classes)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(input_shape[0]))
        self.register_buffer("version", torch.tensor(3, dtype=torch.int64))
        self.register_buffer("temperature", torch.tensor(math.sqrt(WIDTH)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / self.temperature + self.mask
        return self.out(h + scores.softmax(dim=-1) @ v)  # type: ignore[no-any-return]


def batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, VOCAB, (4, CONTEXT + 1), generator=g)
    return [(stream[:, :-1], stream[:, 1:])] * 2


def lm_peer(peer_id: str, seed: int, **config: object) -> Peer:
    torch.manual_seed(seed)
    return Peer(
        TinyCausalLM(),
        lambda params: torch.optim.SGD(params, lr=0.05),
        cross_entropy,
        batches(seed),
        PeerConfig(peer_id=peer_id, secret=SECRET, request_timeout_s=5.0, **config),  # type: ignore[arg-type]
    )


def test_only_finite_float_buffers_are_averaged() -> None:
    model = TinyCausalLM()
    assert not averageable(model.mask) and not averageable(model.version)
    assert averageable(model.temperature)
    names = FlatParameters(model, buffers=True).layout.names
    assert "temperature" in names and "mask" not in names and "version" not in names
    assert torch.isinf(model.mask).sum() == CONTEXT * (CONTEXT - 1) // 2  # still the mask


async def test_a_causal_mask_model_joins_a_two_peer_swarm_and_exchanges() -> None:
    """b joins a and copies its model (the state fetch that refused the mask before), then
    both train and gossip; each keeps its mask and counter, and nothing warns."""
    async with AsyncExitStack() as stack:
        a = lm_peer("a", seed=0)
        await a.start()
        stack.push_async_callback(a.stop)
        b = lm_peer("b", seed=1, join=(a.address,))
        await b.start()  # before: JoinError "payload field 'data' contains NaN or infinite"
        stack.push_async_callback(b.stop)
        assert torch.equal(a.flat.vector, b.flat.vector)  # the fetched model
        assert not a.trainer.local_buffers  # masks and counters are not "left out" buffers
        await a.run(steps=3)
        await b.run(steps=3)
        for peer in (a, b):
            assert peer.status()["exchanges"]["ok"] >= 1
            assert peer.status()["exchanges"]["failed"] == 0
            assert torch.isfinite(peer.flat.vector).all()
            assert torch.equal(peer.model.mask, TinyCausalLM().mask)
            assert int(peer.model.version) == 3


async def test_a_refused_join_names_the_tensor_that_is_not_finite() -> None:
    async with AsyncExitStack() as stack:
        a = lm_peer("a", seed=0)
        await a.start()
        stack.push_async_callback(a.stop)
        with torch.no_grad():
            a.model.qkv.bias[4] = float("nan")
        b = lm_peer("b", seed=1, join=(a.address,), join_timeout_s=0.5)
        with pytest.raises(JoinError) as info:
            await b.start()
        await b.stop()
    assert "tensor 'qkv.bias' (a parameter), element 4" in str(info.value)


@pytest.mark.parametrize("codec", ["none", "fp16", "bf16", "topk:ratio=0.5"])
def test_a_non_finite_payload_names_its_tensor(codec: str) -> None:
    flat = FlatParameters(TinyCausalLM(), buffers=True)
    layout = flat.layout
    entry = next(e for e in layout.entries if e.name == "temperature")
    vector = flat.vector.detach().clone()
    vector[entry.offset] = float("-inf")
    sender = DenseCodec() if codec == "none" else CompressorCodec(codec)
    payload = sender.encode(vector)  # top-k sends the infinity: the largest magnitude
    receiver = CompressorCodec(codec.partition(":")[0])
    with pytest.raises(NonFiniteValues) as info:
        receiver.decode(payload, ModelSpec.of(flat.vector, layout))
    message = str(info.value)
    if not codec.startswith("topk"):  # a sparse value's position is not its coordinate
        assert f"(first at element {entry.offset})" in message
    assert message.endswith("at tensor 'temperature' (a buffer), element 0")
    # without a layout (a receiver that does not know the model) the coordinate is named
    with pytest.raises(NonFiniteValues, match=f"at coordinate {entry.offset}$"):
        receiver.decode(payload, ModelSpec(numel=layout.numel))


def test_a_non_finite_quantized_block_names_the_tensor_where_it_starts() -> None:
    flat = FlatParameters(TinyCausalLM(), buffers=True)
    vector = flat.vector.detach().clone()
    vector[100] = float("inf")  # qkv.weight: its block's scale becomes infinite
    codec = CompressorCodec("qsgd:bits=4,block=64")
    with pytest.raises(NonFiniteValues) as info:
        codec.decode(codec.encode(vector), ModelSpec.of(flat.vector, flat.layout))
    message = str(info.value)
    assert "payload field 'scale'" in message and "(first at element 1)" in message
    start = 64 - flat.layout.entries[1].offset  # block 1 starts at coordinate 64
    assert message.endswith(f"at tensor 'qkv.weight' (a parameter), element {start}")


def test_the_average_keeps_a_mask_and_averages_the_rest(tmp_path: Path) -> None:
    recipe = ModelRecipe("tiny-causal-lm", (CONTEXT,), VOCAB)
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(TinyCausalLM())
        save_model(tmp_path / f"peer-{seed}.safetensors", models[-1], recipe, peer_id=f"p{seed}")
    out = average_models([tmp_path], tmp_path / "swarm.safetensors", factory=TinyCausalLM)
    averaged = load_model(out, factory=TinyCausalLM)
    assert torch.equal(averaged.mask, models[0].mask)  # -inf kept, not NaN
    expected = (models[0].out.weight.double() + models[1].out.weight.double()) / 2
    assert torch.equal(averaged.out.weight, expected.float())
    assert int(averaged.version) == 3


def test_the_simulator_keeps_the_mask_too() -> None:
    """The simulator trains only the parameters and keeps every buffer a constant of the
    template: the same model gives the same loss there, and a finite gradient."""
    from sim.batched import BatchedPeers

    torch.manual_seed(0)
    model = TinyCausalLM()
    x, y = batches(0)[0]
    peers = BatchedPeers(model, n=2, loss=cross_entropy)
    assert "mask" not in peers.layout.names
    loss, gradient = peers.gradients(x.expand(2, -1, -1), y.expand(2, -1, -1))
    torch.testing.assert_close(loss, cross_entropy(model(x), y).detach().expand(2))
    assert torch.isfinite(gradient).all()
