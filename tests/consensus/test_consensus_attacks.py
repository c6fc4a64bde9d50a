"""Byzantine attacks: formulas, batching, seeding, and robust rules surviving them in a gossip loop."""

from __future__ import annotations

import pytest
import torch

import consensus


@pytest.mark.parametrize(("n", "f", "z"), [(25, 5, 0.253), (20, 4, 0.157), (16, 2, 0.0)])
def test_alie_z_from_the_formula(n: int, f: int, z: float) -> None:
    from scipy.stats import norm  # here: scipy.stats costs each xdist worker ~0.5 s to collect

    assert consensus.alie_z(n, f) == pytest.approx(z, abs=5e-4)
    s = n // 2 + 1 - f
    assert consensus.alie_z(n, f) == pytest.approx(norm.ppf((n - f - s) / (n - f)), abs=1e-12)


def test_alie_z_rejects_degenerate_sizes() -> None:
    with pytest.raises(ValueError, match=r"alie needs 0 < \(n-f-s\)/\(n-f\) < 1"):
        consensus.alie_z(2, 0)


def honest_batch(seed: int = 0, batch: int = 3, h: int = 6, d: int = 5):
    g = torch.Generator().manual_seed(seed)
    own = torch.randn(batch, d, generator=g, dtype=torch.float64)
    honest = torch.randn(batch, h, d, generator=g, dtype=torch.float64)
    mask = torch.rand(batch, h, generator=g) < 0.8
    mask[:, 0] = True
    return own, honest, mask


def test_alie_sends_mean_minus_z_std_of_the_present_honest_messages() -> None:
    own, honest, mask = honest_batch()
    out = consensus.build_attack("alie:f=2")(own, honest, honest_mask=mask)
    for b in range(own.shape[0]):
        present = honest[b][mask[b]]
        z = consensus.alie_z(int(mask[b].sum()) + 2, 2)
        expected = present.mean(0) - z * present.std(0)
        torch.testing.assert_close(out[b], expected)
    fixed = consensus.build_attack("alie:z=1.5")(own, honest, honest_mask=mask)
    present = honest[0][mask[0]]
    torch.testing.assert_close(fixed[0], present.mean(0) - 1.5 * present.std(0))


def test_simple_attacks() -> None:
    own, honest, mask = honest_batch()
    assert torch.equal(consensus.build_attack("sign-flip")(own), -own)
    assert torch.equal(consensus.build_attack("scaling:scale=-3")(own), -3 * own)
    ipm = consensus.build_attack("ipm:epsilon=0.5")(own, honest, honest_mask=mask)
    m = mask[..., None].double()
    torch.testing.assert_close(ipm, -0.5 * (honest * m).sum(1) / m.sum(1))


def test_gaussian_noise_is_seeded_and_has_the_requested_scale() -> None:
    own = torch.zeros(2, 20000)
    a = consensus.build_attack("gaussian:sigma=3,seed=7")
    b = consensus.build_attack("gaussian:sigma=3,seed=7")
    first = a(own)
    assert torch.equal(first, b(own))
    assert not torch.equal(first, a(own))  # the generator advances
    assert float(first.std()) == pytest.approx(3.0, rel=0.03)
    a.reset()
    assert torch.equal(a(own), first)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(a(own, generator=g1), b(own, generator=g2))


def test_mimic_copies_the_chosen_present_honest_message() -> None:
    own, honest, mask = honest_batch(h=4)
    mask[0] = torch.tensor([True, False, True, True])
    out = consensus.build_attack("mimic:index=1")(own, honest, honest_mask=mask)
    assert torch.equal(out[0], honest[0, 2])  # the second present one
    many = consensus.build_attack("mimic:index=9")(own, honest, honest_mask=mask)
    assert torch.equal(many[0], honest[0, 3])  # clamped to the last present one


