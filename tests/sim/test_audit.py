"""Privacy audits in the simulator ([audit], sim.audit): the table's checks, the batched
membership attack against a per-peer reference, the reconstruction with and without DP-SGD,
and one `gossipnet sim run` with [audit] through the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from sim.build import build
from sim.cli import main as sim_main
from sim.config import ConfigError, experiment_from_dict
from sim.metrics import read_jsonl
from sim.runner import run
from workloads.membership import membership_advantage, roc_auc
from workloads.reconstruction import cosine_similarity


def experiment(tmp_path: Path, audit: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "seed": 0,
        "rounds": 6,
        "eval_every": 3,
        "workload": {
            "dataset": "synthetic:num_samples=400,seed=0",
            "model": "mlp:hidden=8",
            "peers": 4,
            "batch_size": 8,
            "cache_dir": str(tmp_path),
        },
        "algorithm": {"name": "dpsgd", "topology": "ring"},
        "audit": audit,
        **extra,
    }


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        ({"membership": True, "member": 3}, "audit.member: unknown key in [audit]; allowed: "),
        ({"membership": "yes"}, "audit.membership: must be true or false, got 'yes'"),
        ({"membership": True, "members": 0}, "audit.members: must be an integer >= 1, got 0"),
        ({"reconstruction": True, "members": 5}, "audit.members: is read by membership = true"),
        ({}, "audit.membership: the table runs no attack"),
    ],
)
def test_a_bad_audit_table_is_one_line_naming_the_key(
    tmp_path: Path, audit: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        experiment_from_dict(experiment(tmp_path, audit))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("audit", "model", "message"),
    [
        ({"membership": True, "members": 81}, "mlp:hidden=8", "audit.members: 81 is more than"),
        ({"reconstruction": True}, "cnn1d", "audit.reconstruction: the model's first layer"),
    ],
)
def test_an_audit_the_workload_cannot_run_is_refused_before_any_round(
    tmp_path: Path, audit: dict[str, Any], model: str, message: str
) -> None:
    table = experiment(tmp_path, audit)
    table["workload"]["model"] = model
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build(experiment_from_dict(table))


def test_the_batched_attacks_equal_each_peers_own_and_dp_noise_hides_the_input(
    tmp_path: Path,
) -> None:
    audit = {"membership": True, "members": 40, "reconstruction": True}
    config = experiment_from_dict(experiment(tmp_path, audit))
    algorithm, ctx, evaluation = build(config)
    records = run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=3)
    assert ctx.audit is not None and ctx.audit.membership is not None
    result = ctx.audit.measure(algorithm, ctx)
    assert result.membership_auc is not None and result.membership_advantage is not None
    assert records[-1].membership_auc == pytest.approx(float(result.membership_auc.mean()))
    assert records[0].membership_auc is None  # the last record only
    # each peer's own model, one at a time, against its members and non-members
    membership, test_x = ctx.audit.membership, evaluation.x_test
    for peer in range(4):
        model = ctx.peers.module(algorithm.models(ctx)[peer]).eval()
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy
            inside = -loss(
                model(ctx.x_train[membership.members[peer]]),
                ctx.y_train[membership.members[peer]],
                reduction="none",
            )
            outside = -loss(
                model(test_x[membership.others[peer]]),
                evaluation.y_test[membership.others[peer]],
                reduction="none",
            )
        assert len(set(membership.members[peer].tolist())) == 40
        assert float(result.membership_auc[peer]) == pytest.approx(float(roc_auc(inside, outside)))
        assert float(result.membership_advantage[peer]) == pytest.approx(
            float(membership_advantage(inside, outside))
        )
    # a neighbour recovers every peer's input exactly from a plain SGD step
    assert result.reconstruction_cosine is not None
    assert float(result.reconstruction_cosine.min()) > 0.99
    # the same audit under DP-SGD's clipping and noise
    private = experiment(tmp_path, audit, privacy={"noise": 1.0, "clip": 1.0})
    config = experiment_from_dict(private)
    algorithm, ctx, evaluation = build(config)
    noisy = run(algorithm, ctx, evaluation, rounds=1)[-1]
    assert noisy.reconstruction_cosine_max is not None and noisy.reconstruction_cosine_max < 0.3
    # the recovered inputs really are the examples' (not a cosine of two fixed vectors)
    assert float(cosine_similarity(ctx.x_train[0], ctx.x_train[1]).abs()) < 0.99


def test_sim_run_with_an_audit_prints_and_writes_its_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(
        'rounds = 4\neval_every = 2\n[workload]\ndataset = "synthetic:num_samples=200"\n'
        'model = "mlp:hidden=16"\npeers = 2\nbatch_size = 8\n[algorithm]\nname = "dpsgd"\n'
        "[audit]\nmembership = true\nmembers = 30\nreconstruction = true\n"
    )
    jsonl = tmp_path / "r.jsonl"
    assert sim_main(["run", str(path), "--quiet", "--jsonl", str(jsonl)]) == 0
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("audit: dpsgd: "))
    assert "membership AUC" in line and "reconstruction cosine 1.000" in line
    last = json.loads(jsonl.read_text().splitlines()[-1])
    assert 0.0 <= last["membership_auc"] <= last["membership_auc_max"] <= 1.0
    assert 0.0 <= last["membership_advantage"] <= last["membership_advantage_max"] <= 1.0
    assert last["reconstruction_cosine"] > 0.99
    assert f"membership AUC {last['membership_auc']:.3f}" in line
    assert read_jsonl(jsonl)[-1].membership_auc == last["membership_auc"]  # read back
