"""The batched engine equals n independent per-peer models and optimizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from consensus.mean import WeightedMean
from sim.batched import BatchedPeers, ModelNotBatchableError
from sim.mixing import gather_mix, gather_rows
from sim.optimizers import BlockedOptimizer, build_optimizer, masked_step
from sim.reference import ReferencePeers
from workloads.models import NotBatchableError


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def data(n: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, batch, 6, generator=g), torch.randint(0, 3, (n, batch), generator=g)


OPTIMIZERS = [
    ("sgd", {"lr": 0.1}),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("adam", {"lr": 0.01, "weight_decay": 1e-4}),
]


@pytest.mark.parametrize(("name", "options"), OPTIMIZERS)
def test_one_optimizer_over_stacked_rows_equals_n_per_peer_optimizers(
    name: str, options: dict
) -> None:
    n = 5
    peers = BatchedPeers(mlp, n, init="independent", seed=3)
    optimizer = build_optimizer(peers.params, name, **options)
    torch_class = torch.optim.SGD if name == "sgd" else torch.optim.Adam
    reference = ReferencePeers(
        peers.template, n, lambda p: torch_class(p, **options), initial=peers.params
    )
    assert torch.equal(reference.flat(), peers.params)
    for step in range(6):
        x, y = data(n, 8, seed=step)
        losses, grads = peers.gradients(x, y)
        peers.params.grad = grads
        optimizer.step()
        reference_losses = reference.step(x, y)
        torch.testing.assert_close(losses, reference_losses, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(peers.params, reference.flat(), atol=1e-5, rtol=1e-5)
    # the peers really diverged from each other (independent init, different batches)
    assert (peers.params[0] - peers.params[1]).abs().max() > 1e-2


def test_same_init_gives_identical_rows_and_seed_is_reproducible() -> None:
    a = BatchedPeers(mlp, 4, seed=7)
    b = BatchedPeers(mlp, 4, seed=7)
    c = BatchedPeers(mlp, 4, seed=8)
    assert torch.equal(a.params, b.params)
    assert torch.equal(a.params[0], a.params[3])
    assert not torch.equal(a.params, c.params)
    independent = BatchedPeers(mlp, 4, init="independent", seed=7)
    assert torch.equal(independent.params[0], a.params[0])
    assert not torch.equal(independent.params[0], independent.params[1])


def test_masked_step_leaves_idle_rows_and_their_state_untouched() -> None:
    n = 4
    peers = BatchedPeers(mlp, n, init="independent", seed=1)
    optimizer = build_optimizer(peers.params, "sgd", lr=0.1, momentum=0.9)
    active = torch.tensor([True, False, True, True])
    x, y = data(n, 8, seed=0)
    _, peers.params.grad = peers.gradients(x, y)
    optimizer.step()  # creates momentum for every row
    before = peers.params.clone()
    momentum_before = optimizer.state[peers.params]["momentum_buffer"].clone()
    x, y = data(n, 8, seed=1)
    _, peers.params.grad = peers.gradients(x, y)
    masked_step(optimizer, peers.params, active)
    after = peers.params
    assert torch.equal(after[1], before[1])
    assert torch.equal(optimizer.state[peers.params]["momentum_buffer"][1], momentum_before[1])
    assert not torch.equal(after[0], before[0])


def test_evaluate_matches_each_module_on_its_own() -> None:
    peers = BatchedPeers(mlp, 3, init="independent", seed=2)
    x, y = data(1, 50, seed=9)
    accuracy, loss = peers.evaluate(x[0], y[0], batch_size=16)
    for i in range(3):
        model = peers.module(i)
        with torch.no_grad():
            out = model(x[0])
        assert accuracy[i].item() == pytest.approx((out.argmax(1) == y[0]).double().mean().item())
        assert loss[i].item() == pytest.approx(
            nn.functional.cross_entropy(out, y[0]).item(), rel=1e-5
        )


def test_batchnorm_in_training_mode_is_refused_up_front() -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    with pytest.raises(NotBatchableError, match="BatchNorm1d"):
        BatchedPeers(model, 2)


def dropout_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))


def test_dropout_draws_a_mask_per_peer_in_training_and_none_in_evaluation() -> None:
    n = 4
    x, y = data(1, 16, seed=0)
    xs, ys = x.expand(n, -1, -1), y.expand(n, -1)
    torch.manual_seed(0)
    peers = BatchedPeers(dropout_mlp, n, seed=5)  # init "same": every row is one model
    losses, grads = peers.gradients(xs, ys)
    # same weights, same batch: only the dropout masks differ between the peers' gradients
    assert not torch.allclose(grads[0], grads[1])
    assert len(set(losses.tolist())) > 1
    # evaluation has dropout off: every peer's outputs equal the module's in eval mode
    reference = dropout_mlp().eval()
    expected = torch.func.functional_call(reference, peers.layout.unflatten(peers.params[0]), x[0])
    logits = peers.logits(x[0])
    for row in range(n):
        assert torch.allclose(logits[row], expected, atol=1e-6)
    assert peers.template.training  # back in training mode for the next gradients
    # the same seed draws the same masks, whatever state torch's global generator is in
    torch.manual_seed(1)
    again = BatchedPeers(dropout_mlp, n, seed=5)
    assert torch.equal(again.gradients(xs, ys)[1], grads)


class DataDependent(nn.Module):
    """Python control flow on a tensor's value: fine eagerly, impossible under vmap."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        return out if out.sum().item() > 0 else -out


