"""examples/notebooks/quickstart.ipynb runs from top to bottom (on the CPU in CI), so it cannot rot.

It runs here from a folder outside the repository, as a reader's Jupyter
might: it must still find the committed H100 figures and plot them beside
its own quick run, print no warning a reader cannot act on, and leave no
report files behind in the temporary folder.
"""
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs_from_any_folder(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    cwd, tmp = tmp_path / "elsewhere", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the kernel's tempfile folder: what the notebook leaves there
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # one more cell, the test's own: what the last figure holds
    notebook.cells.append(nbformat.v4.new_code_cell(
        'print("plotted", [len(ax.lines) for ax in fig.axes], all(len(line.get_xdata()) > 0 '
        'for ax in fig.axes for line in ax.lines))'))
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    stdout = "".join(out.get("text", "") for out in outputs if out.get("name") == "stdout")
    stderr = "".join(out.get("text", "") for out in outputs if out.get("name") == "stderr")
    assert not [out for out in outputs if out.get("output_type") == "error"]
    assert "losses" in stdout and "from GPU memory" in stdout
    assert "H100 figures: " in stdout and "not found" not in stdout, stdout
    assert "plotted [4, 2] True" in stdout  # H100: three variants and the limit; here: hmgstore and the CPU
    assert any("image/png" in out.get("data", {}) for out in notebook.cells[-2].get("outputs", []))
    assert "IProgress" not in stderr and "Warning" not in stderr, stderr
    assert not list(tmp.rglob("gather.*")), "the quick run left its report files behind"


BIG_TABLE = NOTEBOOK.parent / "big_table.ipynb"


def test_big_table_notebook_runs_from_any_folder(tmp_path):
    """examples/notebooks/big_table.ipynb: a table per stored format, its errors and bytes, plotted beside the
    committed accuracy and H100 figures; committed without outputs (no images in git)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(BIG_TABLE, as_version=4)
    assert not [cell for cell in notebook.cells if cell.cell_type == "code" and cell.get("outputs")], \
        "commit the notebook with its outputs cleared"
    notebook.cells.append(nbformat.v4.new_code_cell(
        'print("plotted", [len(ax.patches) + len(ax.lines) for ax in fig.axes])'))
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    stdout = "".join(out.get("text", "") for out in outputs if out.get("name") == "stdout")
    stderr = "".join(out.get("text", "") for out in outputs if out.get("name") == "stderr")
    assert not [out for out in outputs if out.get("output_type") == "error"]
    lines = {line.split()[0]: line.split() for line in stdout.splitlines()  # the table: format, bytes, MB, ...
             if len(line.split()) == 7 and line.split()[1].isdigit()}
    assert lines["float32"][1:3] == ["512", "204.8"] and lines["int8"][1] == "144"  # bytes a row, host MB
    assert float(lines["int8"][4]) < 0.02 and float(lines["bfloat16"][4]) < 0.01  # relative errors
    assert lines["float32"][4] == "0.00e+00"
    assert "int8 rows equal torch's: True" in stdout
    assert "not found" not in stdout and "GraphSAGE test accuracy, float32: 0.7190" in stdout, stdout
    plotted = [int(n) for n in stdout.split("plotted [")[1].split("]")[0].split(",")]
    assert len(plotted) == 4 and all(n > 0 for n in plotted), plotted
    assert any("image/png" in out.get("data", {}) for out in notebook.cells[-2].get("outputs", []))
    assert "Warning" not in stderr, stderr
