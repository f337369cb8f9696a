"""The notebooks under notebooks/ run, top to bottom, on small results folders (so they cannot rot).

Each notebook is executed with nbclient in a python3 kernel of this interpreter, pointed at the
folders tests/plots/test_plots.py draws (``tests.support.build_results``, through WISPSIM_RESULTS /
WISPSIM_RUNS), writing its figures to a temporary folder (WISPSIM_FIGURES). The files in the
repository are kept without outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import ROOT, build_results, is_png

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
ipykernel_spec = pytest.importorskip("ipykernel.kernelspec")

pytestmark = pytest.mark.slow  # executes the notebooks on results folders the CLI builds

NOTEBOOKS = ROOT / "notebooks"


@pytest.fixture
def kernel(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """A python3 kernelspec that runs this interpreter and imports this checkout's wispsim."""
    prefix = tmp_path_factory.mktemp("jupyter")
    ipykernel_spec.install(prefix=str(prefix), kernel_name="python3")
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return "python3"


def execute(name: str, kernel: str) -> object:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name=kernel, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, if a cell fails
    return nb


def outputs(nb: object) -> list[dict[str, object]]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["violation_curves.ipynb", "bursty.ipynb"])
def test_notebooks_are_stored_without_outputs(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_violation_curves_notebook_runs_on_a_compare_folder(
    kernel: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    compare, _ = build_results(tmp_path_factory)
    monkeypatch.setenv("WISPSIM_RESULTS", str(compare))
    monkeypatch.setenv("WISPSIM_FIGURES", str(tmp_path))
    nb = execute("violation_curves.ipynb", kernel)
    assert is_png(tmp_path / "violation_curves.png") and is_png(tmp_path / "capacity.png")
    outs = outputs(nb)
    assert sum("image/png" in o.get("data", {}) for o in outs) == 2  # type: ignore[operator]
    text = "".join(str(o.get("data", {}).get("text/plain", "")) for o in outs)  # type: ignore[attr-defined]
    assert "capacity" in text and "ci_low" in text  # the capacity table is shown


def test_bursty_notebook_compares_the_runs(
    kernel: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, runs = build_results(tmp_path_factory)
    monkeypatch.setenv("WISPSIM_RUNS", ",".join(str(f) for f in runs.values()))
    monkeypatch.setenv("WISPSIM_FIGURES", str(tmp_path))
    nb = execute("bursty.ipynb", kernel)
    assert is_png(tmp_path / "bursty_compare.png")
    outs = outputs(nb)
    assert sum("image/png" in o.get("data", {}) for o in outs) == 1  # type: ignore[operator]
    html = "".join(str(o.get("data", {}).get("text/html", "")) for o in outs)  # type: ignore[attr-defined]
    for col in ("compliance_at_peak", "recovery_s", "wisp", "fcfs"):  # bursts side by side
        assert col in html
