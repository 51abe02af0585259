"""The notebooks run top to bottom (fast mode) through a Jupyter kernel."""
from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NB = Path(__file__).resolve().parents[1] / "notebooks"


def executed(name: str, monkeypatch, timeout: int = 300):
    """notebooks/NAME, committed without outputs, run in fast mode without an error cell."""
    monkeypatch.setenv("SIMSERVE_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NB / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # committed stripped
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    return nb


@pytest.mark.parametrize("name", ["what_if.ipynb", "profiles.ipynb"])
def test_notebook_executes(name, monkeypatch):
    executed(name, monkeypatch)


@pytest.mark.timeout(600)
def test_plan_notebook_executes(monkeypatch):
    nb = executed("plan.ipynb", monkeypatch, timeout=500)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "winner:" in text
