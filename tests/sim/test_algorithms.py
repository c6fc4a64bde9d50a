"""Baselines: each against an independent statement of what it computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sim.algorithms import (
    EASGD,
    AsynchronousParameterServer,
    Centralized,
    FedAvg,
    OptimizerConfig,
    ParameterServer,
    RingAllReduce,
)
from sim.network import ComputeModel, Crash, Failures
from sim.runner import run

from .helpers import make_context


def trained(algorithm, rounds: int = 6, **kwargs) -> torch.Tensor:
    ctx, evaluation = make_context(**kwargs)
    run(algorithm, ctx, evaluation, rounds=rounds, eval_every=rounds)
    return algorithm.models(ctx)


@pytest.mark.parametrize(
    "optimizer", [OptimizerConfig(lr=0.1), OptimizerConfig(lr=0.05, momentum=0.9)]
)
def test_allreduce_and_parameter_server_equal_centralized_sgd_on_the_union_of_batches(
    optimizer: OptimizerConfig,
) -> None:
    # equal batch sizes: the mean of the n per-peer mean gradients is the big-batch gradient
    central = trained(Centralized(), optimizer=optimizer)
    allreduce = trained(RingAllReduce(), optimizer=optimizer)
    server = trained(ParameterServer(shards=3), optimizer=optimizer)
    torch.testing.assert_close(allreduce, central, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(server, central, atol=1e-5, rtol=1e-5)
    initial = make_context()[0].peers.params[:1]
    assert (central - initial).abs().max() > 1e-2


def test_fedavg_with_one_local_step_and_all_clients_equals_allreduce() -> None:
    # 320 training samples over 4 peers: equal shards, so the size weights are equal
    fedavg = trained(FedAvg(local_steps=1, fraction=1.0))
    allreduce = trained(RingAllReduce())
    torch.testing.assert_close(fedavg, allreduce, atol=1e-5, rtol=1e-5)
    several = trained(FedAvg(local_steps=3, fraction=1.0))
    assert (several - allreduce).abs().max() > 1e-3


def test_fedavg_fraction_picks_that_many_clients_per_round() -> None:
    ctx, evaluation = make_context(8)
    algorithm = FedAvg(local_steps=2, fraction=0.25)
    run(algorithm, ctx, evaluation, rounds=10, eval_every=10)
    assert ctx.step_count.sum() == 10 * 2 * 2
    assert (ctx.step_count > 0).sum() > 2  # different clients in different rounds


def test_asynchronous_server_with_one_worker_is_plain_sgd() -> None:
    central = trained(Centralized(), n=1, rounds=8)
    asynchronous = trained(AsynchronousParameterServer(), n=1, rounds=8)
    torch.testing.assert_close(asynchronous, central, atol=1e-6, rtol=1e-6)


def test_asynchronous_server_lets_fast_workers_push_more_often() -> None:
    compute = ComputeModel(4, step_time=0.01, stragglers={0: 4.0})
    ctx, evaluation = make_context(4, compute=compute)
    records = run(AsynchronousParameterServer(), ctx, evaluation, rounds=20, eval_every=20)
    fast = ctx.step_count[1:].mean()
    assert ctx.step_count.sum() == 80
    assert 3.0 < fast / ctx.step_count[0] < 5.0
    # the synchronous server waits for the straggler every round
    sync_ctx, _ = make_context(4, compute=compute)
    sync = run(ParameterServer(), sync_ctx, evaluation, rounds=20, eval_every=20)
    assert records[-1].time < sync[-1].time / 2
    assert records[-1].test_accuracy > 0.5


def test_easgd_moves_workers_and_centre_elastically() -> None:
    # with α and one worker step: Σ_i x_i + x̃ changes only by the SGD steps
    ctx, _ = make_context(4)
    algorithm = EASGD(alpha=0.2, period=1)
    algorithm.setup(ctx)
    with torch.no_grad():
        algorithm.workers += 0.01 * torch.randn_like(algorithm.workers)
    workers, centre = algorithm.workers.clone(), algorithm.centre.clone()
    batch_state = ctx.batches_drawn
    algorithm.round(ctx)
    ctx.batches_drawn = batch_state
    x, y = ctx.batch()
    _, grads = ctx.peers.gradients(x, y, workers)
    stepped = workers - 0.1 * grads
    expected_workers = stepped - 0.2 * (stepped - centre)
    expected_centre = centre + 0.2 * (stepped - centre).sum(0, keepdim=True)
    torch.testing.assert_close(algorithm.workers, expected_workers, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(algorithm.centre, expected_centre, atol=1e-6, rtol=1e-6)


def test_crashed_peer_makes_no_steps_and_the_ring_shrinks() -> None:
    failures = Failures(4, crashes=(Crash(peer=2, at=0.0, rejoin=0.1),))
    ctx, evaluation = make_context(4, failures=failures)
    run(RingAllReduce(), ctx, evaluation, rounds=20, eval_every=20)
    assert ctx.step_count[0] == 20
    assert 0 < ctx.step_count[2] < 20


@pytest.mark.parametrize(
    "algorithm",
    [
        Centralized,
        RingAllReduce,
        ParameterServer,
        AsynchronousParameterServer,
        EASGD,
        lambda: FedAvg(local_steps=2),
    ],
)
def test_every_baseline_learns_and_is_reproducible(algorithm) -> None:
    ctx, evaluation = make_context(4, batch_size=16)
    records = run(algorithm(), ctx, evaluation, rounds=40, eval_every=20)
    assert records[0].test_accuracy < 0.3
    assert records[-1].test_accuracy > 0.75
    assert records[-1].time > 0
    ctx_again, _ = make_context(4, batch_size=16)
    again = run(algorithm(), ctx_again, evaluation, rounds=40, eval_every=20)
    np.testing.assert_equal([r.as_dict() for r in again], [r.as_dict() for r in records])


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ParameterServer(shards=0), "shards"),
        (lambda: EASGD(alpha=1.5), "alpha"),
        (lambda: EASGD(period=0), "period"),
        (lambda: FedAvg(local_steps=0), "local_steps"),
        (lambda: FedAvg(fraction=0.0), "fraction"),
    ],
)
def test_bad_parameters_name_the_field(build, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build()


def test_bytes_and_time_follow_the_network_model() -> None:
    ctx, evaluation = make_context(4)
    records = run(RingAllReduce(), ctx, evaluation, rounds=3, eval_every=3)
    model_bytes = ctx.model_bytes
    assert records[-1].bytes_total == pytest.approx(3 * 4 * 2 * 3 / 4 * model_bytes)
    ctx, evaluation = make_context(4)
    records = run(ParameterServer(shards=2), ctx, evaluation, rounds=3, eval_every=3)
    assert records[-1].bytes_busiest == pytest.approx(3 * 4 * model_bytes / 2)
    assert np.isfinite(records[-1].time)


def test_fedavg_computes_the_sampled_clients_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one local step, the new model is Σ_i (n_i/Σ n) (x − η ∇f_i(x)) over the sampled
    live clients, each on its own rows of the step's batch; gradients are asked for those
    clients' rows only."""
    n, lr = 8, 0.1
    ctx, _ = make_context(n, optimizer=OptimizerConfig(lr=lr))
    rows_asked: list[int] = []
    original = ctx.peers.gradients

    def counting(x, y, params=None, **kwargs):  # type: ignore[no-untyped-def]
        rows_asked.append(int(params.shape[0]))
        return original(x, y, params, **kwargs)

    monkeypatch.setattr(ctx.peers, "gradients", counting)
    algorithm = FedAvg(local_steps=1, fraction=0.25)
    algorithm.setup(ctx)
    start = algorithm.model.clone()
    algorithm.round(ctx)
    assert rows_asked == [2]
    chosen = np.flatnonzero(ctx.step_count)
    assert len(chosen) == 2
    index = ctx.sampler.indices(0)[torch.from_numpy(chosen)]
    _, grads = original(ctx.x_train[index], ctx.y_train[index], start.expand(2, -1).contiguous())
    sizes = ctx.sampler.sizes[torch.from_numpy(chosen)].float()
    expected = ((sizes / sizes.sum()).unsqueeze(1) * (start - lr * grads)).sum(0, keepdim=True)
    torch.testing.assert_close(algorithm.model, expected, atol=1e-6, rtol=1e-6)
    assert (algorithm.model - start).abs().max() > 1e-3
