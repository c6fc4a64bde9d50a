"""Byzantine injection: the batched inboxes (simulator) and one node's message (peer) agree."""

from __future__ import annotations

import pytest
import torch

import consensus
import topologies

STOCHASTIC = {"gaussian", "garbage"}  # draw from the generator: compared by seed, not by value


def random_table(seed: int = 0, n: int = 10, k: int = 4, m: int = 5):
    """A neighbour table with padding, unequal weights and Byzantine senders 2, 5 and 7."""
    g = torch.Generator().manual_seed(seed)
    sent = torch.randn(n, m, generator=g, dtype=torch.float64)
    index = torch.stack(
        [(i + 1 + torch.randperm(n - 1, generator=g)[:k]) % n for i in range(n)]
    )  # k distinct senders, never the receiver itself
    mask = torch.rand(n, k, generator=g) < 0.85
    weights = torch.rand(n, k, generator=g, dtype=torch.float64) / (k + 1)
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[[2, 5, 7]] = True
    received = sent[index]
    received[~mask] = float("nan")  # padding may hold anything
    return sent, received, index, weights, mask, byzantine


def test_the_random_table_has_receivers_with_zero_one_and_two_byzantine_neighbours() -> None:
    _sent, _received, index, _weights, mask, byzantine = random_table()
    counts = set((mask & byzantine[index]).sum(1).tolist())
    assert {0, 1, 2} <= counts
    assert bool((~mask).any())


def per_node_inboxes(attack: consensus.Attack, table, *, compact: bool, seed: int = 0):
    """The batched result rebuilt from one ``byzantine_message`` call per Byzantine slot.

    ``compact``: hand each call only the present honest rows (a peer's view); else the
    whole inbox row with Byzantine and padding slots masked out.
    """
    sent, received, index, weights, mask, byzantine = table
    out = received.clone()
    slots = mask & byzantine[index]
    for i in range(sent.shape[0]):
        honest = mask[i] & ~byzantine[index[i]]
        view = {
            "target": sent[i],
            "honest": received[i][honest] if compact else received[i],
            "honest_weights": weights[i][honest] if compact else weights[i],
            "honest_mask": None if compact else honest,
            "byzantine_weight": float(weights[i][slots[i]].sum()),
            "byzantine_count": int(slots[i].sum()),
        }
        for p in slots[i].nonzero().squeeze(1).tolist():
            generator = torch.Generator().manual_seed(seed)
            out[i, p] = consensus.byzantine_message(
                attack, sent[index[i, p]], generator=generator, **view
            )
    return out


@pytest.mark.parametrize("name", sorted(set(consensus.ATTACKS) - STOCHASTIC))
@pytest.mark.parametrize("compact", [False, True])
def test_batched_inboxes_equal_one_per_node_call_per_byzantine_slot(
    name: str, compact: bool
) -> None:
    table = random_table()
    attack = consensus.build_attack(name)
    batched = consensus.byzantine_messages(attack, *table)
    looped = per_node_inboxes(attack, table, compact=compact)
    torch.testing.assert_close(batched, looped, equal_nan=True)
    _sent, _received, index, _weights, mask, byzantine = table
    assert bool(torch.isfinite(batched[mask & byzantine[index]]).all())  # NaN padding stays out


def test_the_stochastic_attacks_are_registered() -> None:
    assert set(consensus.ATTACKS) >= STOCHASTIC


