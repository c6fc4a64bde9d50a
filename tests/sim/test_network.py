"""The time model: simulated time is computed, so these checks are exact and deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from sim.network import (
    ComputeModel,
    Crash,
    Failures,
    Links,
    asynchronous_gossip_events,
    parameter_server_time,
    ring_allreduce_time,
    synchronous_round_time,
)

TEN_GBIT = 10e9 / 8  # bytes per second


def ring_rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour rows of a ring (degree 2), written out for the time model only."""
    index = np.stack([(np.arange(n) - 1) % n, (np.arange(n) + 1) % n], axis=1)
    return index, np.ones_like(index, dtype=bool)


def gossip_send_time(
    links: Links, index: np.ndarray, mask: np.ndarray, size: float | np.ndarray
) -> np.ndarray:
    """Per-peer time ``[n]`` to send its message to every neighbour in its row, one after the
    other, ``T_i = Σ_{j ∈ N(i)} (α_ij + M_i/B_ij)``: the gossip side of the comparisons
    below."""
    n = index.shape[0]
    source = np.broadcast_to(np.arange(n)[:, None], index.shape)
    alpha, beta = links.link(source, index)
    m = np.broadcast_to(np.asarray(size, dtype=np.float64).reshape(-1, 1), (n, 1))
    return np.where(mask, alpha + m / beta, 0.0).sum(axis=1)


def test_ring_allreduce_formula() -> None:
    links = Links.uniform(4, latency=1e-3, bandwidth=1e6)
    # 2(p-1)α + 2(p-1)/p M/B = 6e-3 + 1.5 * 1e6 / 1e6
    assert ring_allreduce_time(links, 1e6) == pytest.approx(6e-3 + 1.5)
    assert ring_allreduce_time(Links.uniform(1), 1e6) == 0.0


def test_ring_allreduce_is_bounded_by_the_slowest_link() -> None:
    fast = Links.uniform(8, latency=1e-4, bandwidth=1e9)
    slow_peer = Links.uniform(8, latency=1e-4, bandwidth=[1e9] * 7 + [1e8])
    assert ring_allreduce_time(slow_peer, 1e8) > 9 * ring_allreduce_time(fast, 1e8) * 0.99
    override = Links.uniform(8, latency=1e-4, bandwidth=1e9, overrides={(3, 4): (1e-1, 1e9)})
    assert ring_allreduce_time(override, 1e3) == pytest.approx(14 * 1e-1 + 2 * 7 / 8 * 1e3 / 1e9)


def test_parameter_server_grows_linearly_in_p_while_ring_and_gossip_stay_flat() -> None:
    size = 50e6
    ps, ring, gossip = [], [], []
    sizes = [8, 16, 32, 64, 128]
    for p in sizes:
        links = Links.uniform(p, latency=1e-5, bandwidth=TEN_GBIT)
        ps.append(parameter_server_time(links, size, server_bandwidth=TEN_GBIT))
        ring.append(ring_allreduce_time(links, size))
        index, mask = ring_rows(p)
        gossip.append(gossip_send_time(links, index, mask, size).max())
    ps_ratio = np.array(ps) / ps[0]
    np.testing.assert_allclose(ps_ratio, np.array(sizes) / sizes[0], rtol=1e-3)
    assert max(ring) / min(ring) < 1.2
    assert max(gossip) / min(gossip) < 1.0001
    # S server shards divide the incast
    links = Links.uniform(64, latency=1e-5, bandwidth=TEN_GBIT)
    one = parameter_server_time(links, size, server_bandwidth=TEN_GBIT)
    four = parameter_server_time(links, size, server_bandwidth=TEN_GBIT, shards=4)
    assert four == pytest.approx((one - 2e-5) / 4 + 2e-5)


def test_bandwidth_bound_ring_beats_gossip_and_latency_bound_ring_loses() -> None:
    p = 32
    links = Links.uniform(p, latency=10e-6, bandwidth=TEN_GBIT)
    index, mask = ring_rows(p)
    big = 100e6
    assert ring_allreduce_time(links, big) <= gossip_send_time(links, index, mask, big).max()
    small = 10e3  # a small model: ring's 2(p-1) latency terms dominate
    assert ring_allreduce_time(links, small) > gossip_send_time(links, index, mask, small).max()
    # the crossover lies between: find it by bisection on the model size
    low, high = small, big
    for _ in range(60):
        mid = (low * high) ** 0.5
        if ring_allreduce_time(links, mid) > gossip_send_time(links, index, mask, mid).max():
            low = mid
        else:
            high = mid
    # 2(p-1)α + 2(p-1)/p · M/B = 2(α + M/B)  <=>  M = p(p-2)·α·B  (12 MB here)
    assert low == pytest.approx(p * (p - 2) * 10e-6 * TEN_GBIT, rel=1e-6)
    assert small < low < big


