"""Secure neighbour sums (``gossip.secure_sum``): the masks cancel exactly, the sum decodes to
the weighted sum within the fixed point's rounding, a single masked message tells the receiver
nothing about its sender's model, a missing message leaves the receiver's model alone, and
every combination that cannot work is refused with one line."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import topologies
from gossip.algorithms import DecentralizedSGD
from gossip.configuration import GossipConfig
from gossip.secure_sum import (
    FRACTION_BITS,
    SecureSumError,
    SeededKeys,
    decode,
    encode,
    mask,
    mask_stream,
    masked_message,
    mix_sums,
    pair_key,
    public_bytes,
    secure_sums,
    unmask,
)
from gossip.settings import ConfigurationError
from sim.build import build
from sim.config import ConfigError, ExperimentConfig, experiment_from_dict
from sim.gossip_runner import SynchronousGossip
from sim.network import Crash, Failures
from sim.runner import run
from tests.sim.helpers import make_context

STEP = 2.0**-FRACTION_BITS


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(2, 5),
    d=st.integers(1, 33),
    round_=st.integers(0, 2**40),
    receiver=st.integers(0, 50),
    seed=st.integers(0, 2**16),
)
def test_the_masks_of_a_receivers_senders_cancel_exactly(
    k: int, d: int, round_: int, receiver: int, seed: int
) -> None:
    keys = SeededKeys(seed, 60)
    senders = list(range(51, 51 + k))
    masks = [mask(j, receiver, senders, round_, partial(keys.key, j), d) for j in senders]
    assert np.all(np.sum(np.stack(masks), axis=0, dtype=np.uint64) == 0)
    assert all(np.any(m != 0) for m in masks)  # each one alone is not zero
    # and the masked messages sum to the weighted sum, off by at most half a step a term
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(k, d, generator=g, dtype=torch.float64) * 100
    w = torch.rand(k, generator=g, dtype=torch.float64) / k
    messages = [
        masked_message(x[i], float(w[i]), j, receiver, senders, round_, partial(keys.key, j))
        for i, j in enumerate(senders)
    ]
    assert all(
        np.array_equal(m - masks[i], encode(x[i], float(w[i]))) for i, m in enumerate(messages)
    )
    expected = (w.unsqueeze(1) * x).sum(0)
    assert float((unmask(messages) - expected).abs().max()) <= k * STEP / 2 + 1e-12


def test_fixed_point_rounds_to_the_step_and_refuses_what_it_cannot_carry() -> None:
    x = torch.tensor([0.0, 1.0, -1.5, 3.14159265358979, -(2.0**29), 1e-12])
    assert torch.equal(decode(encode(x)), torch.round(x.double() / STEP) * STEP)
    assert float((decode(encode(x)) - x.double()).abs().max()) <= STEP / 2
    for bad in (float("nan"), float("inf"), 2.0**30, -(2.0**31)):
        with pytest.raises(SecureSumError, match="1 model coordinate"):
            encode(torch.tensor([0.5, bad]))


def test_both_ends_of_a_pair_derive_the_same_key_and_no_one_else_does() -> None:
    a, b, c = (X25519PrivateKey.from_private_bytes(bytes([i]) * 32) for i in (1, 2, 3))
    ab = pair_key(a, public_bytes(b))
    assert ab == pair_key(b, public_bytes(a)) and len(ab) == 32
    assert ab not in (pair_key(a, public_bytes(c)), pair_key(b, public_bytes(c)))
    with pytest.raises(ValueError, match="32 bytes"):
        pair_key(a, b"short")
    # the stream depends on the round and the receiver (no mask is ever reused)
    s = mask_stream(ab, 3, 1, 64)
    assert not np.array_equal(s, mask_stream(ab, 4, 1, 64))
    assert not np.array_equal(s, mask_stream(ab, 3, 2, 64))
    assert np.array_equal(s, mask_stream(ab, 3, 1, 64))


def test_a_receiver_learns_nothing_of_one_neighbour_from_its_masked_message() -> None:
    """Receiver 0 with in-neighbours 1, 2, 3 (all keys of the run, seeded). What it got from
    neighbour 1 is uniform in Z_2^64 whatever x_1 is: uncorrelated with x_1, and two very
    different models give indistinguishable messages; none of the keys the receiver holds
    (its own pairs) removes the mask, while the pair keys it lacks do."""
    keys = SeededKeys(7, 4)
    d, senders, w = 20_000, [1, 2, 3], 0.25
    g = torch.Generator().manual_seed(0)
    x = torch.randn(d, generator=g)
    other = torch.randn(d, generator=g) * 1000 + 500

    def got(model: torch.Tensor, round_: int = 5) -> np.ndarray:
        return masked_message(
            model, w, 1, 0, senders, round_, lambda k: keys.key(1, k)
        )  # what 1 sends 0

    def as_unit(message: np.ndarray) -> np.ndarray:
        return message.astype(np.float64) / 2.0**64  # the residue mod 2^64 in [0, 1)

    seen = got(x)
    plain = encode(x, w).view(np.int64).astype(np.float64)
    assert abs(np.corrcoef(plain, x.numpy())[0, 1]) > 0.999  # unmasked: the model itself
    assert abs(np.corrcoef(seen.view(np.int64).astype(np.float64), x.numpy())[0, 1]) < 0.03
    assert stats.kstest(as_unit(seen), "uniform").pvalue > 1e-3
    assert stats.ks_2samp(as_unit(seen), as_unit(got(other, 6))).pvalue > 1e-3
    # the receiver's own keys (pairs 0-1, 0-2, 0-3) in any sign never give back 1's encoding
    encoded = encode(x, w)
    for k in (1, 2, 3):
        for sign in (1, -1):
            stream = mask_stream(keys.key(0, k), 5, 0, d)
            attempt = seen - stream if sign > 0 else seen + stream
            assert np.mean(attempt == encoded) < 1e-3
    # the keys of pairs 1-2 and 1-3, which only those senders hold, do
    removed = seen - mask_stream(keys.key(1, 2), 5, 0, d) - mask_stream(keys.key(1, 3), 5, 0, d)
    assert np.array_equal(removed, encoded)


def _ring(n: int) -> topologies.NeighbourTable:
    return topologies.build_schedule("ring", n).neighbour_table(0)


def test_a_receiver_missing_any_message_keeps_its_model_and_the_others_mix() -> None:
    n, d = 5, 7
    table = _ring(n)
    x = torch.randn(n, d)
    delivered = np.ones_like(table.mask)
    delivered[2, 0] = False  # receiver 2 misses one of its two neighbours' messages
    keys = SeededKeys(0, n)
    sums, totals, complete = secure_sums(
        x, table.index, table.weight, table.mask, delivered, 0, keys
    )
    assert complete.tolist() == [True, True, False, True, True]
    gathered = (torch.as_tensor(table.weight).unsqueeze(-1) * x.double()[table.index]).sum(1)
    assert float((sums[complete] - gathered[complete]).abs().max()) < 1e-8
    rule = DecentralizedSGD()
    state = rule.init(x.clone())
    mix_sums(rule, state, x, sums, totals, complete)
    assert torch.equal(state.x[2], x[2])  # kept, exactly
    expected = (1 - totals.unsqueeze(1)) * x.double() + gathered  # the plain weighted mean
    assert torch.allclose(state.x[complete].double(), expected[complete], atol=1e-6)


@pytest.mark.parametrize("order", ["combine-then-adapt", "adapt-then-combine"])
def test_simulated_secure_gossip_equals_plain_gossip_within_the_fixed_point(order: str) -> None:
    n, rounds = 5, 8
    models = []
    for secure in (None, SeededKeys(0, n)):
        gossip = SynchronousGossip(
            DecentralizedSGD(order=order), topologies.build_schedule("ring", n), secure=secure
        )
        ctx, evaluation = make_context(n, batch_size=16)
        records = run(gossip, ctx, evaluation, rounds=rounds, eval_every=rounds)
        models.append((gossip.models(ctx).clone(), records[-1]))
    (plain, plain_record), (secure_model, secure_record) = models
    assert float((plain - secure_model).abs().max()) < 1e-6
    assert secure_record.test_accuracy == plain_record.test_accuracy
    # a masked message is 8 bytes a coordinate: about twice a float32 message
    assert 1.9 < secure_record.bytes_total / plain_record.bytes_total < 2.1


@pytest.mark.parametrize(
    ("settings_", "says"),
    [
        ({"aggregator": "trimmed-mean:b=1"}, "a robust rule needs the individual models"),
        ({"compressor": "fp16"}, "a masked message is its own encoding"),
        ({"secure_sum": "yes"}, "must be true or false"),
    ],
)
def test_what_secure_sums_cannot_run_with_is_refused(settings_: dict, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as error:
        GossipConfig("dpsgd", **{"secure_sum": True, **settings_})
    assert error.value.field == "secure_sum"


@pytest.mark.parametrize("algorithm", ["push-sum", "choco", "ad-psgd", "diloco"])
def test_only_synchronous_averaging_reads_secure_sum(algorithm: str) -> None:
    with pytest.raises(ConfigurationError, match=f"is not used by {algorithm}"):
        GossipConfig(algorithm, secure_sum=True)
    assert GossipConfig("local-sgd", secure_sum=True).secure_sum is True


def _experiment(algorithm: dict, **extra: object) -> ExperimentConfig:
    return experiment_from_dict(
        {
            "rounds": 1,
            "workload": {"dataset": "synthetic:num_samples=60", "peers": 4, "model": "logistic"},
            "algorithm": {"name": "dpsgd", "secure_sum": True, **algorithm},
            **extra,
        }
    )


def test_an_experiment_file_runs_secure_sums_and_refuses_what_cannot_hide_a_model() -> None:
    algorithm, _, _ = build(_experiment({"topology": "ring"}))
    assert isinstance(algorithm, SynchronousGossip) and algorithm.secure is not None
    with pytest.raises(ConfigError, match=r"algorithm\.secure_sum: needs at least 2 in-neighbours"):
        build(_experiment({"topology": "random-matching"}))
    with pytest.raises(ConfigError, match=r"algorithm\.secure_sum: cannot run with Byzantine"):
        build(_experiment({"topology": "ring"}, byzantine={"count": 1, "attack": "sign-flip"}))
    with pytest.raises(ConfigError, match=r"algorithm\.secure_sum: cannot run with algorithm"):
        _experiment({"aggregator": "krum:f=1"})


def test_masks_under_a_stale_key_do_not_unmask_to_a_wrong_model() -> None:
    """A restarted co-sender has a new key: the pair's streams no longer cancel, and the sum
    is refused instead of mixed."""
    keys, stale = SeededKeys(0, 4), SeededKeys(1, 4)
    senders, x = [1, 2, 3], torch.randn(3, 256)
    messages = [
        masked_message(x[i], 0.25, j, 0, senders, 9, partial(keys.key, j))
        for i, j in enumerate(senders)
    ]
    assert torch.allclose(unmask(messages), 0.25 * x.double().sum(0), atol=1e-8)
    messages[0] = masked_message(x[0], 0.25, 1, 0, senders, 9, partial(stale.key, 1))
    with pytest.raises(SecureSumError, match="the masks did not cancel"):
        unmask(messages)


def test_in_the_simulator_a_crashed_sender_freezes_its_receivers_and_is_counted() -> None:
    n, rounds = 5, 3
    gossip = SynchronousGossip(
        DecentralizedSGD(), topologies.build_schedule("ring", n), secure=SeededKeys(0, n)
    )
    ctx, evaluation = make_context(n, failures=Failures(n, crashes=(Crash(peer=0, at=0.0),)))
    run(gossip, ctx, evaluation, rounds=rounds, eval_every=rounds)
    assert gossip.skipped_sums == 2 * rounds  # peer 0's two receivers, every round


def test_no_masked_message_is_made_for_a_receiver_with_one_sender() -> None:
    with pytest.raises(ValueError, match="its model in the clear"):
        masked_message(torch.ones(3), 0.5, 1, 0, [1], 0, partial(SeededKeys(0, 2).key, 1))