def test_dissensus_with_epsilon_one_freezes_the_target_under_plain_gossip() -> None:
    """x_i + sum_h W_ih (x_h - x_i) + W_byz (x_byz - x_i) = x_i - (epsilon - 1) * pull."""
    own, honest, mask = honest_batch(h=5)
    target = own + 1
    weights = torch.full(mask.shape, 0.12, dtype=torch.float64)
    byzantine = torch.full((own.shape[0],), 0.2, dtype=torch.float64)  # two Byzantine at 0.1
    for epsilon in (1.0, 2.0):
        attack = consensus.build_attack(f"dissensus:epsilon={epsilon}")
        sent = attack(
            own,
            honest,
            honest_mask=mask,
            target=target,
            honest_weights=weights,
            byzantine_weight=byzantine,
        )
        neighbours = torch.cat([honest, sent[:, None], sent[:, None]], dim=1)
        all_weights = torch.cat(
            [weights, torch.full((own.shape[0], 2), 0.1, dtype=torch.float64)], 1
        )
        all_mask = torch.cat([mask, torch.ones(own.shape[0], 2, dtype=torch.bool)], 1)
        mixed = consensus.weighted_mean(target, neighbours, all_weights, all_mask)
        pull = consensus.weighted_mean(target, honest, weights, mask) - target
        torch.testing.assert_close(mixed, target - (epsilon - 1) * pull)


def test_batched_attacks_equal_per_node_attacks() -> None:
    own, honest, mask = honest_batch(batch=4)
    weights = torch.full(mask.shape, 0.1, dtype=torch.float64)
    byzantine = torch.full((4,), 0.2, dtype=torch.float64)
    for spec in ["alie:f=1", "ipm", "mimic:index=2", "dissensus:epsilon=0.5", "sign-flip"]:
        attack = consensus.build_attack(spec)
        together = attack(
            own,
            honest,
            honest_mask=mask,
            target=own * 2,
            honest_weights=weights,
            byzantine_weight=byzantine,
        )
        for b in range(4):
            single = attack(
                own[b],
                honest[b],
                honest_mask=mask[b],
                target=own[b] * 2,
                honest_weights=weights[b],
                byzantine_weight=byzantine[b],
            )
            torch.testing.assert_close(together[b], single)


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("alie", {}, r"alie needs the honest messages \(honest \[\*, h, d\]\)"),
        ("dissensus", {"honest": True}, "dissensus needs target"),
        ("ipm", {"honest": "short"}, r"ipm: honest must have shape \[\*, h, d\] matching own"),
        (
            "ipm",
            {"honest": True, "honest_mask": "none"},
            "every node needs at least one honest message",
        ),
    ],
)
def test_attack_input_errors(spec: str, kwargs: dict[str, object], message: str) -> None:
    own, honest, mask = honest_batch()
    call: dict[str, object] = {}
    if kwargs.get("honest") is True:
        call["honest"] = honest
    elif kwargs.get("honest") == "short":
        call["honest"] = honest[..., :2]
    if kwargs.get("honest_mask") == "none":
        call["honest_mask"] = torch.zeros_like(mask)
    with pytest.raises(ValueError, match=message):
        consensus.build_attack(spec)(own, **call)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize(
    "spec", ["mean", "median", "trimmed-mean:b=2", "krum:f=2", "clipped-gossip:f=2"]
)
def test_garbage_non_finite_messages_are_masked_by_every_rule(kind: str, spec: str) -> None:
    own, honest, _ = honest_batch(h=9)
    garbage = consensus.build_attack(f"garbage:kind={kind},seed=3")(own[:, None].expand(-1, 2, -1))
    assert int((~torch.isfinite(garbage)).sum()) == 6  # one coordinate per message
    neighbours = torch.cat([honest, garbage], dim=1)
    weights = torch.full(neighbours.shape[:2], 1 / 12, dtype=torch.float64)
    out = consensus.build(spec)(own, neighbours, weights)
    assert bool(torch.isfinite(out).all())
    keep = torch.ones(neighbours.shape[:2], dtype=torch.bool)
    keep[:, 9:] = False
    reference_spec = spec.replace("2", "0")  # both garbage rows spend the budget
    torch.testing.assert_close(out, consensus.build(reference_spec)(own, neighbours, weights, keep))


