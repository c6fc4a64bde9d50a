"""The README's and docs' words hold: the README's embedding snippet runs as written and
counts its steps; docs/peer.md names the algorithms a peer runs, and no others."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_block(section: str) -> str:
    """The first fenced ``python`` block of the README section titled ``section``."""
    text = README.read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    match = re.search(r"```python\n(.*?)```", text[start : end if end != -1 else None], re.S)
    assert match is not None, f"README section {section!r} has no python block"
    return match.group(1)


def test_the_embedding_snippet_runs_as_written_and_counts_its_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = python_block("Embedding a peer in your own program")
    assert "record_step" in code
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    # 512 samples in batches of 32: every step the loop took is counted by the peer
    assert capsys.readouterr().out.strip().endswith("edge-7: 16 steps")


def test_peer_guide_names_every_algorithm_a_peer_runs_and_only_baselines_as_sim_only() -> None:
    from peer.node.config import ALGORITHMS as PEER
    from sim.config import ALGORITHMS as SIM

    text = (ROOT / "docs" / "peer.md").read_text()
    bullet = text[text.index("* Algorithms:") :]
    bullet = bullet[: bullet.index("\n* ")]
    named, _, baselines = bullet.partition("Only the simulator's baselines")
    assert set(PEER) <= set(re.findall(r"`([a-z-]+)`", named))
    assert set(re.findall(r"`([a-z-]+)`", baselines.partition(")")[0])) == set(SIM) - set(PEER)


def test_make_demo_says_what_it_installs_before_it_installs(tmp_path: Path) -> None:
    """``make demo`` on a machine without ``.venv``: what it will do, in order (``make -n``
    prints each command without running it)."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    plan = subprocess.run(
        ["make", "-n", "-C", str(ROOT), f"VENV={tmp_path / 'venv'}", "demo"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    said = next(i for i, line in enumerate(plan) if line.startswith("echo") and "PyTorch" in line)
    installs = next(i for i, line in enumerate(plan) if "pip install" in line)
    runs = next(i for i, line in enumerate(plan) if line.endswith("gossipnet demo"))
    assert said < installs < runs


def test_the_demo_has_one_duration_wherever_it_is_stated() -> None:
    """The README states how long the demo takes (measured: docs/benchmarks.md); the
    command's own help and the launcher's docstring say the same, and docs/peer.md defers
    to the README."""
    import peer.app.launch
    from gossipnet.cli import SUBCOMMANDS

    said = "under half a minute"

    def flat(text: str) -> str:
        return " ".join(text.split())

    section = README.read_text().partition("## What `make demo` does")[2].partition("\n## ")[0]
    assert said in flat(section)
    assert said in SUBCOMMANDS["demo"].summary
    assert said in flat(peer.app.launch.__doc__ or "")
    guide = flat((ROOT / "docs" / "peer.md").read_text())
    assert "How long it takes is stated once, in the [README]" in guide
    for text in (flat(section), SUBCOMMANDS["demo"].summary, guide):
        assert "about a minute" not in text and "about half a minute" not in text


def test_the_by_hand_recipe_is_valid_and_no_peer_trains_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/peer.md's "One peer by hand": every ``gossipnet peer`` line parses and checks with
    the peer's own parser (its secret file written as the recipe writes it), and each waits
    for the other before it trains."""
    import secrets
    import shlex

    from peer.app.cli import parse_peer_args

    text = (ROOT / "docs" / "peer.md").read_text().partition("## One peer by hand\n")[2]
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block is not None
    commands = [
        shlex.split(line.removesuffix("&"))
        for line in block.group(1).replace("\\\n", " ").splitlines()
        if line.startswith("gossipnet peer ")
    ]
    assert len(commands) == 2
    monkeypatch.chdir(tmp_path)
    (tmp_path / "swarm.secret").write_text(secrets.token_hex(32) + "\n")
    for command in commands:
        args, _config = parse_peer_args(command[2:], raise_errors=True)
        assert args.wait_for_peers == len(commands) - 1, command
        assert args.num_peers == len(commands)


def _command_lines(command: str) -> list[tuple[str, list[str]]]:
    """Every ``gossipnet COMMAND ...`` line of the README and docs/ (continuation lines
    joined, comments, placeholders ``...``, shell ``&`` and ``$VARIABLES`` dropped): (where, argv)."""
    found = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for number, line in enumerate(text.splitlines(), 1):
            match = re.match(rf"\s*(?:\$ )?gossipnet {command} (.*)", line)
            if match is None or "`" in match.group(1):
                continue  # a command quoted inside prose
            words = shlex.split(match.group(1).split(" #")[0])
            argv = [w for w in words if w not in ("...", "&") and not w.startswith("$")]
            found.append((f"{path.relative_to(ROOT)}:{number}", argv))
    return found


@pytest.mark.parametrize("command", ["launch", "peer"])
def test_every_launch_and_peer_line_in_the_docs_parses_as_written(command: str) -> None:
    """Each documented ``gossipnet launch``/``peer`` line is read by the command's own
    parser: a renamed or removed flag in a doc fails here, naming the line."""
    from peer.app.launch import _parser
    from peer.app.peer_flags import peer_parser

    lines = _command_lines(command)
    assert len(lines) >= 5
    for where, argv in lines:
        parser = (
            _parser("gossipnet launch", False)
            if command == "launch"
            else peer_parser("gossipnet peer", raise_errors=True)
        )
        assert "--num-peers" not in argv, f"{where}: --num-peers is deprecated; write --peers"
        if command == "launch" and argv and not argv[0].startswith("-"):  # launch FILE [FLAGS]
            from gossipnet.experiment_launch import launch_plan
            from sim.config import load_experiment

            file, argv = ROOT / argv[0], argv[1:]  # EXPERIMENT.toml: a placeholder
            if file.is_file():
                argv = [*launch_plan(load_experiment(file)).flags, *argv]
        try:
            parser.parse_args(argv)
        except (SystemExit, Exception) as error:  # argparse's exit, or the one-line error
            pytest.fail(f"{where}: gossipnet {command} {shlex.join(argv)}: {error}")
