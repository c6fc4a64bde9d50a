"""The pairwise (AD-PSGD) exchange: batched == per-node halves over the wire, what the pair's
sum does with each codec, robust 2-input rules, and the caller keeping its local progress."""

from __future__ import annotations

import msgpack
import pytest
import torch
from torch import Tensor

import consensus
from gossip.compression import Compressor, build_compressor
from gossip.pairwise import PairwiseGossip, ad_psgd, average_pair


def _wire(codec: Compressor, vector: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """What a peer receives: encode, msgpack over the wire, decode (checks the byte count)."""
    body = msgpack.packb(codec.encode(vector, generator))
    assert len(body) == codec.wire_bytes(vector.shape[-1])
    return codec.decode(msgpack.unpackb(body), vector.shape[-1])


def _random_pairs(n: int, generator: torch.Generator) -> Tensor:
    order = torch.randperm(n, generator=generator)
    count = int(torch.randint(1, n // 2 + 1, (1,), generator=generator))
    return order[: 2 * count].reshape(-1, 2)


@pytest.mark.parametrize("codec", ["none", "fp16", "bf16"])
@pytest.mark.parametrize("rule", ["mean", "median"])
def test_batched_exchange_equals_the_two_halves_run_per_node_over_the_wire(
    codec: str, rule: str
) -> None:
    n, d = 9, 37
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator)
    pairs = torch.tensor([[4, 0], [2, 7], [8, 5], [1, 3]])  # node 6 sits out
    exchange = PairwiseGossip(consensus.build(rule), build_compressor(codec))
    batched = exchange.exchange(x.clone(), pairs)

    per_node = x.clone()
    wire = build_compressor(codec)
    for caller, callee in pairs.tolist():
        sent = per_node[caller].clone()  # the caller's snapshot
        callee_model = per_node[callee].clone()
        answer = exchange.callee_answer(callee_model, _wire(wire, sent))
        assert torch.equal(callee_model, answer)  # the callee adopted what it answers
        assert answer.data_ptr() != callee_model.data_ptr()  # but answers a separate tensor
        caller_model = per_node[caller].clone()
        exchange.caller_update(caller_model, sent, _wire(wire, answer))
        per_node[caller], per_node[callee] = caller_model, callee_model
    assert torch.equal(batched, per_node)
    assert torch.equal(batched[6], x[6])
    assert max(float((batched[p] - x[p]).abs().max()) for p in pairs.reshape(-1).tolist()) > 0.1


def test_uncompressed_exchanges_keep_the_sum_and_both_ends_hold_one_value() -> None:
    n, d = 10, 6
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    exchange = PairwiseGossip()
    total, average = x.sum(0), x.mean(0)
    for _ in range(300):
        pairs = _random_pairs(n, generator)
        exchange.exchange(x, pairs)
        torch.testing.assert_close(x.sum(0), total, rtol=0, atol=1e-12)
        assert torch.equal(x[pairs[:, 0]], x[pairs[:, 1]])
    torch.testing.assert_close(x, average.expand(n, -1), rtol=0, atol=1e-12)


def test_the_median_of_two_models_is_their_mean_so_robust_pairwise_gossip_keeps_the_sum() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(8, 50, generator=generator)
    pairs = torch.tensor([[0, 1], [5, 2], [3, 6]])
    median = PairwiseGossip(consensus.build("median")).exchange(x.clone(), pairs)
    mean = PairwiseGossip().exchange(x.clone(), pairs)
    torch.testing.assert_close(median, mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(median.sum(0), x.sum(0), rtol=1e-5, atol=1e-5)
    manual = (x[pairs[:, 0]] + x[pairs[:, 1]]) / 2
    torch.testing.assert_close(median[pairs[:, 1]], manual, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("codec", "roundoff"), [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_a_rounding_codec_moves_the_pair_sum_by_its_two_rounding_errors(
    codec: str, roundoff: float
) -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 400, dtype=torch.float64, generator=generator)
    compressor = build_compressor(codec)
    after = PairwiseGossip(compressor=compressor).exchange(x.clone(), torch.tensor([[0, 1]]))
    sent = x[0]
    sent_error = compressor.compress(sent).values - sent
    averaged = after[1]  # the callee keeps its exact average of x_1 and C(x_0)
    torch.testing.assert_close(averaged, (x[1] + sent + sent_error) / 2, rtol=0, atol=1e-15)
    answer_error = after[0] - averaged  # the caller adopted C(average)
    assert torch.equal(after[0], compressor.compress(averaged).values)
    drift = after.sum(0) - x.sum(0)
    torch.testing.assert_close(drift, sent_error + answer_error, rtol=0, atol=1e-14)
    assert bool((sent_error.abs() <= roundoff * sent.abs()).all())
    assert bool((answer_error.abs() <= roundoff * averaged.abs()).all())
    assert float(drift.abs().max()) > 0  # lossy: the sum is not kept exactly


def test_qsgd_keeps_the_pair_sum_in_expectation_and_fp16_does_not() -> None:
    """Many pairs holding the same two models: qsgd's drift averages out (unbiased), fp16's is
    the same deterministic rounding in every pair (biased)."""
    pairs_count, d = 2000, 64
    generator = torch.Generator().manual_seed(4)
    two = torch.randn(2, d, dtype=torch.float64, generator=generator)
    x = two.repeat(pairs_count, 1)  # rows 2p, 2p + 1 are the two models of pair p
    pairs = torch.arange(2 * pairs_count).reshape(-1, 2)

    def drift(codec: str) -> Tensor:
        exchanged = PairwiseGossip(compressor=build_compressor(codec)).exchange(
            x.clone(), pairs, torch.Generator().manual_seed(5)
        )
        return (exchanged[0::2] + exchanged[1::2]) - two.sum(0)  # [pairs, d]

    quantized = drift("qsgd:bits=4,block=16")
    single = float(quantized.abs().mean())
    assert single > 1e-3  # one exchange moves the sum visibly
    assert float(quantized.mean(0).abs().mean()) < 5 * single / pairs_count**0.5
    levels = 2 ** (4 - 1) - 1
    scale = two.abs().reshape(2, -1, 16).amax(-1).max()
    assert float(quantized.abs().max()) < 2 * float(scale) / levels  # |e_s| + |e_a| < 2 s / L
    rounded = drift("fp16")
    assert torch.equal(rounded.mean(0), rounded[0])  # the same error in every pair: biased


def test_caller_update_keeps_the_progress_made_during_the_round_trip() -> None:
    generator = torch.Generator().manual_seed(6)
    sent = torch.randn(3, 20, generator=generator)
    answer = torch.randn(3, 20, generator=generator)
    progress = 0.1 * torch.randn(3, 20, generator=generator)
    progress[1] = 0.0  # this row made no progress
    own = sent + progress
    before = own.clone()
    out = PairwiseGossip.caller_update(own, sent, answer)
    assert out is own
    torch.testing.assert_close(own, answer + progress, rtol=0, atol=1e-6)
    assert torch.equal(own[1], answer[1])  # no progress: the answer exactly
    # the pair's sum, with the callee at ``answer``, is the old sum plus the progress
    torch.testing.assert_close(own + answer, before - sent + 2 * answer, rtol=0, atol=1e-6)
    single = sent[0].clone()
    assert torch.equal(PairwiseGossip.caller_update(single, sent[0], answer[0]), answer[0])
    single = sent[0] + progress[0]
    PairwiseGossip.caller_update(single, sent[0], answer[0])
    torch.testing.assert_close(single, answer[0] + progress[0], rtol=0, atol=1e-6)


def test_each_message_costs_the_codecs_wire_bytes_so_fp16_halves_them() -> None:
    d = 10_000
    none = PairwiseGossip().message_bytes(d)
    half = PairwiseGossip(compressor=build_compressor("fp16")).message_bytes(d)
    assert none == build_compressor("none").wire_bytes(d) >= 4 * d
    assert half == build_compressor("fp16").wire_bytes(d)
    assert abs(half / none - 0.5) < 0.01


def test_ad_psgd_builds_the_pairwise_rule() -> None:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(6, 5, generator=generator)
    rule, codec = consensus.build("median"), build_compressor("bf16")
    algorithm = ad_psgd(aggregator=rule, compressor=codec)
    assert algorithm.plan.phases() == ("gradient", "exchange", "step")
    exchange = PairwiseGossip.of(algorithm)
    assert exchange.aggregator is rule and exchange.compressor is codec
    assert torch.equal(average_pair(x[0], x[3]), (x[0] + x[3]) / 2)


def test_refuses_state_a_batch_of_changing_pairs_cannot_keep_and_bad_shapes() -> None:
    x = torch.zeros(4, 8)
    pairs = torch.tensor([[0, 1]])
    feedback = PairwiseGossip(compressor=build_compressor("fp16:feedback=true"))
    with pytest.raises(ValueError, match=r"compressor: .*feedback"):
        feedback.exchange(x, pairs)
    clipping = PairwiseGossip(consensus.build("centered-clipping"))
    with pytest.raises(ValueError, match=r"aggregator: .*keeps state"):
        clipping.exchange(x, pairs)
    with pytest.raises(ValueError, match="disjoint"):
        PairwiseGossip().exchange(x, torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match=r"index nodes in \[0, 4\)"):
        PairwiseGossip().exchange(x, torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match="one shape"):
        PairwiseGossip.caller_update(torch.zeros(3), torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"compressor must be a gossip\.Compressor"):
        PairwiseGossip(compressor="fp16")  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [1, 7, 1000, 4096])
def test_callee_answer_by_chunk_equals_the_whole_vector_rule(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    own, received = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    rule = PairwiseGossip()
    whole_own = own.clone()
    expected = rule.callee_answer(whole_own, received)
    ends: list[int] = []
    out = torch.empty_like(own)
    assert rule.callee_answer_by_chunk(own, received, out, chunk=chunk, computed=ends.append) is out
    assert torch.equal(out, expected) and torch.equal(own, whole_own)  # bit for bit, committed
    assert ends == sorted(ends) and ends[-1] == 1000 and len(ends) == -(-1000 // chunk)


def test_callee_answer_by_chunk_is_the_mean_only_and_commits_nothing_on_failure() -> None:
    robust = PairwiseGossip(consensus.build("median"))
    assert not robust.answers_by_chunk and PairwiseGossip().answers_by_chunk
    with pytest.raises(ValueError, match="only the mean"):
        robust.callee_answer_by_chunk(torch.zeros(4), torch.ones(4), torch.empty(4), chunk=2)
    own = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    before = own.clone()
    with pytest.raises(ValueError):
        PairwiseGossip().callee_answer_by_chunk(own, torch.ones(4), torch.empty(4), chunk=2)
    assert torch.equal(own[:3], before[:3]) and torch.isnan(own[3])
