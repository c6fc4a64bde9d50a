"""The language-model experiments of examples/experiments/lm-*.toml, quick: each file's named
runs on a tiny gpt and a tenth of the tokens (same algorithms, topologies, H, network), with
the orderings that do not need a long run: bytes and simulated time at equal tokens, and that
every run learns. The full runs and their figures: docs/low-communication.md."""

from __future__ import annotations

import copy
import math
from functools import cache
from pathlib import Path

import pytest

from sim.build import build
from sim.config import experiment_from_dict, load_experiment_data, named_runs
from sim.metrics import Record
from sim.runner import run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "experiments"
TINY = {"dataset": "text:context=16,max_bytes=30000", "model": "gpt:layers=1,width=16,heads=2"}


@cache
def _quick(name: str, shrink: int, peers: int | None = None) -> dict[str, tuple[Record, ...]]:
    """Each named run of ``name`` on the tiny model, with 1/``shrink`` of its rounds."""
    data = load_experiment_data(EXAMPLES / f"{name}.toml")
    results = {}
    for label, replaced in named_runs(data).items():
        point = copy.deepcopy({k: v for k, v in data.items() if k != "compare"})
        point.update(copy.deepcopy(replaced))
        point["workload"].update(TINY, **({"peers": peers} if peers else {}))
        point["rounds"] = max(1, point["rounds"] // shrink)
        point["eval_every"] = point["rounds"]
        config = experiment_from_dict(point, base_dir=EXAMPLES)
        algorithm, ctx, evaluation = build(config)
        results[label] = tuple(run(algorithm, ctx, evaluation, rounds=config.rounds))
    return results


def _learned(records: tuple[Record, ...]) -> None:
    first, last = records[0], records[-1]
    assert last.test_bits_per_byte is not None and math.isfinite(last.test_bits_per_byte)
    assert last.test_bits_per_byte < first.test_bits_per_byte


def test_low_communication_family_sends_h_times_fewer_bytes_and_sparseloco_far_fewer():
    runs = _quick("lm-low-communication", shrink=10)
    assert set(runs) == {"data parallel", "DiLoCo", "gossip-DiLoCo", "NoLoCo", "SparseLoCo"}
    for records in runs.values():
        _learned(records)
    total = {label: records[-1].bytes_total for label, records in runs.items()}
    steps = {label: records[-1].steps for label, records in runs.items()}
    assert len(set(steps.values())) == 1  # equal tokens: every run took 40 inner steps/peer
    # an all-reduce of the pseudo-gradient every H = 20 steps instead of the gradient's
    # every step: exactly H times fewer bytes
    assert total["data parallel"] == pytest.approx(20 * total["DiLoCo"])
    # an all-gather of 2-bit chunked top-k against DiLoCo's all-reduce of dense floats
    assert total["SparseLoCo"] * 8 < total["DiLoCo"]
    # NoLoCo: one partner, [theta, phi]; gossip-DiLoCo: two ring neighbours, theta
    assert total["NoLoCo"] == pytest.approx(total["gossip-DiLoCo"], rel=0.01)


@pytest.mark.slow
def test_outer_nesterov_plain_averaging_and_data_parallel_at_equal_tokens():
    # 1/40 of the rounds: 100 inner steps per peer (H = 200: one outer step of 200)
    runs = _quick("lm-outer-momentum", shrink=40, peers=4)
    labels = [f"{outer}, H={h}" for h in (10, 50, 200) for outer in ("Nesterov", "averaging")]
    assert set(runs) == {"data parallel", *labels}
    for records in runs.values():
        _learned(records)
    for h in (10, 50, 200):
        nesterov, averaging = runs[f"Nesterov, H={h}"], runs[f"averaging, H={h}"]
        assert nesterov[-1].steps == averaging[-1].steps
        assert nesterov[-1].test_bits_per_byte != averaging[-1].test_bits_per_byte
    # DiLoCo against data parallel at equal tokens: one all-reduce every H steps, not every step
    data_parallel = runs["data parallel"][-1]
    for h in (10, 50):
        diloco = runs[f"Nesterov, H={h}"][-1]
        assert diloco.steps == data_parallel.steps
        assert data_parallel.bytes_total == pytest.approx(h * diloco.bytes_total)


def test_on_a_slow_network_data_parallel_pays_the_all_reduce_latency_every_step():
    peers = 16  # the file's 64 in the full run
    runs = _quick("lm-64-peers", shrink=12, peers=peers)
    per_step = {label: r[-1].time / r[-1].steps * peers for label, r in runs.items()}
    # 2 (p - 1) = 30 messages of 50 ms in a ring all-reduce, every step or every 20
    assert per_step["data parallel"] > 2 * (peers - 1) * 0.05
    # DiLoCo: the same all-reduce, once per H = 20 steps of 0.1 s compute
    all_reduce = per_step["data parallel"] - 0.1
    assert per_step["DiLoCo"] == pytest.approx(0.1 + all_reduce / 20, rel=1e-6)
    assert per_step["NoLoCo"] < per_step["DiLoCo"]
    assert per_step["gossip-DiLoCo"] < per_step["DiLoCo"]


def test_one_byzantine_peer_of_eight_breaks_the_mean_and_not_the_trimmed_mean():
    runs = _quick("lm-byzantine", shrink=10)
    final = {label: records[-1].test_bits_per_byte for label, records in runs.items()}
    clean = final["mean, no attack"]
    assert final["mean, sign-flip"] > clean + 0.5
    assert final["trimmed mean, sign-flip"] < clean + 0.1
    assert final["trimmed mean, ALIE"] < clean + 0.1
