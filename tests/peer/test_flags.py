"""Every flag of ``gossipnet peer``, ``launch`` and ``demo`` explains itself (help text, and
its default for a flag that takes a value); the peer count has one name, ``--peers``, and
the peer's old ``--num-peers`` still works and says once that it is deprecated."""

from __future__ import annotations

import argparse

import pytest

from peer.app.cli import parse_peer_args
from peer.app.launch import _parser as launch_parser
from peer.app.peer_flags import peer_parser
from peer.app.usage import DeprecatedFlag

PARSERS = {
    "peer": lambda: peer_parser("gossipnet peer"),
    "launch": lambda: launch_parser("gossipnet launch", False),
    "demo": lambda: launch_parser("gossipnet demo", True),
}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in parser._actions  # argparse's own table of the flags
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_flag_has_help_and_says_its_default(command: str) -> None:
    missing = []
    for action in options(PARSERS[command]()):
        text = action.help or ""
        takes_a_value = action.nargs != 0
        if isinstance(action, DeprecatedFlag):
            assert "deprecated" in text and action.instead in text
            continue
        if not text.strip() or text == argparse.SUPPRESS:
            missing.append(f"{action.option_strings[0]}: no help")
        elif takes_a_value and not action.required and "default" not in text:
            missing.append(f"{action.option_strings[0]}: help does not say its default")
    assert not missing, "\n".join(missing)


def test_the_demo_shows_its_own_defaults() -> None:
    helped = PARSERS["demo"]().format_help()
    assert "optimizer steps per peer (default 600)" in " ".join(helped.split())


def test_the_peer_count_is_called_peers_on_peer_and_launch() -> None:
    for command in ("peer", "launch"):
        flags = {
            option for action in options(PARSERS[command]()) for option in action.option_strings
        }
        assert "--peers" in flags, command
    args, _ = parse_peer_args(["--id", "a", "--peers", "3", "--peer-index", "2"])
    assert (args.num_peers, args.peer_index) == (3, 2)


def test_num_peers_still_works_and_says_once_that_it_is_deprecated(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DeprecatedFlag, "warned", set())
    for _ in range(2):
        args, _config = parse_peer_args(["--id", "a", "--num-peers", "4", "--peer-index", "3"])
        assert args.num_peers == 4
    err = capsys.readouterr().err
    assert err.count("--num-peers is deprecated; use --peers") == 1, err
    with pytest.raises(SystemExit) as exit:
        parse_peer_args(["--id", "a", "--peers", "2", "--peer-index", "2"])
    assert exit.value.code == 2
    assert "--peer-index: must be in [0, --peers=2), got 2" in capsys.readouterr().err


def test_the_old_peers_file_meaning_of_peers_is_one_clear_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit:
        parse_peer_args(["--id", "a", "--peers", "peers.txt"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "gossipnet peer: error: --peers: invalid int value: 'peers.txt'"
    )