def test_a_link_has_the_larger_latency_of_its_two_ends_per_message() -> None:
    links = Links.uniform(4, latency=[1e-3, 1e-3, 1e-3, 5e-3], bandwidth=1e6)
    index, mask = ring_rows(4)
    mask[0, 1] = False  # peer 0 sends only to 3
    times = gossip_send_time(links, index, mask, np.array([1e3, 1e3, 2e3, 1e3]))
    np.testing.assert_allclose(
        times,
        [5e-3 + 1e-3, (1e-3 + 1e-3) + 2 * 1e-3, (1e-3 + 2e-3) + (5e-3 + 2e-3), 2 * (5e-3 + 1e-3)],
    )


def test_one_straggler_slows_synchronous_10x_and_asynchronous_gossip_far_less() -> None:
    n, steps_per_peer = 16, 50
    links = Links.uniform(n, latency=1e-5, bandwidth=TEN_GBIT)
    size = 1e5
    index, mask = ring_rows(n)

    def synchronous(compute: ComputeModel) -> float:
        communication = gossip_send_time(links, index, mask, size)
        return sum(
            synchronous_round_time(compute.sample(t), communication) for t in range(steps_per_peer)
        )

    def asynchronous(compute: ComputeModel) -> float:
        events = list(
            asynchronous_gossip_events(
                compute, links, index, mask, size, total_steps=n * steps_per_peer
            )
        )
        return events[-1].time

    even = ComputeModel(n, step_time=0.01)
    straggler = ComputeModel(n, step_time=0.01, stragglers={5: 10.0})
    sync_slowdown = synchronous(straggler) / synchronous(even)
    async_slowdown = asynchronous(straggler) / asynchronous(even)
    assert 9 < sync_slowdown < 10.5
    assert async_slowdown < 1.2


def test_asynchronous_events_are_ordered_reproducible_and_respect_crashes() -> None:
    n = 6
    links = Links.uniform(n)
    index, mask = ring_rows(n)
    compute = ComputeModel(n, step_time=0.01, distribution="exponential", seed=4)
    failures = Failures(n, crashes=(Crash(peer=2, at=0.05, rejoin=0.2),))
    events = list(
        asynchronous_gossip_events(
            compute, links, index, mask, 1e3, total_steps=200, failures=failures, seed=1
        )
    )
    again = list(
        asynchronous_gossip_events(
            compute, links, index, mask, 1e3, total_steps=200, failures=failures, seed=1
        )
    )
    assert events == again
    times = [e.time for e in events]
    assert times == sorted(times)
    assert not any(e.peer == 2 and 0.05 <= e.time < 0.2 for e in events)
    assert not any(e.partner == 2 and 0.05 <= e.time < 0.2 for e in events)
    assert any(e.peer == 2 and e.time >= 0.2 for e in events)
    for e in events:
        assert e.partner == -1 or e.partner in index[e.peer]


def test_compute_model_distributions_are_seeded_per_step() -> None:
    model = ComputeModel(8, step_time=0.02, distribution="lognormal", spread=0.5, seed=3)
    assert np.array_equal(model.sample(7), model.sample(7))
    assert not np.array_equal(model.sample(7), model.sample(8))
    draws = np.stack([model.sample(t) for t in range(4000)])
    np.testing.assert_allclose(draws.mean(), model.mean.mean(), rtol=0.05)
    constant = ComputeModel(3, step_time=[0.1, 0.2, 0.3], stragglers={0: 4.0})
    np.testing.assert_allclose(constant.sample(0), [0.4, 0.2, 0.3])


def test_failures_alive_and_message_loss() -> None:
    failures = Failures(4, message_loss=0.25, crashes=(Crash(1, at=1.0, rejoin=2.0), Crash(3, 0.5)))
    assert failures.alive(0.0).tolist() == [True, True, True, True]
    assert failures.alive(1.5).tolist() == [True, False, True, False]
    assert failures.alive(2.0).tolist() == [True, True, True, False]
    delivered = failures.delivered(3, (200, 50))
    assert np.array_equal(delivered, failures.delivered(3, (200, 50)))
    assert abs(1 - delivered.mean() - 0.25) < 0.02


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Links.uniform(3, latency=-1.0), "latency"),
        (lambda: Links.uniform(3, bandwidth=[1.0, 2.0]), "bandwidth: needs one value per peer"),
        (lambda: Links.uniform(3, overrides={(0, 5): (0.1, 1.0)}), "overrides"),
        (
            lambda: ComputeModel(3, distribution="pareto"),
            "distribution: got 'pareto'; allowed: constant",
        ),
        (lambda: ComputeModel(3, stragglers={7: 2.0}), "stragglers"),
        (lambda: Failures(3, message_loss=1.0), "message_loss"),
        (lambda: Failures(3, crashes=(Crash(0, 2.0, 1.0),)), "crashes.rejoin"),
        (
            lambda: parameter_server_time(Links.uniform(2), 1.0, server_bandwidth=1, shards=0),
            "shards",
        ),
    ],
)
def test_bad_inputs_name_the_field(build, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build()