@pytest.mark.parametrize("spec", ["gaussian:sigma=2", "garbage:kind=nan", "garbage:kind=huge"])
def test_stochastic_attacks_are_reproducible_from_the_generator_seed(spec: str) -> None:
    table = random_table()
    _sent, received, index, _weights, mask, byzantine = table
    attack = consensus.build_attack(spec)

    def batched(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return consensus.byzantine_messages(attack, *table, generator=generator)

    first, again, other = batched(3), batched(3), batched(4)
    torch.testing.assert_close(first, again, equal_nan=True, rtol=0, atol=0)
    slots = mask & byzantine[index]
    assert first.shape == received.shape
    assert not torch.equal(first[slots].nan_to_num(), other[slots].nan_to_num())
    bad = ~torch.isfinite(first[slots])
    if spec == "garbage:kind=nan":
        assert bad.sum(1).eq(1).all()  # one NaN coordinate per Byzantine message
    else:
        assert not bool(bad.any())
    looped = per_node_inboxes(attack, table, compact=True, seed=3)
    assert looped.shape == received.shape
    torch.testing.assert_close(
        looped, per_node_inboxes(attack, table, compact=True, seed=3), equal_nan=True
    )


@pytest.mark.parametrize("name", sorted(consensus.ATTACKS))
def test_honest_and_padding_slots_are_untouched_bit_for_bit(name: str) -> None:
    table = random_table()
    sent, received, index, _weights, mask, byzantine = table
    attack = consensus.build_attack(name)
    if name == "garbage":
        attack = consensus.build_attack("garbage:kind=inf")
    out = consensus.byzantine_messages(attack, *table)
    assert out is not received
    keep = ~(mask & byzantine[index])
    torch.testing.assert_close(out[keep], received[keep], equal_nan=True, rtol=0, atol=0)
    assert not torch.equal(out[~keep], received[~keep])
    assert torch.equal(received[mask], sent[index][mask])  # the input is not modified


def test_no_byzantine_sender_returns_the_inbox_itself() -> None:
    sent, received, index, weights, mask, byzantine = random_table()
    attack = consensus.build_attack("alie")
    none = torch.zeros_like(byzantine)
    assert consensus.byzantine_messages(attack, sent, received, index, weights, mask, none) is (
        received
    )
    # Byzantine nodes whose every slot is absent (crashed, messages lost) inject nothing
    silent = mask & ~byzantine[index]
    assert (
        consensus.byzantine_messages(attack, sent, received, index, weights, silent, byzantine)
        is received
    )


def test_byzantine_messages_replace_only_byzantine_slots_with_the_attack() -> None:
    sent = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    index = torch.tensor([[1, 3], [0, 2], [1, 3], [2, 0]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    weights = torch.full((4, 2), 1 / 3)
    byzantine = torch.tensor([False, False, False, True])
    received = consensus.byzantine_messages(
        consensus.build_attack("sign-flip"), sent, sent[index], index, weights, mask, byzantine
    )
    expected = sent[index].clone()
    expected[0, 1] = -sent[3]
    expected[2, 1] = -sent[3]
    torch.testing.assert_close(received, expected)


def test_omniscient_attack_sends_one_vector_per_receiver_from_its_honest_view() -> None:
    sent = torch.randn(5, 4)
    index = torch.tensor([[1, 3, 4], [0, 2, 3], [1, 3, 4], [2, 0, 1], [0, 2, 3]])
    mask = torch.ones(5, 3, dtype=torch.bool)
    weights = torch.full((5, 3), 0.25)
    byzantine = torch.tensor([False, False, False, True, True])
    attack = consensus.build_attack("alie:z=1.5")
    received = consensus.byzantine_messages(
        attack, sent, sent[index], index, weights, mask, byzantine
    )
    # receiver 0 hears Byzantine 3 and 4: both slots carry the same vector, computed from
    # what receiver 0 sees honestly (its own message and peer 1's)
    assert torch.equal(received[0, 1], received[0, 2])
    expected = attack(
        sent[3].unsqueeze(0),
        torch.stack([sent[0], sent[1]]).unsqueeze(0),
        target=sent[0].unsqueeze(0),
    )[0]
    torch.testing.assert_close(received[0, 1], expected)
    torch.testing.assert_close(received[0, 0], sent[1])
    torch.testing.assert_close(received[1, 1], sent[2])


def test_alie_z_comes_from_each_receivers_real_neighbourhood_and_byzantine_count() -> None:
    """A complete graph of 9 with Byzantine peers 7, 8 and a ring of receivers that hear one:
    z = Φ⁻¹((n − f − s)/(n − f)) with each receiver's own n and f, not the configured f."""
    n = 12
    generator = torch.Generator().manual_seed(0)
    sent = torch.randn(n, 6, generator=generator)
    graph = topologies.build("complete", 9)
    graph.add_edges_from([(8, 9), (9, 10), (10, 11), (11, 0)])
    table = topologies.neighbour_table(topologies.mixing_matrix(graph))
    index = torch.as_tensor(table.index)
    mask = torch.as_tensor(table.mask)
    weights = torch.as_tensor(table.weight, dtype=torch.float32)
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[[7, 8]] = True
    attack = consensus.build_attack("alie:f=1")  # the configured f is not what peers see
    received = consensus.byzantine_messages(
        attack, sent, sent[index], index, weights, mask, byzantine
    )
    checked = set()
    for receiver in range(n):
        present = mask[receiver]
        bad = present & byzantine[index[receiver]]
        if not bool(bad.any()) or byzantine[receiver]:
            continue
        size, f = int(present.sum()) + 1, int(bad.sum())
        honest = torch.cat([sent[receiver : receiver + 1], sent[index[receiver][present & ~bad]]])
        mean, std = honest.mean(0), honest.std(0)
        expected = mean - consensus.alie_z(size, f) * std
        for slot in bad.nonzero().squeeze(1).tolist():
            torch.testing.assert_close(received[receiver, slot], expected)
        # a peer playing Byzantine 8 against this receiver sends the same vector
        alone = consensus.byzantine_message(
            attack,
            sent[8],
            target=sent[receiver],
            honest=sent[index[receiver][present & ~bad]],
            honest_weights=weights[receiver][present & ~bad],
            byzantine_weight=float(weights[receiver][bad].sum()),
            byzantine_count=f,
        )
        torch.testing.assert_close(alone, expected)
        checked.add((size, f))
    # peers 1..6 see (n=9, f=2), peer 0 (n=10, f=2), peer 9 (n=3, f=1): three different z
    assert {(9, 2), (10, 2), (3, 1)} <= checked
    assert consensus.alie_z(9, 2) != consensus.alie_z(9, 1)


def test_alie_for_neighbourhood_takes_n_and_f_unless_z_is_fixed_or_undefined() -> None:
    alie = consensus.build_attack("alie:f=1")
    assert isinstance(alie, consensus.ALittleIsEnough)
    variant = alie.for_neighbourhood(9, 2)
    assert isinstance(variant, consensus.ALittleIsEnough)
    assert (variant.n, variant.f, variant.z) == (9, 2, None)
    # Byzantine majority at the receiver: s = floor(3/2 + 1) - 2 = 0, no z; runs as configured
    assert alie.for_neighbourhood(3, 2) is alie
    fixed = consensus.build_attack("alie:z=1.5")
    assert fixed.for_neighbourhood(9, 2) is fixed
    for name in sorted(set(consensus.ATTACKS) - {"alie"}):
        attack = consensus.build_attack(name)
        assert attack.for_neighbourhood(9, 2) is attack
    with pytest.raises(ValueError, match="needs 0 <= f < n"):
        alie.for_neighbourhood(3, 3)
    with pytest.raises(ValueError, match="alie: parameter n must be an integer >= 1"):
        alie.for_neighbourhood(0, 0)


def test_alie_runs_as_configured_where_the_receivers_z_is_undefined() -> None:
    """Receiver 0 hears honest 1 and Byzantine 2, 3, 4: (n, f) = (5, 3) gives s = 0, no z
    there, so the configured n = 9, f = 1 decide z; receiver 5 (n = 5, f = 2) gets its own."""
    sent = torch.randn(6, 3, dtype=torch.float64)
    index = torch.tensor(
        [[1, 2, 3, 4], [0, 5, 2, 3], [0, 1, 3, 4], [0, 1, 2, 4], [0, 1, 2, 3], [0, 1, 2, 3]]
    )
    mask = torch.ones(6, 4, dtype=torch.bool)
    weights = torch.full((6, 4), 0.2, dtype=torch.float64)
    byzantine = torch.tensor([False, False, True, True, True, False])
    attack = consensus.build_attack("alie:f=1,n=9")
    received = consensus.byzantine_messages(
        attack, sent, sent[index], index, weights, mask, byzantine
    )
    for receiver, slot, honest, z in [
        (0, 1, sent[[0, 1]], consensus.alie_z(9, 1)),
        (5, 2, sent[[5, 0, 1]], consensus.alie_z(5, 2)),
    ]:
        expected = honest.mean(0) - z * honest.std(0)
        torch.testing.assert_close(received[receiver, slot], expected)
    assert consensus.alie_z(9, 1) != consensus.alie_z(5, 2)
    assert attack.for_neighbourhood(5, 3) is attack


def test_dissensus_gets_the_total_byzantine_weight_so_epsilon_one_freezes_the_target() -> None:
    """He, Karimireddy & Jaggi (2022): with ε = 1 under plain averaging the target's update is
    x_i + Σ_h W_ih (x_h − x_i) + Σ_b W_ib (x_byz − x_i) = x_i exactly when the Byzantine
    neighbours together carry the pull, i.e. byzantine_weight is their total weight."""
    n = 8
    generator = torch.Generator().manual_seed(1)
    sent = torch.randn(n, 5, generator=generator, dtype=torch.float64)
    table = topologies.neighbour_table(
        topologies.mixing_matrix(topologies.build("random-regular", n, degree=4, seed=0))
    )
    index = torch.as_tensor(table.index)
    mask = torch.as_tensor(table.mask)
    weights = torch.as_tensor(table.weight, dtype=torch.float64)
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[[2, 5]] = True
    received = consensus.byzantine_messages(
        consensus.build_attack("dissensus:epsilon=1"),
        sent,
        sent[index],
        index,
        weights,
        mask,
        byzantine,
    )
    mixed = consensus.build("mean")(sent, received, weights, mask)
    counts = (mask & byzantine[index]).sum(1)
    assert int(counts[~byzantine].max()) == 2  # someone hears both Byzantine peers
    for receiver in (~byzantine & (counts > 0)).nonzero().squeeze(1).tolist():
        torch.testing.assert_close(mixed[receiver], sent[receiver])
    untouched = ~byzantine & (counts == 0)
    expected = consensus.build("mean")(sent, sent[index], weights, mask)
    torch.testing.assert_close(mixed[untouched], expected[untouched])


def test_a_wrong_length_attack_cannot_enter_an_inbox_but_a_peer_can_send_it() -> None:
    table = random_table()
    attack = consensus.build_attack("garbage:kind=wrong-length")
    with pytest.raises(ValueError, match="cannot enter a batched inbox"):
        consensus.byzantine_messages(attack, *table)
    own = table[0][2]
    sent = consensus.byzantine_message(attack, own)
    assert sent.shape == (own.shape[0] + 1,)


def test_an_attack_on_own_messages_needs_no_view() -> None:
    own = torch.tensor([1.0, -2.0])
    assert torch.equal(
        consensus.byzantine_message(consensus.build_attack("scaling:scale=3"), own), 3 * own
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"own": torch.zeros(2, 3)}, "own must be a floating-point tensor of shape \\[m\\]"),
        ({"target": None}, "needs target \\[m\\], honest \\[h, m\\]"),
        ({"byzantine_count": None}, "needs target"),
        ({"target": torch.zeros(4)}, "target must have shape \\[3\\]"),
        ({"honest": torch.zeros(2, 4)}, "honest must have shape \\[h, 3\\]"),
        ({"honest_mask": torch.ones(2)}, "honest_mask must be a bool tensor of shape \\[2\\]"),
        ({"honest_weights": torch.ones(3)}, "honest_weights must have shape \\[2\\]"),
        ({"byzantine_weight": -0.1}, "byzantine_weight must be one finite number >= 0"),
        ({"byzantine_count": 0}, "byzantine_count must be an integer >= 1"),
    ],
)
def test_a_bad_view_is_refused_naming_the_field(change: dict, message: str) -> None:
    view = {
        "own": torch.zeros(3),
        "target": torch.ones(3),
        "honest": torch.randn(2, 3),
        "honest_weights": torch.full((2,), 0.25),
        "byzantine_weight": 0.25,
        "byzantine_count": 1,
    }
    view.update(change)
    own = view.pop("own")
    with pytest.raises(ValueError, match=message):
        consensus.byzantine_message(consensus.build_attack("ipm"), own, **view)


def test_a_bad_table_is_refused_naming_the_field() -> None:
    sent, received, index, weights, mask, byzantine = random_table()
    attack = consensus.build_attack("sign-flip")
    with pytest.raises(ValueError, match="weights must have shape"):
        consensus.byzantine_messages(attack, sent, received, index, weights[:, :2], mask, byzantine)
    with pytest.raises(ValueError, match="sent must have shape"):
        consensus.byzantine_messages(attack, sent[:3], received, index, weights, mask, byzantine)
