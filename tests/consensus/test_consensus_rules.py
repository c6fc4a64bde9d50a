"""Each rule against a slow, obviously-correct reference written from the paper's definition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import consensus


def random_case(
    seed: int, k: int, d: int, *, uniform: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    own = torch.randn(d, generator=g, dtype=torch.float64)
    neighbours = torch.randn(k, d, generator=g, dtype=torch.float64)
    if uniform:
        weights = torch.full((k,), 1.0 / (k + 1), dtype=torch.float64)
    else:
        weights = torch.rand(k, generator=g, dtype=torch.float64) / (k + 1)
    return own, neighbours, weights


def full_set(own: torch.Tensor, neighbours: torch.Tensor, weights: torch.Tensor):
    values = torch.cat([own[None], neighbours]).numpy()
    w = np.concatenate([[1.0 - float(weights.sum())], weights.numpy()])
    return values, w


# --- weighted mean -------------------------------------------------------------------------


def test_mean_equals_a_dense_mixing_matrix_product() -> None:
    """Batched over all nodes of a random graph with Metropolis-Hastings weights: X <- W X."""
    n, d = 12, 5
    rng = np.random.default_rng(0)
    adjacency = np.triu(rng.random((n, n)) < 0.35, 1)
    adjacency = adjacency | adjacency.T
    degree = adjacency.sum(1)
    w = np.where(adjacency, 1.0 / (1 + np.maximum(degree[:, None], degree[None, :])), 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(1))
    x = rng.standard_normal((n, d))
    k = int(degree.max())
    index = np.zeros((n, k), dtype=np.int64)
    weight = np.zeros((n, k))
    mask = np.zeros((n, k), dtype=bool)
    for i in range(n):
        nbrs = np.flatnonzero(adjacency[i])
        index[i, : len(nbrs)] = nbrs
        weight[i, : len(nbrs)] = w[i, nbrs]
        mask[i, : len(nbrs)] = True
    xt = torch.from_numpy(x)
    out = consensus.weighted_mean(
        xt, xt[torch.from_numpy(index)], torch.from_numpy(weight), torch.from_numpy(mask)
    )
    np.testing.assert_allclose(out.numpy(), w @ x, rtol=1e-12, atol=1e-12)
    assert torch.equal(
        consensus.build("mean")(
            xt, xt[torch.from_numpy(index)], torch.from_numpy(weight), torch.from_numpy(mask)
        ),
        out,
    )


def test_mean_with_no_neighbours_returns_own() -> None:
    own = torch.randn(4)
    assert torch.equal(consensus.weighted_mean(own, torch.empty(0, 4), torch.empty(0)), own)


def test_mean_fast_path_still_masks_a_nan_neighbour() -> None:
    own, neighbours, weights = random_case(1, 4, 3)
    poisoned = neighbours.clone()
    poisoned[2, 1] = float("nan")
    keep = torch.tensor([True, True, False, True])
    torch.testing.assert_close(
        consensus.weighted_mean(own, poisoned, weights),
        consensus.weighted_mean(own, neighbours, weights, keep),
    )


def test_mean_of_finite_vectors_whose_sum_overflows_is_still_exact() -> None:
    """The cheap check on the result (one sum) overflows; the exact path then keeps every row."""
    own = torch.full((1000,), 3e38)
    neighbours = torch.full((2, 1000), 3e38)
    neighbours[1] = -3e38
    out = consensus.weighted_mean(own, neighbours, torch.tensor([0.25, 0.25]))
    assert not torch.isfinite(out.sum())  # the cheap check cannot clear this result
    torch.testing.assert_close(out, own * 0.5, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_finiteness_checks_see_every_nan_and_inf_and_no_false_alarm_in_16_bit(
    dtype: torch.dtype,
) -> None:
    from consensus._inputs import sum_is_finite

    values = torch.ones(200_001, dtype=dtype)  # a float16 sum of these would overflow to inf
    assert sum_is_finite(values) and consensus.all_finite(values)
    for bad in (float("nan"), float("inf"), -float("inf")):
        for where in (0, 99_999, 200_000):
            poisoned = values.clone()
            poisoned[where] = bad
            assert not sum_is_finite(poisoned) and not consensus.all_finite(poisoned)
    huge = torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)
    assert consensus.all_finite(huge)  # exact even where the cheap sum overflows
    assert consensus.all_finite(torch.empty(0, dtype=dtype))


def test_mean_fast_path_is_the_exact_path_and_batched_is_per_node() -> None:
    """Finite inputs: the result equals the masked reference rule and each node's own call."""
    g = torch.Generator().manual_seed(3)
    own = torch.randn(5, 300, generator=g)
    neighbours = torch.randn(5, 4, 300, generator=g)
    weights = torch.rand(5, 4, generator=g) / 5
    mask = torch.rand(5, 4, generator=g) > 0.3
    out = consensus.weighted_mean(own, neighbours, weights, mask)
    rule = consensus.WeightedMean()
    exact = consensus.base.Rule.__call__(rule, own, neighbours, weights, mask)
    assert torch.equal(out, exact)
    self_weight = 1 - (weights * mask).sum(-1, keepdim=True)
    reference = own * self_weight + ((weights * mask)[..., None] * neighbours).sum(-2)
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-6)
    for b in range(5):
        single = consensus.weighted_mean(own[b], neighbours[b], weights[b], mask[b])
        torch.testing.assert_close(single, out[b], rtol=1e-6, atol=1e-6)


