"""The bytes the simulator charges for a message are the bytes of the body a peer sends.

For every codec, the simulator's charge (``gossip.compression.envelope_bytes`` of the
compressor's payload size, and what ``SynchronousGossip`` reports per sender) equals
``len(peer.protocol.wire.pack_envelope(...))`` of the envelope a peer builds with the same codec,
message length, sender id, round and step.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import topologies
from gossip.algorithms import Choco, DecentralizedSGD, PushSum
from gossip.compression import (
    COMPRESSORS,
    build_compressor,
    envelope_bytes,
    launch_envelope_bytes,
    launch_peer_id,
)
from peer.protocol.codecs import build_codec
from peer.protocol.wire import MAX_ROUND, Envelope, pack_envelope
from sim.algorithms import Context, OptimizerConfig
from sim.batched import BatchedPeers
from sim.gossip_runner import SynchronousGossip
from sim.network import ComputeModel, Failures, Links
from workloads.batching import StackedBatchSampler
from workloads.datasets import load_dataset
from workloads.partition import partition

CODECS = [
    "none",
    "fp16",
    "bf16",
    "qsgd:bits=4",
    "qsgd:bits=8",
    "topk:ratio=0.1",
    "randk:ratio=0.1",
    "topk:ratio=0.1,feedback=true",
    "chunked-topk",
    "chunked-topk:chunk=300,k=7,bits=4,feedback=true",
]
LENGTHS = [1000, 70_001]
"""A small body, and one whose dense fields (``none``, ``fp16``, ``bf16``, ``qsgd:bits=8``)
pass :data:`peer.protocol.wire.SPLICE_BYTES` (spliced into the body) and take msgpack's bin 32 header."""
# header values across msgpack's width boundaries (fixint/uint8/16/32/64, fixstr/str8)
HEADERS = [
    ("peer-0", 0, 0),
    ("peer-12", 127, 128),
    ("peer-999", 255, 256),
    ("a" * 31, 65_535, 65_536),
    ("b" * 32, 2**32 - 1, 2**32),
    ("c" * 64, MAX_ROUND - 1, MAX_ROUND - 1),
]


def peer_body(spec: str, m: int, sender: str, round_: int, step: int, seed: int = 0) -> bytes:
    """The body a peer sends: its codec's payload of an m-vector in an envelope, packed."""
    codec = build_codec(spec, seed=seed)
    vector = torch.randn(m, generator=torch.Generator().manual_seed(m))
    envelope = Envelope(
        sender=sender, round=round_, step=step, codec=codec.name, payload=codec.encode(vector)
    )
    return pack_envelope(envelope)


def test_the_table_covers_every_codec_of_the_registry() -> None:
    assert {spec.partition(":")[0] for spec in CODECS} == set(COMPRESSORS)


@pytest.mark.parametrize("m", LENGTHS)
@pytest.mark.parametrize("spec", CODECS)
def test_envelope_bytes_is_the_length_of_the_body_a_peer_sends(spec: str, m: int) -> None:
    compressor = build_compressor(spec)
    for sender, round_, step in HEADERS:
        charged = envelope_bytes(
            compressor.wire_bytes(m), sender=sender, round=round_, step=step, codec=compressor.codec
        )
        assert charged == len(peer_body(spec, m, sender, round_, step)), (sender, round_, step)


@pytest.mark.parametrize("m", LENGTHS)
def test_error_feedback_sends_bodies_of_the_charged_size(m: int) -> None:
    """Feedback changes what is sent, never its size: every message, residual included,
    weighs what the simulator charges."""
    codec = build_codec("topk:ratio=0.1,feedback=true", seed=3)
    payload_bytes = build_compressor("topk:ratio=0.1").wire_bytes(m)
    generator = torch.Generator().manual_seed(0)
    for round_ in range(3):
        for _ in range(2):  # two messages a round: the residual of one goes into the next
            payload = codec.encode(torch.randn(m, generator=generator))
            body = pack_envelope(
                Envelope(sender="peer-0", round=round_, step=7, codec="topk", payload=payload)
            )
            expected = envelope_bytes(
                payload_bytes, sender="peer-0", round=round_, step=7, codec="topk"
            )
            assert len(body) == expected


@given(
    sender=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}", fullmatch=True),
    round_=st.integers(min_value=0, max_value=MAX_ROUND - 1),
    step=st.integers(min_value=0, max_value=MAX_ROUND - 1),
    spec=st.sampled_from(CODECS),
    m=st.integers(min_value=1, max_value=300),
)
def test_envelope_bytes_for_any_valid_header(
    sender: str, round_: int, step: int, spec: str, m: int
) -> None:
    codec = build_compressor(spec).codec
    payload_bytes = build_compressor(spec).wire_bytes(m)
    charged = envelope_bytes(payload_bytes, sender=sender, round=round_, step=step, codec=codec)
    assert charged == len(peer_body(spec, m, sender, round_, step))
    reference = msgpack.packb(msgpack.unpackb(peer_body(spec, m, sender, round_, step)))
    assert charged == len(reference)  # the splice changes no byte count


