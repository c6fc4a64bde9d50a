"""gossip.settings: each algorithm setting declared once, and everything derived from it
(GossipConfig, the simulator's [algorithm] keys, PeerConfig, the peer and launch flags,
launch's pass-through, docs/settings.md)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from gossip import ALGORITHM_FIELDS, GOSSIP_ALGORITHMS, ConfigurationError, GossipConfig
from gossip.settings import (
    SETTING_NAMES,
    SETTINGS,
    Setting,
    setting,
    setting_fields,
    settings_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python -m gossip.settings_doc > docs/settings.md"


def test_docs_settings_md_is_what_the_schema_generates() -> None:
    committed = (ROOT / "docs" / "settings.md").read_text()
    assert committed == settings_markdown(), (
        f"docs/settings.md differs from gossip.settings.SETTINGS; regenerate it with: {REGENERATE}"
    )


def test_the_regenerate_command_writes_the_table() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gossip.settings_doc"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
    )  # fmt: skip
    assert result.stdout == settings_markdown()
    for item in SETTINGS:
        assert f"| `{item.name}` | `{item.flag}` |" in result.stdout


def test_each_algorithm_reads_what_the_settings_say() -> None:
    for algorithm in GOSSIP_ALGORITHMS:
        assert ALGORITHM_FIELDS[algorithm] == tuple(
            item.name for item in SETTINGS if algorithm in item.readers
        )
    assert {name for item in SETTINGS for name in item.readers} <= set(GOSSIP_ALGORITHMS)


@pytest.mark.parametrize("item", SETTINGS, ids=SETTING_NAMES)
def test_an_unset_setting_takes_its_declared_default(item: Setting) -> None:
    for algorithm in item.readers:
        assert getattr(GossipConfig(algorithm), item.name) == item.default_for(algorithm)
    for algorithm, value in item.fixed.items():
        assert getattr(GossipConfig(algorithm), item.name) == value
    for algorithm in set(GOSSIP_ALGORITHMS) - set(item.readers) - set(item.fixed):
        assert getattr(GossipConfig(algorithm), item.name) is None


def test_a_bad_value_is_refused_by_its_declared_check_naming_the_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        GossipConfig("choco", consensus_step=2)
    assert caught.value.field == "consensus_step"
    assert caught.value.reason == "must be in (0, 1]; got 2"
    assert str(caught.value) == "consensus_step: must be in (0, 1]; got 2"
    assert caught.value.render(lambda name: setting(name).flag) == (
        "--consensus-step: must be in (0, 1]; got 2"
    )


def test_every_runner_takes_every_setting_by_its_name() -> None:
    from peer.node.config import PeerConfig
    from sim.config import AlgorithmConfig

    for config in (GossipConfig, AlgorithmConfig, PeerConfig):
        names = {field.name for field in dataclasses.fields(config)}
        assert set(SETTING_NAMES) <= names, config
    assert AlgorithmConfig(name="choco", consensus_step=0.25).gossip.consensus_step == 0.25
    peer = PeerConfig(
        peer_id="a", algorithm="choco", consensus_step=0.25, topology="ring",
        peer_list=("127.0.0.1:7000", "127.0.0.1:7001"), rank=0,
    )  # fmt: skip
    assert peer.consensus_step == peer.gossip.consensus_step == 0.25


def test_a_setting_declared_twice_is_a_type_error() -> None:
    class Twice:
        __annotations__ = {"order": "str"}

    with pytest.raises(TypeError, match=r"Twice\.order is a setting"):
        setting_fields(Twice)


@pytest.mark.parametrize("command", ["peer", "launch"])
def test_peer_and_launch_have_each_settings_flag_as_declared(command: str) -> None:
    from peer.app import launch, peer_flags

    parser = peer_flags.peer_parser("p") if command == "peer" else launch._parser("p", False)
    actions = {action.dest: action for action in parser._actions}
    for item in SETTINGS:
        action = actions[item.name]
        assert action.option_strings == [item.flag]
        assert action.default is None
        if item.type is bool:  # a switch: its text converted as the setting converts it
            assert action.type is not None and action.type("on") is item.convert("on") is True
            with pytest.raises(argparse.ArgumentTypeError, match="must be true or false"):
                action.type("maybe")
        else:
            assert action.type is item.type
        assert tuple(action.choices or ()) == item.choices
        assert item.help in (action.help or "") and item.allowed in (action.help or "")


def test_launch_passes_every_setting_through_to_its_peers(tmp_path: Path) -> None:
    import argparse

    from peer.app.peer_flags import OPTIMIZER_FLAGS
    from peer.app.swarm import peer_flags

    values = {item.name: item.default for item in SETTINGS}  # any value passes through
    optimizer = {name: None for name in OPTIMIZER_FLAGS}  # not given
    args = argparse.Namespace(
        **{name: None for name in ("algorithm", "mode", "fanout", "round_deadline_s",
                                   "topology", "topology_weights", "device",
                                   "max_serving_share", "log_level", "latency",
                                   "bandwidth", "jitter", "message_loss")},
        **values, dataset="synthetic", partition="iid", model="mlp", batch_size=8,
        **(optimizer | {"optimizer": "adamw", "lr": 0.1, "weight_decay": 0.01}), seed=0,
        steps=10, checkpoint_every=0, peers=2, peer_args="",
    )  # fmt: skip
    flags = peer_flags(args, 0, tmp_path, secret_file=None, peer_file=None)
    for name, value in values.items():
        at = flags.index(setting(name).flag)
        assert flags[at + 1] == str(value)
    for flag, value in (("--optimizer", "adamw"), ("--weight-decay", "0.01"), ("--lr", "0.1")):
        assert flags[flags.index(flag) + 1] == value
    assert "--momentum" not in flags  # not given: the peer takes its optimizer's default
