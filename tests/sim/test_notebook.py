"""The simulator's notebooks run top to bottom from a fresh kernel (nbclient, a real Jupyter
kernel), with the small settings they switch to under GOSSIPNET_NOTEBOOK_QUICK=1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

# notebook -> (text its outputs must contain, figures it must write)
EXPECTED = {
    "simulator_tour.ipynb": (["dpsgd", "slower with the straggler"], ["tour.png"]),
    "network_regimes.ipynb": (
        ["latency-bound: target accuracy", "parameter-server", "time to target"],
        ["regimes_time.png", "regimes_bytes.png", "regimes_target.png"],
    ),
    "topologies_spectral_gap.ipynb": (
        ["spectral gap", "one-peer-exponential", "consensus distance"],
        ["topologies_gap.png"],
    ),
    "byzantine_rules.ipynb": (
        ["trimmed-mean b=2", "dissensus", "worst honest peer"],
        ["byzantine_grid.png"],
    ),
}


def test_every_notebook_is_tested() -> None:
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)


@pytest.mark.slow
@pytest.mark.timeout(240)  # a Jupyter kernel start plus a few tiny runs, on a shared CI core
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_top_to_bottom(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOSSIPNET_NOTEBOOK_QUICK", "1")
    copy = tmp_path / name
    shutil.copy(NOTEBOOKS / name, copy)
    notebook = nbformat.read(copy, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(
        notebook,
        timeout=200,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    assert os.environ["GOSSIPNET_NOTEBOOK_QUICK"] == "1"  # the kernel inherits it
    client.execute()
    text = "\n".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    phrases, figures = EXPECTED[name]
    for phrase in phrases:
        assert phrase in text, f"{name}: {phrase!r} missing from the outputs"
    for figure in figures:
        assert (tmp_path / figure).stat().st_size > 10_000, f"{name}: {figure} not drawn"