def test_a_model_that_fails_under_vmap_raises_a_clear_error() -> None:
    model = DataDependent()
    x, y = data(2, 8, seed=0)
    model(x[0])  # runs on its own
    peers = BatchedPeers(model, 2)
    with pytest.raises(ModelNotBatchableError, match=r"vmap\(grad\(loss\)\).*item\(\)"):
        peers.gradients(x, y)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"n": 0}, "n:"), ({"n": 2, "init": "random"}, "init:")],
)
def test_bad_arguments_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BatchedPeers(mlp, **kwargs)


def test_bad_optimizer_arguments_name_the_field() -> None:
    params = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="lr:"):
        build_optimizer(params, lr=0)
    with pytest.raises(ValueError, match=r"optimizer: got .*; allowed: sgd, adam"):
        build_optimizer(params, "lbfgs")
    with pytest.raises(ValueError, match="momentum:"):
        build_optimizer(params, momentum=1.5)


class _Table:
    """A hand-written neighbour table (ring of 4, Metropolis weights 1/3)."""

    index = np.array([[1, 3], [0, 2], [1, 3], [2, 0]])
    weight = np.full((4, 2), 1 / 3)
    mask = np.ones((4, 2), dtype=bool)


def test_gather_mix_equals_the_sparse_matrix_product_and_chunks_agree() -> None:
    values = torch.randn(4, 5, dtype=torch.float64)
    w = np.zeros((4, 4))
    for i in range(4):
        w[i, _Table.index[i]] = 1 / 3
        w[i, i] = 1 / 3
    expected = torch.from_numpy(w) @ values
    torch.testing.assert_close(gather_mix(values, _Table, WeightedMean()), expected)
    torch.testing.assert_close(gather_mix(values, _Table, WeightedMean(), chunk_rows=3), expected)


def test_gather_mix_dead_sender_weight_folds_into_self_and_dead_receiver_keeps_its_own() -> None:
    values = torch.randn(4, 5, dtype=torch.float64)
    alive = torch.tensor([True, False, True, True])
    mixed = gather_mix(values, _Table, WeightedMean(), alive=alive)
    torch.testing.assert_close(mixed[1], values[1])
    # node 0 hears only from 3: (2/3) x0 + (1/3) x3
    torch.testing.assert_close(mixed[0], values[0] * 2 / 3 + values[3] / 3)


def test_gradients_in_blocks_of_peers_equal_one_call() -> None:
    peers = BatchedPeers(mlp, 7, init="independent", seed=4)
    x, y = data(7, 8, seed=3)
    losses, grads = peers.gradients(x, y)
    block_losses, block_grads = peers.gradients(x, y, block_rows=3)
    torch.testing.assert_close(block_losses, losses)
    torch.testing.assert_close(block_grads, grads)
    with pytest.raises(ValueError, match="x, y: leading dimension"):
        peers.gradients(x[:3], y[:3])