def test_mean_with_a_nan_in_own_raises_even_when_its_self_weight_is_zero() -> None:
    own = torch.zeros(3)
    own[1] = float("nan")
    with pytest.raises(ValueError, match="own contains NaN or Inf"):
        consensus.weighted_mean(own, torch.ones(2, 3), torch.tensor([0.5, 0.5]))


# --- order statistics ----------------------------------------------------------------------


def reference_weighted_median(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.empty(values.shape[1])
    for c in range(values.shape[1]):
        order = np.argsort(values[:, c], kind="stable")
        v, cw = values[order, c], np.cumsum(w[order])
        half = cw[-1] / 2
        lo = int(np.argmax(cw >= half - 1e-12))
        hi = int(np.argmax(cw > half + 1e-12))
        out[c] = (v[lo] + v[hi]) / 2
    return out


@pytest.mark.parametrize("k", [3, 4, 7])
def test_median_with_uniform_weights_is_numpys_median(k: int) -> None:
    own, neighbours, weights = random_case(k, k, 6, uniform=True)
    values, _ = full_set(own, neighbours, weights)
    out = consensus.build("median")(own, neighbours, weights)
    np.testing.assert_allclose(out.numpy(), np.median(values, axis=0), rtol=0, atol=1e-15)


def test_median_even_n_is_the_mean_of_the_two_middle_values() -> None:
    own = torch.tensor([0.0])
    neighbours = torch.tensor([[10.0], [1.0], [3.0]])
    out = consensus.build("median")(own, neighbours, torch.full((3,), 0.25))
    assert out.item() == 2.0


@pytest.mark.parametrize("seed", range(5))
def test_weighted_median_matches_the_reference(seed: int) -> None:
    own, neighbours, weights = random_case(seed, 6, 8)
    values, w = full_set(own, neighbours, weights)
    out = consensus.build("median")(own, neighbours, weights)
    np.testing.assert_allclose(out.numpy(), reference_weighted_median(values, w), atol=1e-15)


def test_median_follows_the_heavy_neighbour() -> None:
    """Weights matter: a neighbour holding more than half the weight is the median."""
    own = torch.tensor([0.0, 0.0])
    neighbours = torch.tensor([[5.0, -5.0], [1.0, 1.0], [2.0, 2.0]])
    out = consensus.build("median")(own, neighbours, torch.tensor([0.6, 0.1, 0.1]))
    assert out.tolist() == [5.0, -5.0]


def reference_trimmed_mean(values: np.ndarray, w: np.ndarray, b: int) -> np.ndarray:
    out = np.empty(values.shape[1])
    for c in range(values.shape[1]):
        order = np.argsort(values[:, c], kind="stable")[b : len(values) - b]
        out[c] = np.sum(w[order] * values[order, c]) / np.sum(w[order])
    return out


@pytest.mark.parametrize(("k", "b"), [(4, 0), (4, 1), (6, 2), (9, 4)])
def test_trimmed_mean_matches_the_reference(k: int, b: int) -> None:
    own, neighbours, weights = random_case(k + b, k, 7)
    values, w = full_set(own, neighbours, weights)
    out = consensus.build(f"trimmed-mean:b={b}")(own, neighbours, weights)
    np.testing.assert_allclose(out.numpy(), reference_trimmed_mean(values, w, b), rtol=1e-12)


def test_trimmed_mean_with_uniform_weights_is_the_classical_one() -> None:
    from scipy.stats import trim_mean

    own, neighbours, weights = random_case(3, 9, 5, uniform=True)
    values, _ = full_set(own, neighbours, weights)
    out = consensus.build("trimmed-mean:b=2")(own, neighbours, weights)
    np.testing.assert_allclose(out.numpy(), trim_mean(values, 0.2, axis=0), rtol=1e-12)


def test_trimmed_mean_falls_back_to_uniform_when_the_kept_values_weigh_nothing() -> None:
    own = torch.tensor([0.0])
    neighbours = torch.tensor([[1.0], [2.0], [9.0]])
    weights = torch.tensor([0.0, 0.0, 1.0])  # self weight 0, and the 9 is trimmed
    out = consensus.build("trimmed-mean:b=1")(own, neighbours, weights)
    assert out.item() == 1.5


# --- Krum, Multi-Krum, Bulyan ----------------------------------------------------------------


def reference_krum_scores(values: np.ndarray, f: int) -> np.ndarray:
    n = len(values)
    scores = np.empty(n)
    for c in range(n):
        dists = sorted(float(np.sum((values[c] - values[j]) ** 2)) for j in range(n) if j != c)
        scores[c] = sum(dists[: max(n - f - 2, 1)])
    return scores


@pytest.mark.parametrize(("k", "f"), [(4, 1), (7, 2), (10, 3)])
def test_krum_picks_the_reference_choice_exactly(k: int, f: int) -> None:
    own, neighbours, weights = random_case(10 * k + f, k, 5)
    values, _ = full_set(own, neighbours, weights)
    best = int(np.argmin(reference_krum_scores(values, f)))
    out = consensus.build(f"krum:f={f}")(own, neighbours, weights)
    assert torch.equal(out, torch.from_numpy(values[best]))


@pytest.mark.parametrize(("k", "f", "m"), [(5, 1, None), (7, 2, 3), (10, 3, 1)])
def test_multi_krum_averages_the_m_best_with_their_weights(k: int, f: int, m: int | None) -> None:
    own, neighbours, weights = random_case(k * f, k, 5)
    values, w = full_set(own, neighbours, weights)
    chosen = np.argsort(reference_krum_scores(values, f))[: (k + 1 - f) if m is None else m]
    expected = (w[chosen, None] * values[chosen]).sum(0) / w[chosen].sum()
    spec = f"multi-krum:f={f}" + ("" if m is None else f",m={m}")
    out = consensus.build(spec)(own, neighbours, weights)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10)


