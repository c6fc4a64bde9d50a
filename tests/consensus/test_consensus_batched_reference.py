"""Batched call == per-node call == a slow reference written from each rule's definition.

For every deterministic rule, over neighbourhoods of n = 3..25 vectors (15..25 drawn
often) with the Byzantine budget at the largest value the rule's bound allows, uniform or
random mixing weights, nodes of one size (the sorting-network fast paths) or of several,
padding rows of garbage, and nodes with no neighbour at all. The references are plain
numpy, one node at a time and (for the order statistics) one coordinate at a time; they
share no code with ``consensus``. And every registered rule and wrapper returns the node's own vector when no
neighbour is present (``k = 0``, or every slot masked), per node and batched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import consensus

# --- references: one node, values[0] = own, w = (w_ii, W_ij...) ---------------------------

TIE = 1e-12


def _average(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_c w_c x_c / sum_c w_c, or the plain mean when the chosen weigh nothing."""
    total = w.sum()
    return (w[:, None] * values).sum(0) / total if total > 0 else values.mean(0)


def _by_value_then_weight(column: np.ndarray, w: np.ndarray) -> list[tuple[float, float]]:
    return sorted(zip(column.tolist(), w.tolist(), strict=True))


def ref_mean(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (w[:, None] * values).sum(0)


def ref_median(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The value where the cumulative weight first reaches half; exactly half: mean with the next."""
    out = np.empty(values.shape[1])
    for c in range(values.shape[1]):
        pairs = _by_value_then_weight(values[:, c], w)
        cumulative = np.cumsum([p[1] for p in pairs])
        half = cumulative[-1] / 2
        low = next(i for i, s in enumerate(cumulative) if s >= half - TIE)
        high = next((i for i, s in enumerate(cumulative) if s > half + TIE), low)
        out[c] = (pairs[low][0] + pairs[high][0]) / 2
    return out


def ref_trimmed_mean(values: np.ndarray, w: np.ndarray, b: int) -> np.ndarray:
    """Per coordinate drop the b smallest and b largest, weighted mean of the rest."""
    n = len(values)
    out = np.empty(values.shape[1])
    for c in range(values.shape[1]):
        kept = np.array(_by_value_then_weight(values[:, c], w)[b : n - b])
        out[c] = _average(kept[:, :1], kept[:, 1])[0]
    return out


def _squared_distances(values: np.ndarray) -> np.ndarray:
    """[n, n] ||x_a - x_c||^2, straight from the differences."""
    return ((values[:, None, :] - values[None, :, :]) ** 2).sum(-1)


def _krum_ranking(dist: np.ndarray, candidates: list[int], f: int) -> list[int]:
    """Candidates by Krum score (sum of the max(r-f-2, 1) nearest squared distances among
    the r candidates), exact ties by total squared distance to the whole set."""
    r = len(candidates)

    def score(c: int) -> float:
        others = sorted(dist[c, j] for j in candidates if j != c)
        return float(sum(others[: max(r - f - 2, 1)])) if others else 0.0

    return sorted(candidates, key=lambda c: (score(c), dist[c].sum()))


def ref_krum(values: np.ndarray, w: np.ndarray, f: int) -> np.ndarray:
    return values[_krum_ranking(_squared_distances(values), list(range(len(values))), f)[0]]


def ref_multi_krum(values: np.ndarray, w: np.ndarray, f: int) -> np.ndarray:
    ranking = _krum_ranking(_squared_distances(values), list(range(len(values))), f)
    chosen = ranking[: len(values) - f]
    return _average(values[chosen], w[chosen])


def ref_bulyan(values: np.ndarray, w: np.ndarray, f: int) -> np.ndarray:
    """El Mhamdi, Guerraoui & Rouault (ICML 2018): theta = n - 2f vectors by repeated Krum,
    then per coordinate the beta = theta - 2f selected values closest to their median,
    averaged (with their weights; ties keep the lower value)."""
    dist = _squared_distances(values)
    remaining, selected = list(range(len(values))), []
    for _ in range(len(values) - 2 * f):
        best = _krum_ranking(dist, remaining, f)[0]
        selected.append(best)
        remaining.remove(best)
    beta = len(selected) - 2 * f
    out = np.empty(values.shape[1])
    for c in range(values.shape[1]):
        median = float(np.median(values[selected, c]))
        pairs = _by_value_then_weight(values[selected, c], w[selected])
        closest = np.array(sorted(pairs, key=lambda p: abs(p[0] - median))[:beta])
        out[c] = _average(closest[:, :1], closest[:, 1])[0]
    return out


def ref_geometric_median(values: np.ndarray, w: np.ndarray, nu: float, T: int) -> np.ndarray:
    """Smoothed Weiszfeld from the weighted coordinate-wise median, T steps."""
    v = ref_median(values, w)
    for _ in range(T):
        beta = w / np.maximum(nu, np.linalg.norm(values - v, axis=1))
        v = (beta[:, None] * values).sum(0) / beta.sum()
    return v


def _clip(z: np.ndarray, tau: float) -> np.ndarray:
    norm = float(np.linalg.norm(z))
    return z if norm <= tau else z * (tau / norm)


def ref_centered_clipping(
    values: np.ndarray, w: np.ndarray, tau: float, L: int, centre: np.ndarray
) -> np.ndarray:
    v = centre.copy()
    for _ in range(L):
        v = v + sum(w[c] * _clip(values[c] - v, tau) for c in range(len(values)))
    return v


def ref_clipped_gossip(values: np.ndarray, w: np.ndarray, tau: float | None, f: int) -> np.ndarray:
    """x_i + sum_j W_ij clip(x_j - x_i, tau_i); tau=None: tau_i = the (f+1)-th largest
    ||x_j - x_i|| (0 with at most f neighbours)."""
    own = values[0]
    if tau is None:
        far = sorted((float(np.linalg.norm(x - own)) for x in values[1:]), reverse=True)
        tau = far[f] if len(far) > f else 0.0
    return own + sum(w[j] * _clip(values[j] - own, tau) for j in range(1, len(values)))


def ref_nnm(values: np.ndarray, f: int) -> np.ndarray:
    """Allouah et al. (AISTATS 2023): each member becomes the mean of its n - f nearest."""
    dist = _squared_distances(values)
    count = len(values) - f
    return np.array(
        [values[np.argsort(dist[c], kind="stable")[:count]].mean(0) for c in range(len(values))]
    )


# --- the rules under test ---------------------------------------------------------------

Reference = Callable[[np.ndarray, np.ndarray, int, np.ndarray], np.ndarray]


def _krum_bound(n: int) -> int:
    return (n - 3) // 2  # n > 2f + 2


#: spec template in the budget f -> (largest f the bound allows at n, reference(values, w, f,
#: centre)); ``centre`` is the node's previous result (the own vector on the first call).
RULES: dict[str, tuple[Callable[[int], int], Reference]] = {
    "mean": (lambda n: 0, lambda v, w, f, c: ref_mean(v, w)),
    "median": (lambda n: 0, lambda v, w, f, c: ref_median(v, w)),
    "trimmed-mean:b={f}": (lambda n: (n - 1) // 2, lambda v, w, f, c: ref_trimmed_mean(v, w, f)),
    "krum:f={f}": (_krum_bound, lambda v, w, f, c: ref_krum(v, w, f)),
    "multi-krum:f={f}": (_krum_bound, lambda v, w, f, c: ref_multi_krum(v, w, f)),
    "bulyan:f={f}": (lambda n: (n - 3) // 4, lambda v, w, f, c: ref_bulyan(v, w, f)),
    "geometric-median:nu=1e-6,T=5": (
        lambda n: 0,
        lambda v, w, f, c: ref_geometric_median(v, w, 1e-6, 5),
    ),
    "centered-clipping:tau=0.5,L=3": (
        lambda n: 0,
        lambda v, w, f, c: ref_centered_clipping(v, w, 0.5, 3, c),
    ),
    "clipped-gossip:tau=auto,f={f}": (
        lambda n: n - 1,
        lambda v, w, f, c: ref_clipped_gossip(v, w, None, f),
    ),
    "clipped-gossip:tau=0.3": (lambda n: 0, lambda v, w, f, c: ref_clipped_gossip(v, w, 0.3, 0)),
    "nnm:f={f}+krum:f={f}": (_krum_bound, lambda v, w, f, c: ref_krum(ref_nnm(v, f), w, f)),
    "nnm:f={f}+trimmed-mean:b={f}": (
        lambda n: (n - 1) // 2,
        lambda v, w, f, c: ref_trimmed_mean(ref_nnm(v, f), w, f),
    ),
}
# NNM makes tied values systematic and a weighted trimmed mean jumps where tied values with
# different weights swap, so rounding can flip it (docs/consensus.md): uniform weights only.
UNIFORM_ONLY = {"nnm:f={f}+trimmed-mean:b={f}"}


def neighbourhoods(
    sizes: list[int], seed: int, d: int, uniform: bool, extra_slots: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """own [B, d], neighbours [B, k, d], weights [B, k], mask [B, k] for nodes of ``sizes``
    vectors each (own included; 1 = alone: every slot masked), padded with garbage."""
    g = torch.Generator().manual_seed(seed)
    batch, k = len(sizes), max(sizes) - 1 + extra_slots
    own = torch.randn(batch, d, generator=g, dtype=torch.float64)
    neighbours = own[:, None, :] + torch.randn(batch, k, d, generator=g, dtype=torch.float64)
    mask = torch.zeros(batch, k, dtype=torch.bool)
    weights = torch.zeros(batch, k, dtype=torch.float64)
    for b, n in enumerate(sizes):
        slots = torch.randperm(k, generator=g)[: n - 1]
        mask[b, slots] = True
        if uniform:
            weights[b, slots] = 1.0 / n
        else:
            weights[b, slots] = (
                0.2 + 0.8 * torch.rand(n - 1, generator=g, dtype=torch.float64)
            ) / n
    # padding is ignored whatever it holds: NaN, or finite values whose squares overflow
    neighbours[~mask] = float("nan") if seed % 2 else 3e38
    weights[~mask] = 0.5
    return own, neighbours, weights, mask


def check_three_ways(
    template: str,
    f: int,
    own: torch.Tensor,
    neighbours: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    """Batched == per node == reference, over two calls (a stateful rule keeps its state)."""
    spec = template.format(f=f)
    _, reference = RULES[template]
    batched = consensus.build(spec)
    singles = [consensus.build(spec) for _ in range(own.shape[0])]
    centres = own.numpy().copy()  # centred clipping starts from the own vector
    for scale in (1.0, 0.5):  # the second round starts from the first round's state
        together = batched(own * scale, neighbours, weights, mask)
        for b, single in enumerate(singles):
            keep = mask[b]
            mine = own[b] * scale
            per_node = single(mine, neighbours[b][keep], weights[b][keep])
            values = torch.cat([mine[None], neighbours[b][keep]]).numpy()
            w = np.concatenate([[1.0 - float(weights[b][keep].sum())], weights[b][keep].numpy()])
            expected = values[0] if len(values) == 1 else reference(values, w, f, centres[b])
            centres[b] = expected  # the previous result: the next call's centre
            expected_t = torch.from_numpy(np.asarray(expected, dtype=np.float64))
            torch.testing.assert_close(per_node, expected_t, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(together[b], per_node, rtol=1e-9, atol=1e-9)
            if len(values) == 1:  # no neighbour: the own vector, bit for bit
                assert torch.equal(per_node, mine) and torch.equal(together[b], mine)


@st.composite
def batches(draw: Any) -> dict[str, Any]:
    smallest = draw(st.one_of(st.integers(15, 25), st.integers(3, 14)))
    if draw(st.booleans()):  # one size: the uniform-weight fast paths run batched
        sizes = [smallest] * draw(st.integers(1, 3))
    else:
        sizes = [smallest, *draw(st.lists(st.integers(smallest, 25), max_size=3))]
    sizes += [1] * draw(st.integers(0, 2))  # nodes to which nothing arrived
    seed = draw(st.integers(0, 2**31 - 1))
    order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(seed)).tolist()
    return {
        "sizes": [sizes[i] for i in order],
        "smallest": smallest,
        "slack": draw(st.sampled_from([0, 0, 1])),  # f at the bound, or one below
        "seed": seed,
        "d": draw(st.integers(1, 5)),
        "uniform": draw(st.booleans()),
        "extra_slots": draw(st.integers(0, 2)),
    }


@pytest.mark.parametrize("template", list(RULES))
@settings(max_examples=25)
@given(case=batches())
def test_batched_equals_per_node_equals_reference(template: str, case: dict[str, Any]) -> None:
    largest_f, _ = RULES[template]
    f = max(largest_f(case["smallest"]) - case["slack"], 0)
    uniform = case["uniform"] or template in UNIFORM_ONLY
    own, neighbours, weights, mask = neighbourhoods(
        case["sizes"], case["seed"], case["d"], uniform, case["extra_slots"]
    )
    check_three_ways(template, f, own, neighbours, weights, mask)


WEIGHTINGS = [
    (template, uniform)
    for template in RULES
    for uniform in (True, False)
    if uniform or template not in UNIFORM_ONLY
]


@pytest.mark.parametrize("n", range(15, 26))
@pytest.mark.parametrize(("template", "uniform"), WEIGHTINGS)
def test_every_size_from_15_to_25_at_the_largest_budget(
    template: str, uniform: bool, n: int
) -> None:
    """Every n in 15..25 at the bound's f: three nodes of that size, batched and one by one."""
    largest_f, _ = RULES[template]
    own, neighbours, weights, mask = neighbourhoods([n, n, n], 1000 + n, 3, uniform, 0)
    check_three_ways(template, largest_f(n), own, neighbours, weights, mask)


def test_bulyan_uniform_window_counts_only_the_beta_closest() -> None:
    """n = 15, f = 3 after the Krum selection: theta = 9 sorted values, beta = 3. The three
    closest to the median 0 are rows 4..6, so row 3 (-6) must not be added (the old fast path
    added every row j >= beta whose window could start after j - beta, never checking that
    it started at or before j)."""
    from consensus.krum import _closest_to_median_uniform

    column = [-9.0, -8.0, -7.0, -6.0, 0.0, 0.1, 0.2, 9.0, 10.0]
    rows = [torch.tensor([[v]], dtype=torch.float64) for v in column]
    out = _closest_to_median_uniform(rows, theta=9, beta=3)
    torch.testing.assert_close(out, torch.tensor([[0.1]], dtype=torch.float64))  # (0+.1+.2)/3


# --- no neighbours: every registered rule and wrapper returns the own vector ------------------

BASE_RULES = [name for name, entry in consensus.AGGREGATORS.items() if not entry.wrapper]
WRAPPERS = [name for name, entry in consensus.AGGREGATORS.items() if entry.wrapper]
EVERY_SPEC = BASE_RULES + [f"{wrapper}+{rule}" for wrapper in WRAPPERS for rule in BASE_RULES]


@pytest.mark.parametrize("spec", EVERY_SPEC)
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_no_neighbours_returns_the_own_vector(spec: str, batch: tuple[int, ...]) -> None:
    """k = 0 (a peer alone) and every slot masked (nothing arrived): own, unchanged, twice."""
    own = torch.randn(*batch, 5, generator=torch.Generator().manual_seed(1))
    rule = consensus.build(spec)
    for _ in range(2):  # a stateful rule's state after the first call is consistent
        out = rule(own, torch.empty(*batch, 0, 5), torch.empty(*batch, 0))
        assert out.shape == own.shape and torch.equal(out, own)
        assert out.data_ptr() != own.data_ptr()  # a new tensor, as for any other input
    masked = rule(
        own,
        torch.randn(*batch, 3, 5),
        torch.full((*batch, 3), 0.2),
        torch.zeros(*batch, 3, dtype=torch.bool),
    )
    assert torch.equal(masked, own)


@pytest.mark.parametrize("spec", EVERY_SPEC)
def test_nodes_alone_in_a_batch_keep_their_own_vector(spec: str) -> None:
    """A batch mixing nodes without neighbours and nodes with 12: the lone ones get their own
    vector (no bound is checked for them), the others what their own call gives."""
    sizes = [13, 1, 13, 1]
    own, neighbours, weights, mask = neighbourhoods(sizes, 5, 4, uniform=False, extra_slots=1)
    together = consensus.build(spec)(own, neighbours, weights, mask)
    for b, n in enumerate(sizes):
        if n == 1:
            assert torch.equal(together[b], own[b])
        elif not spec.startswith("bucketing"):  # bucketing draws its shuffles per call
            keep = mask[b]
            single = consensus.build(spec)(own[b], neighbours[b][keep], weights[b][keep])
            torch.testing.assert_close(together[b], single, rtol=1e-9, atol=1e-9)


def test_centered_clipping_centre_of_a_lone_node_is_its_own_vector() -> None:
    """The centre is the previous result: for a node that was alone, its own vector."""
    own, neighbours, weights, mask = neighbourhoods([6, 1], 3, 3, uniform=True, extra_slots=0)
    rule = consensus.build("centered-clipping:tau=0.1")
    first = rule(own, neighbours, weights, mask)
    assert rule.centre is not None  # type: ignore[attr-defined]
    torch.testing.assert_close(rule.centre, first)  # type: ignore[attr-defined]
    assert torch.equal(rule.centre[1], own[1])  # type: ignore[attr-defined]
    everyone_alone = torch.zeros_like(mask)
    again = rule(own + 1, neighbours, weights, everyone_alone)
    assert torch.equal(again, own + 1)
    assert torch.equal(rule.centre, own + 1)  # type: ignore[attr-defined]


def test_clipped_gossip_radius_of_a_lone_node_is_zero() -> None:
    own, neighbours, weights, mask = neighbourhoods([6, 1], 3, 3, uniform=True, extra_slots=0)
    rule = consensus.build("clipped-gossip:tau=2.5")
    rule(own, neighbours, weights, mask)
    assert rule.radius is not None and rule.radius.tolist() == [2.5, 0.0]  # type: ignore[attr-defined]
    rule(own, neighbours, weights, torch.zeros_like(mask))
    assert rule.radius.tolist() == [0.0, 0.0]  # type: ignore[attr-defined]