def test_stateful_rules_are_never_split_into_row_chunks() -> None:
    import consensus
    from sim.mixing import keeps_state

    assert not keeps_state(consensus.build("mean"))
    assert not keeps_state(consensus.build("trimmed-mean:b=1"))
    stateful = consensus.build("centered-clipping:tau=0.5")
    assert keeps_state(stateful)
    values = torch.randn(4, 5, dtype=torch.float64)
    whole = gather_mix(values, _Table, stateful)
    stateful.reset()
    chunked = gather_mix(values, _Table, stateful, chunk_rows=1)
    torch.testing.assert_close(chunked, whole)


@pytest.mark.parametrize(("name", "options"), OPTIMIZERS)
def test_fused_gradient_and_step_per_block_equals_the_unfused_path(name: str, options) -> None:
    """Blocks of 3 rows (the last block has 1): gradient + step per block, with its own
    optimizer over a view of the rows, is bit for bit one optimizer over all rows, also
    when some peers are idle (their rows and optimizer state untouched)."""
    n = 7
    fused = BatchedPeers(mlp, n, init="independent", seed=2)
    plain = BatchedPeers(mlp, n, init="independent", seed=2)
    storage = fused.params
    trainer = BlockedOptimizer(
        fused, fused.params, lambda p: build_optimizer(p, name, **options), block_rows=3
    )
    optimizer = build_optimizer(plain.params, name, **options)
    idle = torch.tensor([True, True, False, True, True, True, False])
    for step in range(4):
        x, y = data(n, 5, seed=10 + step)
        active = idle if step in (0, 2) else None
        losses = trainer.step(x, y, active)
        expected, plain.params.grad = plain.gradients(x, y)
        masked_step(optimizer, plain.params, active)
        assert torch.equal(fused.params, plain.params), f"step {step}"
        if active is None:
            assert torch.equal(losses, expected)
        else:
            assert torch.equal(losses[active], expected[active])
            assert bool(losses[~active].isnan().all())
    assert fused.params.data_ptr() == storage.data_ptr()  # trained in place, no copy
    _, grads = plain.gradients(*data(n, 5, seed=99))
    trainer.step_with(grads, idle)
    masked_step_rows = plain.params.clone()
    plain.params.grad = grads
    masked_step(optimizer, plain.params, idle)
    assert torch.equal(fused.params, plain.params)
    assert not torch.equal(masked_step_rows, plain.params)
    with pytest.raises(ValueError, match="block_rows"):
        BlockedOptimizer(fused, fused.params, torch.optim.SGD, block_rows=0)
    with pytest.raises(ValueError, match="grads"):
        trainer.step_with(grads[:3])


def test_gradients_and_gather_mix_write_into_a_reused_buffer() -> None:
    peers = BatchedPeers(mlp, 7, init="independent", seed=4)
    x, y = data(7, 8, seed=3)
    _, grads = peers.gradients(x, y)
    for block_rows in (None, 3):
        buffer = torch.full_like(peers.params, float("nan"))
        _, written = peers.gradients(x, y, block_rows=block_rows, out=buffer)
        assert written is buffer
        assert torch.equal(buffer, grads)
    with pytest.raises(ValueError, match="out: must be a contiguous"):
        peers.gradients(x, y, out=torch.empty(7, peers.dim + 1))
    values = torch.randn(4, 5)
    expected = gather_mix(values, _Table, WeightedMean())
    out = torch.full_like(values, float("nan"))
    assert gather_mix(values, _Table, WeightedMean(), chunk_rows=3, out=out) is out
    torch.testing.assert_close(out, expected)
    whole = torch.empty_like(values)
    assert gather_mix(values, _Table, WeightedMean(), out=whole) is whole
    torch.testing.assert_close(whole, expected)
    with pytest.raises(ValueError, match="out: must be a separate buffer"):
        gather_mix(values, _Table, WeightedMean(), chunk_rows=3, out=values)