def reference_bulyan(values: np.ndarray, w: np.ndarray, f: int) -> np.ndarray:
    remaining = list(range(len(values)))
    selected: list[int] = []
    total = ((values[:, None, :] - values[None, :, :]) ** 2).sum(-1).sum(-1)
    for _ in range(len(values) - 2 * f):
        scores = reference_krum_scores(values[remaining], f)
        # exact ties (the last steps compare two vectors with each other) go to the one
        # closest to the whole set
        tied = [r for r, s in zip(remaining, scores) if s == scores.min()]
        best = min(tied, key=lambda r: total[r])
        selected.append(best)
        remaining.remove(best)
    theta, beta = len(selected), len(selected) - 2 * f
    chosen = values[selected]
    out = np.empty(values.shape[1])
    for c in range(values.shape[1]):
        median = np.median(chosen[:, c])
        # sorted by (value, weight), then by distance to the median: ties keep the lower value
        ranked = sorted(zip(chosen[:, c], w[selected]), key=lambda vw: (abs(vw[0] - median), vw))
        kept = np.array(ranked[:beta])
        out[c] = np.sum(kept[:, 1] * kept[:, 0]) / np.sum(kept[:, 1])
    assert theta == len(values) - 2 * f
    return out


@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize(("k", "f"), [(6, 1), (10, 2), (12, 2), (16, 3)])
def test_bulyan_matches_the_reference(k: int, f: int, uniform: bool) -> None:
    own, neighbours, weights = random_case(k + 100 * f, k, 6, uniform=uniform)
    values, w = full_set(own, neighbours, weights)
    out = consensus.build(f"bulyan:f={f}")(own, neighbours, weights)
    np.testing.assert_allclose(out.numpy(), reference_bulyan(values, w, f), rtol=1e-10)


