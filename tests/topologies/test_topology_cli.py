"""``gossipnet topology`` as a real OS process (its argument mistakes but one in-process)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from topologies import TOPOLOGIES

ROOT = Path(__file__).resolve().parents[2]


def gossipnet(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gossipnet", "topology", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_exponential_64_prints_gap_two_sevenths() -> None:
    result = gossipnet("exponential", "--nodes", "64")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "spectral gap        0.2857" in text
    assert "rounds to 0.001     21" in text  # ceil(ln 1e-3 / ln(5/7))
    assert "min/max out-degree  6 / 6" in text
    assert "edges               384" in text
    assert "diameter            6" in text


def test_json_output_for_a_ring() -> None:
    result = gossipnet("ring", "--nodes", "16", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["topology"] == "ring" and summary["directed"] is False
    assert (summary["nodes"], summary["edges"], summary["diameter"]) == (16, 16, 8)
    assert (summary["min_degree"], summary["max_degree"]) == (2, 2)
    assert summary["weights"] == "metropolis"
    lambda2 = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / 16)
    assert summary["spectral_gap"] == pytest.approx(1 - lambda2, abs=1e-12)
    assert summary["rounds_to_consensus"] == math.ceil(math.log(1e-3) / math.log(lambda2))


def test_parameters_and_weights_reach_the_builder() -> None:
    result = gossipnet(
        "random-regular",
        "--nodes",
        "32",
        "--degree",
        "3",
        "--seed",
        "4",
        "--weights",
        "lazy",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["min_degree"], summary["max_degree"], summary["edges"]) == (3, 3, 48)
    assert summary["weights"] == "lazy"
    import topologies

    W = topologies.mixing_matrix(topologies.random_regular(32, 3, seed=4), "lazy")
    assert summary["spectral_gap"] == pytest.approx(topologies.spectral_gap(W), abs=1e-12)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["mesh", "--nodes", "8"],
            "argument NAME: unknown topology 'mesh'; choose one of: ring, torus",
        ),
        (["ring", "--nodes", "1"], "argument --nodes: n=1 is too small"),
        (["hypercube", "--nodes", "12"], "argument --nodes: hypercube needs n a power of two"),
        (["torus", "--nodes", "13"], "argument --nodes: torus needs n = rows * cols"),
        (
            ["random-regular", "--nodes", "7", "--degree", "3"],
            "argument --degree: degree=3 is impossible for n=7",
        ),
        (
            ["exponential", "--nodes", "16", "--weights", "metropolis"],
            "argument --weights: the directed exponential graph has fixed uniform weights",
        ),
        (["ring", "--nodes", "8", "--degree", "3"], "argument --degree: ring does not take it"),
        (
            ["ring", "--nodes", "8", "--weights", "boyd"],
            "argument --weights: invalid choice: 'boyd'",
        ),
        (["erdos-renyi", "--nodes", "8", "--p", "1.5"], "argument --p: p=1.5 is out of range"),
        (["ring", "--nodes", "8", "--factor", "2"], "argument --factor: 2 must lie in (0, 1)"),
        (
            ["ring", "--nodes", "8", "--plot", "graph.svg"],
            "argument --plot: 'graph.svg' must end in .png",
        ),
        (["ring"], "the following arguments are required: --nodes"),
    ],
)
def test_bad_input_prints_one_error_line_and_exits_2(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The unknown name in a real process; the other mistakes through the same entry point
    (``gossipnet.cli.main``) in this process, which saves a Python start-up each."""
    if args[0] == "mesh":
        result = gossipnet(*args)
        code, out, err = result.returncode, result.stdout, result.stderr
    else:
        from gossipnet.cli import main

        with pytest.raises(SystemExit) as exited:
            main(["topology", *args])
        code = exited.value.code
        out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0], err
    assert "Traceback" not in err


def test_help_explains_every_topology_and_flag() -> None:
    result = gossipnet("--help")
    assert result.returncode == 0
    for name, spec in TOPOLOGIES.items():
        assert f"  {name} " in result.stdout
        assert spec.summary.split()[0] in result.stdout
    for flag in [
        "--nodes",
        "--degree",
        "--p",
        "--weights",
        "--seed",
        "--json",
        "--plot",
        "--factor",
    ]:
        assert flag in result.stdout
    assert "fixed" in result.stdout and "uniform" in result.stdout


def test_plot_writes_a_png_atomically(tmp_path: Path) -> None:
    target = tmp_path / "dumbbell.png"
    result = gossipnet("dumbbell", "--nodes", "12", "--plot", str(target))
    assert result.returncode == 0, result.stderr
    assert "spectral gap" in result.stdout
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["dumbbell.png"]  # no temporary left behind
    missing = gossipnet("ring", "--nodes", "8", "--plot", str(tmp_path / "nowhere" / "x.png"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