def test_gather_rows_equals_advanced_indexing_and_reuses_a_buffer() -> None:
    values = torch.randn(7, 5)
    index = torch.tensor([[1, 2], [6, 0], [3, 3]])
    expected = values[index]
    assert torch.equal(gather_rows(values, index), expected)
    buffer = torch.empty(10, 5)
    rows = gather_rows(values, index, out=buffer)
    assert torch.equal(rows, expected) and rows.data_ptr() == buffer.data_ptr()
    with pytest.raises(ValueError, match="out: needs at least 6 rows"):
        gather_rows(values, index, out=torch.empty(4, 5))


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_optimizer_is_fused_where_torch_has_the_kernel_and_matches_foreach(name: str) -> None:
    """One pass per step (``fused=True``) where this torch supports it on the CPU; the same
    updates as the default implementation to float32 rounding."""
    start = torch.randn(6, 40)
    fused_params, plain_params = start.clone(), start.clone()
    fused = build_optimizer(fused_params, name, lr=0.05, momentum=0.9 if name == "sgd" else 0.0)
    kind = torch.optim.SGD if name == "sgd" else torch.optim.Adam
    options = {"lr": 0.05, "momentum": 0.9} if name == "sgd" else {"lr": 0.05}
    plain = kind([plain_params], foreach=False, **options)
    try:
        kind([torch.zeros(2, requires_grad=True)], fused=True, lr=0.1)
        supported = True
    except RuntimeError:
        supported = False
    assert bool(fused.defaults.get("fused")) == supported
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        grad = torch.randn(6, 40, generator=gen)
        fused_params.grad, plain_params.grad = grad.clone(), grad.clone()
        fused.step()
        plain.step()
    torch.testing.assert_close(fused_params, plain_params, rtol=1e-5, atol=1e-6)


def _random_table(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (n, k), generator=g)  # repeats and self-loops included
    weight = torch.rand(n, k, generator=g, dtype=torch.float64) / k
    mask = torch.rand(n, k, generator=g) < 0.7
    return index, weight, mask


@pytest.mark.parametrize("seed", range(4))
def test_sparse_mix_equals_weighted_mean_of_the_gathered_rows(seed: int) -> None:
    from consensus.mean import weighted_mean
    from sim.mixing import sparse_mix

    n, k, d = 9, 3, 7
    index, weight, mask = _random_table(n, k, seed)
    values = torch.randn(n, d, dtype=torch.float64)
    alive = torch.rand(n, generator=torch.Generator().manual_seed(seed)) < 0.8
    heard = mask & alive[index]
    expected = weighted_mean(values, gather_rows(values, index), weight, heard)
    expected = torch.where(alive.unsqueeze(1), expected, values)  # a dead receiver keeps x
    out = torch.full_like(values, float("nan"))  # beta = 0: nothing of out is read
    mixed = sparse_mix(values, index, weight, heard, alive=alive, out=out)
    assert mixed is out
    torch.testing.assert_close(mixed, expected)


def test_gather_mix_of_a_non_finite_vector_keeps_the_rule_semantics() -> None:
    """A NaN cannot be masked inside the sparse product: gather_mix then runs the exact rule,
    which refuses a non-finite own vector instead of spreading NaN to the neighbours."""
    values = torch.randn(4, 5, dtype=torch.float64)
    values[1] = float("nan")
    with pytest.raises(ValueError, match="own contains NaN"):
        gather_mix(values, _Table, WeightedMean())
    # what a neighbour sent (not its own vector) non-finite: masked, its weight to the self
    sent = values.clone()
    values[1] = 0.0
    mixed = gather_mix(values, _Table, WeightedMean(), sent=sent)
    torch.testing.assert_close(mixed[2], values[2] * 2 / 3 + values[3] / 3)