@pytest.mark.parametrize(
    ("spec", "k", "message"),
    [
        ("krum:f=2", 5, "krum needs n > 2f+2, got n=6, f=2"),
        ("multi-krum:f=1", 3, "multi-krum needs n > 2f+2, got n=4, f=1"),
        ("bulyan:f=2", 9, "bulyan needs n >= 4f+3, got n=10, f=2"),
        ("trimmed-mean:b=2", 3, "trimmed-mean needs n > 2b, got n=4, b=2"),
        ("nnm:f=3+median", 5, "nnm needs n > 2f, got n=6, f=3"),
        ("bucketing:s=2+krum:f=1", 6, "krum needs n > 2f+2, got n=4, f=1"),
    ],
)
def test_bounds_are_checked_on_the_first_call(spec: str, k: int, message: str) -> None:
    own, neighbours, weights = random_case(0, k, 3)
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        consensus.build(spec)(own, neighbours, weights)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("krum:f=2,n=6", "krum needs n > 2f+2, got n=6, f=2"),
        ("bulyan:f=1,n=6", "bulyan needs n >= 4f+3, got n=6, f=1"),
        ("multi-krum:f=1,m=9,n=8", "multi-krum needs m <= n, got n=8, m=9"),
        ("trimmed-mean:b=3,n=6", "trimmed-mean needs n > 2b, got n=6, b=3"),
    ],
)
def test_bounds_are_checked_at_construction_when_n_is_given(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        consensus.build(spec)


def test_the_bound_counts_declared_neighbours_so_nan_rows_cannot_break_it() -> None:
    """krum:f=2 with n = 7: a NaN row is dropped but also spends one unit of f."""
    own, neighbours, weights = random_case(4, 6, 3)
    neighbours[0] = float("nan")
    out = consensus.build("krum:f=2")(own, neighbours, weights)
    assert bool(torch.isfinite(out).all())


def test_krum_distances_survive_a_large_common_offset() -> None:
    """Centring at own keeps float32 Gram distances accurate when all vectors share an offset."""
    own, neighbours, weights = random_case(8, 6, 1000)
    offset = 1e3
    out32 = consensus.build("krum:f=1")(
        (own + offset).float(), (neighbours + offset).float(), weights
    )
    out64 = consensus.build("krum:f=1")(own, neighbours, weights)
    torch.testing.assert_close(out32, (out64 + offset).float())


# --- geometric median, clipping ---------------------------------------------------------------


def test_geometric_median_converges_to_the_weighted_optimum() -> None:
    """At the optimum the weighted sum of unit vectors towards the inputs vanishes."""
    own, neighbours, weights = random_case(2, 7, 4)
    weights = weights * 0.5 / weights.sum() + 0.3 / 7  # no member holds half the weight
    values, w = full_set(own, neighbours, weights)
    out = consensus.build("geometric-median:T=300,nu=1e-12")(own, neighbours, weights).numpy()
    diffs = values - out
    gradient = (w[:, None] * diffs / np.linalg.norm(diffs, axis=1, keepdims=True)).sum(0)
    assert np.linalg.norm(gradient) < 1e-6
    objective = lambda v: float((w * np.linalg.norm(values - v, axis=1)).sum())  # noqa: E731
    for direction in np.eye(4):
        assert objective(out) <= objective(out + 1e-4 * direction)
        assert objective(out) <= objective(out - 1e-4 * direction)


def test_geometric_median_is_a_member_holding_more_than_half_the_weight() -> None:
    own, neighbours, _ = random_case(2, 7, 4)
    weights = torch.full((7,), 0.4 / 7, dtype=torch.float64)  # w_ii = 0.6
    out = consensus.build("geometric-median:T=50")(own, neighbours, weights)
    torch.testing.assert_close(out, own, rtol=0, atol=1e-5)


def test_centered_clipping_keeps_its_centre_between_calls() -> None:
    own, neighbours, weights = random_case(5, 5, 3)
    rule = consensus.build("centered-clipping:tau=inf")
    first = rule(own, neighbours, weights)
    torch.testing.assert_close(first, consensus.weighted_mean(own, neighbours, weights))
    centre = rule.centre  # type: ignore[attr-defined]
    assert centre is not None and torch.equal(centre.view_as(first), first)
    frozen = consensus.build("centered-clipping:tau=0")
    frozen(own, neighbours, weights)  # centre = own after a tau=0 call
    assert torch.equal(frozen(own + 1, neighbours, weights), own)  # stays at the old centre
    frozen.reset()
    assert torch.equal(frozen(own + 1, neighbours, weights), own + 1)


def test_centered_clipping_step_is_clipped_to_tau() -> None:
    own = torch.zeros(2, dtype=torch.float64)
    neighbours = torch.tensor([[30.0, 40.0], [0.0, 0.0]], dtype=torch.float64)
    out = consensus.build("centered-clipping:tau=5")(own, neighbours, torch.tensor([0.5, 0.25]))
    torch.testing.assert_close(out, torch.tensor([1.5, 2.0], dtype=torch.float64))  # 0.5 * (3, 4)


def test_centered_clipping_rejects_a_changed_batch_without_reset() -> None:
    rule = consensus.build("centered-clipping")
    rule(torch.zeros(2, 3), torch.zeros(2, 4, 3), torch.full((2, 4), 0.1))
    with pytest.raises(ValueError, match="call reset"):
        rule(torch.zeros(3, 3), torch.zeros(3, 4, 3), torch.full((3, 4), 0.1))


def test_clipped_gossip_auto_radius_is_the_f_plus_first_farthest() -> None:
    own = torch.zeros(1, dtype=torch.float64)
    neighbours = torch.tensor([[1.0], [-2.0], [4.0], [100.0]], dtype=torch.float64)
    rule = consensus.build("clipped-gossip:tau=auto,f=1")
    out = rule(own, neighbours, torch.full((4,), 0.2))
    assert rule.radius is not None and rule.radius.tolist() == [4.0]  # type: ignore[attr-defined]
    assert out.item() == pytest.approx(0.2 * (1 - 2 + 4 + 4))
    rule2 = consensus.build("clipped-gossip:tau=auto,f=4")  # every neighbour may be Byzantine
    assert torch.equal(rule2(own, neighbours, torch.full((4,), 0.2)), own)


def test_clipped_gossip_fixed_radius() -> None:
    own = torch.zeros(2, dtype=torch.float64)
    neighbours = torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=torch.float64)
    out = consensus.build("clipped-gossip:tau=1")(own, neighbours, torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(out, torch.tensor([0.45, 0.6], dtype=torch.float64))


# --- wrappers --------------------------------------------------------------------------------


@pytest.mark.parametrize("inner", ["median", "trimmed-mean:b=1", "krum:f=1", "mean"])
def test_bucketing_with_buckets_of_one_is_the_inner_rule(inner: str) -> None:
    own, neighbours, weights = random_case(9, 7, 4)
    out = consensus.build(f"bucketing:s=1+{inner}")(own, neighbours, weights)
    torch.testing.assert_close(out, consensus.build(inner)(own, neighbours, weights))


def test_bucketing_with_one_bucket_and_the_mean_is_the_mean() -> None:
    own, neighbours, weights = random_case(9, 7, 4)
    out = consensus.build("bucketing:s=7+mean")(own, neighbours, weights)
    torch.testing.assert_close(out, consensus.weighted_mean(own, neighbours, weights))


def test_bucketing_buckets_are_weighted_means_of_s_neighbours() -> None:
    own, neighbours, weights = random_case(4, 6, 3)
    values, w = full_set(own, neighbours, weights)
    out = consensus.build("bucketing:s=2,seed=5+median")(own, neighbours, weights).numpy()
    # the result is the weighted median of own and one of the possible pairings
    candidates = []
    for perm in itertools.permutations(range(1, 7)):
        if list(perm[0::2]) != sorted(perm[0::2]) or any(
            a > b for a, b in zip(perm[0::2], perm[1::2])
        ):
            continue
        pairs = [perm[i : i + 2] for i in range(0, 6, 2)]
        bw = np.array([w[list(p)].sum() for p in pairs])
        means = np.array(
            [(w[list(p), None] * values[list(p)]).sum(0) / w[list(p)].sum() for p in pairs]
        )
        candidates.append(
            reference_weighted_median(np.vstack([values[:1], means]), np.concatenate([w[:1], bw]))
        )
    assert any(np.allclose(out, c, atol=1e-12) for c in candidates)


def test_bucketing_is_reproducible_from_its_seed() -> None:
    own, neighbours, weights = random_case(4, 9, 3, uniform=True)
    a = consensus.build("bucketing:s=3,seed=1+trimmed-mean:b=1")
    b = consensus.build("bucketing:s=3,seed=1+trimmed-mean:b=1")
    first = [a(own, neighbours, weights) for _ in range(4)]
    assert all(torch.equal(x, b(own, neighbours, weights)) for x in first)
    assert not all(torch.equal(first[0], x) for x in first[1:])  # fresh shuffles each call
    a.reset()
    assert torch.equal(a(own, neighbours, weights), first[0])


def test_nnm_with_f_zero_mixes_everything_into_the_uniform_mean() -> None:
    own, neighbours, weights = random_case(6, 5, 4)
    values, _ = full_set(own, neighbours, weights)
    out = consensus.build("nnm:f=0+median")(own, neighbours, weights)
    np.testing.assert_allclose(out.numpy(), values.mean(0), rtol=1e-12)


def test_nnm_replaces_each_input_by_the_mean_of_its_nearest() -> None:
    own = torch.tensor([0.0], dtype=torch.float64)
    neighbours = torch.tensor([[1.0], [10.0], [11.0]], dtype=torch.float64)
    # n = 4, f = 1: each member averages its 3 nearest; own -> mean(0, 1, 10)
    out = consensus.build("nnm:f=1+krum:f=0")(own, neighbours, torch.full((3,), 0.25))
    mixed = {0: 11 / 3, 1: 11 / 3, 2: 22 / 3, 3: 22 / 3}
    assert any(out.item() == pytest.approx(v) for v in mixed.values())


# --- input validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("own", "neighbours", "weights", "mask", "message"),
    [
        (
            torch.zeros(3),
            torch.zeros(2, 4),
            torch.zeros(2),
            None,
            r"neighbours must have shape \[\*, k, d\] = \[k, 3\]",
        ),
        (
            torch.zeros(2, 3),
            torch.zeros(3, 2, 3),
            torch.zeros(3, 2),
            None,
            "neighbours must have shape",
        ),
        (
            torch.zeros(3),
            torch.zeros(2, 3),
            torch.zeros(3),
            None,
            r"weights must have shape \[\*, k\] = \[2\]",
        ),
        (
            torch.zeros(3),
            torch.zeros(2, 3),
            torch.tensor([0.5, -0.1]),
            None,
            "weights must be finite and >= 0",
        ),
        (
            torch.zeros(3),
            torch.zeros(2, 3),
            torch.tensor([0.7, 0.7]),
            None,
            "must sum to at most 1",
        ),
        (
            torch.zeros(3),
            torch.zeros(2, 3),
            torch.tensor([0.5, 0.5]),
            torch.ones(2),
            "mask must be a bool tensor",
        ),
        (
            torch.zeros(3, dtype=torch.int64),
            torch.zeros(2, 3),
            torch.zeros(2),
            None,
            "own must be a floating-point",
        ),
        (
            torch.zeros(3),
            torch.zeros(2, 3, dtype=torch.float64),
            torch.zeros(2),
            None,
            "neighbours must have own's dtype",
        ),
    ],
)
@pytest.mark.parametrize("spec", ["mean", "median", "krum:f=0", "clipped-gossip"])
def test_bad_inputs_raise_value_errors_that_name_the_field(
    spec: str, own, neighbours, weights, mask, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        consensus.build(spec)(own, neighbours, weights, mask)


def test_weights_of_masked_neighbours_do_not_count_towards_the_sum() -> None:
    out = consensus.weighted_mean(
        torch.zeros(1), torch.ones(2, 1), torch.tensor([0.5, 0.9]), torch.tensor([True, False])
    )
    assert out.item() == 0.5


def test_weighted_mean_into_out_equals_the_returned_result_and_handles_nan_rows() -> None:
    """``out=`` writes the same numbers into the caller's buffer (no temporary), including
    the exact fallback that masks a non-finite neighbour; a bad buffer is refused by name."""
    gen = torch.Generator().manual_seed(3)
    own = torch.randn(6, 9, generator=gen)
    neighbours = torch.randn(6, 3, 9, generator=gen)
    neighbours[2, 1, 4] = float("nan")
    weights = torch.full((6, 3), 0.2)
    mask = torch.ones(6, 3, dtype=torch.bool)
    mask[0, 2] = False
    expected = consensus.weighted_mean(own, neighbours, weights, mask)
    out = torch.full_like(own, 7.0)
    result = consensus.weighted_mean(own, neighbours, weights, mask, out=out)
    assert result is out
    assert torch.equal(out, expected)
    assert bool(torch.isfinite(out).all())
    rule = consensus.build("mean")
    assert torch.equal(rule(own, neighbours, weights, mask, out=torch.empty_like(own)), expected)
    for bad in (torch.empty(6, 8), torch.empty(6, 9, dtype=torch.float64), own):
        with pytest.raises(ValueError, match="out: must be"):
            consensus.weighted_mean(own, neighbours, weights, mask, out=bad)