def test_launch_sizes_are_envelope_bytes_of_the_launch_ids() -> None:
    steps = np.array([0, 127, 128, 300, 70_000, 2**33, 5, 9, 1, 2, 3])
    sizes = launch_envelope_bytes(500, round=200, steps=steps, codec="qsgd")
    assert launch_peer_id(10) == "peer-10"
    assert sizes.tolist() == [
        envelope_bytes(500, sender=f"peer-{i}", round=200, step=int(s), codec="qsgd")
        for i, s in enumerate(steps)
    ]


def test_launch_sizes_take_one_round_per_sender_as_ad_psgd_peers_count_them() -> None:
    counters = np.array([0, 127, 128, 300, 70_000, 2**33])
    sizes = launch_envelope_bytes(500, round=counters, steps=counters, codec="fp16")
    assert sizes.tolist() == [
        envelope_bytes(500, sender=f"peer-{i}", round=int(c), step=int(c), codec="fp16")
        for i, c in enumerate(counters)
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"payload_bytes": 0}, "payload_bytes must be >= 1"),
        ({"payload_bytes": 1.5}, "payload_bytes must be an int"),
        ({"round": -1}, "round must be in"),
        ({"step": -3}, "steps must be in"),
        ({"step": True}, "steps must be ints"),
    ],
)
def test_bad_header_values_are_refused(arguments: dict, message: str) -> None:
    values = {"payload_bytes": 10, "sender": "peer-0", "round": 0, "step": 0, "codec": "none"}
    values |= arguments
    payload_bytes = values.pop("payload_bytes")
    with pytest.raises(ValueError, match=message):
        envelope_bytes(payload_bytes, **values)


# --------------------------------------------------------------------------- the simulator


def _context(n: int) -> Context:
    data = load_dataset("synthetic:num_samples=200,test_fraction=0.2,seed=0")
    return Context(
        peers=BatchedPeers(lambda: nn.Sequential(nn.Linear(20, 10)), n, seed=0),
        sampler=StackedBatchSampler(partition("iid", data.y_train, n, seed=0), 8, seed=0),
        x_train=data.x_train,
        y_train=data.y_train,
        optimizer=OptimizerConfig(lr=0.1),
        links=Links.uniform(n, latency=0.0, bandwidth=1.0),  # a second per byte
        compute=ComputeModel(n, step_time=0.01),
        failures=Failures(n),
        byzantine=torch.zeros(n, dtype=torch.bool),
    )


def _algorithm(spec: str, push_sum: bool) -> object:
    compressor = build_compressor(spec)
    if compressor.codec in {"topk", "randk", "chunked-topk"}:  # sparsifiers send deltas: CHOCO
        return Choco(compressor, consensus_step=0.5)
    return PushSum(compressor=compressor) if push_sum else DecentralizedSGD(compressor=compressor)


@pytest.mark.parametrize("push_sum", [False, True])
@pytest.mark.parametrize("spec", CODECS)
def test_synchronous_gossip_charges_each_sender_its_peers_bodies(spec: str, push_sum: bool) -> None:
    """One round on the directed exponential graph (each sender charged once per receiver) or
    the one-peer exponential schedule (push-sum, message length d + 1), at round 300 with step
    counters across msgpack's width boundaries."""
    n = 12
    ctx = _context(n)
    ctx.round = 300
    ctx.step_count[:] = [0, 126, 127, 128, 254, 255, 65_534, 65_535, 2**32 - 1, 2**32, 9, 3]
    algorithm = _algorithm(spec, push_sum)
    schedule: topologies.Schedule = (
        topologies.OnePeerExponential(n)
        if push_sum
        else topologies.Static(topologies.mixing_matrix(topologies.build("exponential", n)))
    )
    gossip = SynchronousGossip(algorithm, schedule)  # type: ignore[arg-type]
    gossip.setup(ctx)
    phases = gossip.algorithm.plan.phases()
    steps_before_exchange = phases[: phases.index("exchange")].count("step")
    steps = ctx.step_count + steps_before_exchange
    table = gossip.schedule.neighbour_table(ctx.round)
    heard = np.bincount(np.asarray(table.index)[np.asarray(table.mask)], minlength=n)
    report = gossip.round(ctx)
    m = ctx.peers.dim + (1 if isinstance(algorithm, PushSum) else 0)
    bodies = [
        len(peer_body(spec, m, launch_peer_id(i), 300, int(steps[i]), seed=i)) for i in range(n)
    ]
    charged = heard * np.array(bodies)
    assert report.bytes_sent.tolist() == charged.tolist()
    assert len(set(bodies)) > 1  # the header widths really vary across senders
    # and the round's time moves those bytes: at 1 byte/s and no latency, the busiest sender
    # takes as many seconds as it sends bytes, after its local steps of 0.01 s
    compute = 0.01 * phases.count("step")
    assert report.time == pytest.approx(float(charged.max()) + compute, rel=1e-12)
