"""The simulator's notebook runs top to bottom (nbclient, a real Jupyter kernel)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "simulator_tour.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(300)  # a Jupyter kernel start plus 6 short runs, on a shared CI core
def test_simulator_tour_notebook_runs(tmp_path: Path) -> None:
    copy = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, copy)
    notebook = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=280,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    text = "\n".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    assert "dpsgd" in text and "slower with the straggler" in text
    assert (tmp_path / "tour.png").stat().st_size > 10_000
