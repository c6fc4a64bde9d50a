"""The local (inner) optimizer from the command line: --optimizer, --lr, --momentum,
--weight-decay on `gossipnet peer` and `gossipnet launch`, and the one builder behind them."""

from __future__ import annotations

import pytest
import torch

from gossipnet.cli import main
from peer.app.cli import parse_peer_args
from peer.app.run import build_peer
from workloads.optimizers import build_local_optimizer, check_local_optimizer


def test_the_builder_takes_each_optimizer_and_refuses_a_field_it_does_not_read():
    net = torch.nn.Linear(3, 2)
    assert isinstance(build_local_optimizer(net.parameters(), "adamw", lr=1e-3), torch.optim.AdamW)
    sgd = build_local_optimizer(net.parameters(), "sgd", lr=0.1)
    assert sgd.param_groups[0]["momentum"] == 0.9
    assert check_local_optimizer("sgd", lr=0.1, momentum=0.0) == 0.0
    for kwargs, words in [
        (dict(name="adamw", lr=0.1, momentum=0.5), "momentum: is SGD's"),
        (dict(name="sgd", lr=0.0), "lr: must be"),
        (dict(name="sgd", lr=0.1, momentum=1.0), "momentum: must be in"),
        (dict(name="adam", lr=0.1, weight_decay=-1.0), "weight_decay: must be"),
        (dict(name="lion", lr=0.1), "optimizer: must be one of sgd, adam, adamw"),
    ]:
        name = kwargs.pop("name")
        with pytest.raises(ValueError, match=words):
            check_local_optimizer(name, **kwargs)


def test_a_peer_built_from_the_flags_steps_adamw(tmp_path):
    args, config = parse_peer_args(
        ["--id", "a", "--port", "0", "--dataset", "synthetic:num_samples=64",
         "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.1"]
    )  # fmt: skip
    peer, _ = build_peer(args, config)
    optimizer = peer.trainer.optimizer
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["lr"] == 0.01
    assert optimizer.param_groups[0]["weight_decay"] == 0.1


@pytest.mark.parametrize("command", ["peer", "launch"])
def test_momentum_with_adamw_is_one_line_naming_the_flag(command, capsys):
    extra = ["--id", "a"] if command == "peer" else ["--peers", "2"]
    with pytest.raises(SystemExit) as caught:
        main([command, *extra, "--optimizer", "adamw", "--momentum", "0.5"])
    assert caught.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--momentum: is SGD's" in lines[0], lines