def test_sparse_mix_in_row_blocks_equals_one_product_and_finds_a_late_nan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The product runs block by block of receivers (here one per block): the same result as
    one product over all rows, and a NaN or Inf in the last block still falls back."""
    import sim.mixing as mixing

    n, k, d = 6, 2, 1000
    index, weight, mask = _random_table(n, k, 7)
    values = torch.randn(n, d, dtype=torch.float64)
    whole = torch.addmm(
        torch.zeros_like(values),
        mixing.sparse_gossip_matrix(index, weight, mask),
        values,
        beta=0,
    )
    monkeypatch.setattr(mixing, "MIX_CHUNK_BYTES", 1)  # one receiver per block
    mixed = mixing.sparse_mix(values, index, weight, mask)
    assert mixed is not None
    torch.testing.assert_close(mixed, whole, rtol=0, atol=0)
    for bad in (float("nan"), float("inf")):
        poisoned = values.clone()
        poisoned[n - 1, 900] = bad  # the last receiver's own vector (self weight > 0)
        assert mixing.sparse_mix(poisoned, index, weight, mask) is None
    # finite values whose chunk sums overflow: the exact check clears them
    huge = torch.full((n, d), 1e308, dtype=torch.float64)
    mixed = mixing.sparse_mix(huge, index, weight, torch.zeros_like(mask))
    assert mixed is not None and torch.equal(mixed, huge)


def test_cached_gossip_matrix_is_reused_only_for_the_same_table() -> None:
    from sim.mixing import cached_gossip_matrix, sparse_gossip_matrix

    index, weight, mask = _random_table(8, 3, 11)
    first = cached_gossip_matrix(index, weight, mask)
    assert cached_gossip_matrix(index.clone(), weight.clone(), mask.clone()) is first
    torch.testing.assert_close(
        first.to_dense(), sparse_gossip_matrix(index, weight, mask).to_dense().float()
    )
    lost = mask.clone()
    lost[0, 0] = not bool(lost[0, 0])
    changed = [
        cached_gossip_matrix(index, weight, lost),
        cached_gossip_matrix(index, weight * 0.5, mask),
        cached_gossip_matrix(index, weight, mask, alive=torch.arange(8) != 2),
        cached_gossip_matrix(index, weight, mask, dtype=torch.float64),
    ]
    for matrix in changed:
        assert matrix is not first
    torch.testing.assert_close(
        changed[0].to_dense(), sparse_gossip_matrix(index, weight, lost).to_dense().float()
    )
    assert changed[3].dtype == torch.float64


def test_gather_mix_of_a_dtype_the_sparse_product_lacks_uses_the_gather() -> None:
    values = torch.randn(4, 5).half()
    expected = gather_mix(values.double(), _Table, WeightedMean())
    torch.testing.assert_close(
        gather_mix(values, _Table, WeightedMean()).double(), expected, atol=2e-3, rtol=2e-3
    )


def test_blocked_optimizer_swap_makes_the_leaf_hold_new_values_without_a_copy() -> None:
    peers = BatchedPeers(mlp, 5, init="independent", seed=0)
    params = peers.params

    def sgd(leaf: torch.Tensor) -> torch.optim.Optimizer:
        return build_optimizer(leaf, "sgd", lr=0.1, momentum=0.9)

    trainer = BlockedOptimizer(peers, params, sgd, block_rows=2)
    twin = BatchedPeers(mlp, 5, init="independent", seed=0)
    twin_trainer = BlockedOptimizer(twin, twin.params, sgd, block_rows=2)
    for step in range(3):
        x, y = data(5, 4, seed=step)
        trainer.step(x, y)
        twin_trainer.step(x, y)
        new = torch.randn_like(params)
        pointer = new.data_ptr()
        old = trainer.swap(new)
        assert peers.params is params and params.data_ptr() == pointer  # identity kept
        assert torch.equal(params, new) and old.data_ptr() != pointer
        with torch.no_grad():
            twin.params.copy_(new)
    x, y = data(5, 4, seed=9)
    trainer.step(x, y)  # the blocks (and momentum) follow the new storage
    twin_trainer.step(x, y)
    assert torch.equal(params, twin.params)
    with pytest.raises(ValueError, match="values: must be a contiguous"):
        trainer.swap(torch.zeros(4, peers.dim))
    with pytest.raises(ValueError, match="must not share"):
        trainer.swap(params[:])