def test_garbage_huge_and_wrong_length() -> None:
    own, honest, _ = honest_batch(h=9)
    huge = consensus.build_attack("garbage:kind=huge,value=1e30")(own)
    assert bool((huge.abs() == 1e30).all())
    neighbours = torch.cat([honest, huge[:, None]], dim=1)
    weights = torch.full(neighbours.shape[:2], 0.1, dtype=torch.float64)
    out = consensus.build("trimmed-mean:b=1")(own, neighbours, weights)
    assert float(out.abs().max()) < 10
    long = consensus.build_attack("garbage:kind=wrong-length")(own)
    assert long.shape == (3, 6)
    with pytest.raises(ValueError, match="neighbours must have shape"):
        consensus.build("median")(own, torch.cat([honest, honest], -1)[..., :6], weights[:, :9])


def gossip_with_byzantine(
    rule_spec: str, attack_spec: str, rounds: int = 20
) -> tuple[float, float]:
    """12 honest + 3 Byzantine nodes on a complete graph, gossip for some rounds, batched.

    Returns (distance of the honest average from where it started, final honest spread),
    both in units of the initial honest spread.
    """
    honest_n, byzantine_n, d = 12, 3, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(honest_n, d, generator=g, dtype=torch.float64) + 5
    start_mean, start_spread = x.mean(0), float((x - x.mean(0)).norm(dim=1).max())
    rule = consensus.build(rule_spec)
    attack = consensus.build_attack(attack_spec)
    n = honest_n + byzantine_n
    w = 1.0 / n
    others = torch.tensor([[j for j in range(honest_n) if j != i] for i in range(honest_n)])
    for _ in range(rounds):
        honest_seen = x[others]  # [12, 11, d]: what each target receives from honest nodes
        sent = attack(
            x,
            honest_seen,
            target=x,
            honest_weights=torch.full(others.shape, w, dtype=torch.float64),
            byzantine_weight=torch.full((honest_n,), byzantine_n * w, dtype=torch.float64),
            generator=g,
        )  # one message per target, sent by all Byzantine nodes
        neighbours = torch.cat([honest_seen, sent[:, None].expand(-1, byzantine_n, -1)], dim=1)
        x = rule(x, neighbours, torch.full(neighbours.shape[:2], w, dtype=torch.float64))
    drift = float((x.mean(0) - start_mean).norm()) / start_spread
    spread = float((x - x.mean(0)).norm(dim=1).max()) / start_spread
    return drift, spread


@pytest.mark.parametrize(
    "attack", ["sign-flip", "scaling:scale=-50", "ipm:epsilon=10", "alie:f=3,z=20"]
)
def test_plain_gossip_is_dragged_away_but_robust_rules_hold(attack: str) -> None:
    drift, _ = gossip_with_byzantine("mean", attack)
    assert drift > 3
    for rule in [
        "trimmed-mean:b=3",
        "krum:f=3",
        "median",
        "clipped-gossip:tau=auto,f=3",
        "bulyan:f=3",
    ]:
        drift, spread = gossip_with_byzantine(rule, attack)
        assert drift < 1.0, (rule, drift)
        assert spread < 1.0, (rule, spread)


def test_dissensus_keeps_plain_gossip_from_converging_but_not_clipped_gossip() -> None:
    _, spread_mean = gossip_with_byzantine("mean", "dissensus:epsilon=1.5")
    _, spread_clipped = gossip_with_byzantine(
        "clipped-gossip:tau=auto,f=3", "dissensus:epsilon=1.5"
    )
    assert spread_mean > 1.0
    assert spread_clipped < 0.1
