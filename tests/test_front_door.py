"""The `gossipnet` command, the package layout and the layering contracts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_help_lists_every_subcommand() -> None:
    from gossipnet.cli import SUBCOMMANDS

    result = run(str(BIN / "gossipnet"), "--help")
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert f"  {name}  " in result.stdout or f"  {name} " in result.stdout


def test_unknown_subcommand_exits_2_and_lists_choices() -> None:
    result = run(str(BIN / "gossipnet"), "no-such-command")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "gossipnet: error: COMMAND: invalid choice 'no-such-command'; allowed: demo, peer,"
    )
    assert len(result.stderr.strip().splitlines()) == 1
    assert "topology" in result.stderr


def test_python_dash_m_matches_console_script() -> None:
    result = run(sys.executable, "-m", "gossipnet", "--version")
    assert result.returncode == 0
    assert result.stdout.startswith("gossipnet ")


def test_import_linter_contracts_hold() -> None:
    result = run(str(BIN / "lint-imports"), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


PACKAGES = ["topologies", "workloads", "consensus", "gossip", "peer"]


def test_packages_do_not_pull_in_matplotlib() -> None:
    """An edge device installs the peer without the plotting stack: plotting is lazy. Every
    module of each package, package by package in one process (a Python start-up with torch
    for all five): the first package whose modules load matplotlib is the one named."""
    code = "import sys, pkgutil, importlib\n" + (
        f"for package in {PACKAGES!r}:\n"
        "    root = importlib.import_module(package)\n"
        "    for m in pkgutil.walk_packages(root.__path__, package + '.'):\n"
        "        if not m.name.endswith('.__main__'):\n"
        "            importlib.import_module(m.name)\n"
        "    print(package, 'matplotlib' in sys.modules)\n"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [word for p in PACKAGES for word in (p, "False")]


def test_a_peer_starts_without_networkx_or_scipy() -> None:
    """Every ``gossipnet peer`` and ``launch`` process imports its command's modules before
    it parses a flag: without a --topology they never build a graph, so ``topologies`` gives
    them its names and specs without networkx and scipy (about 0.2 s of processor time each,
    lazy in topologies/__init__.py, graphs.py, schedules.py, neighbours.py and specs.py)."""
    code = (
        "import sys\n"
        "import peer.app.cli, peer.app.launch, topologies\n"
        "print(topologies.parse_spec('ring')[0], 'networkx' in sys.modules, 'scipy' in sys.modules)\n"
        "topologies.build_schedule('ring', 4)\n"
        "print('networkx' in sys.modules, 'scipy' in sys.modules)\n"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ring", "False", "False", "True", "True"], result.stdout


def test_every_subcommand_resolves_to_a_main_function() -> None:
    from gossipnet.cli import SUBCOMMANDS

    for command in SUBCOMMANDS.values():
        assert callable(command.load()), command.target


def test_status_does_not_import_torch() -> None:
    """``gossipnet status`` answers in well under a second: its path (the dispatcher,
    ``peer.app.status``, one GET that fails here) loads neither torch nor aiohttp."""
    code = (
        "import sys\n"
        "from gossipnet.cli import main\n"
        "code = main(['status', '127.0.0.1:1', '--timeout-s', '2'])\n"
        "print(code, 'torch' in sys.modules, 'aiohttp' in sys.modules)\n"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "False", "False"], result.stdout
    assert "cannot reach http://127.0.0.1:1/v1/status" in result.stderr


def test_import_gossipnet_is_light_and_load_model_comes_on_first_use() -> None:
    code = (
        "import sys, gossipnet\n"
        "light = 'torch' not in sys.modules\n"
        "from peer.node.model_file import load_model\n"
        "from peer.app import export\n"
        "print(light, gossipnet.load_model is load_model is export.load_model,\n"
        "      'load_model' in gossipnet.__all__)\n"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]


def test_export_is_a_subcommand() -> None:
    from gossipnet.cli import SUBCOMMANDS

    assert SUBCOMMANDS["export"].target == "peer.app.export:main"
    result = run(str(BIN / "gossipnet"), "export", "--help")
    assert result.returncode == 0, result.stderr
    assert "gossipnet export" in result.stdout
