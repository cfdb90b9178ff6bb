"""The notebooks in notebooks/: each executes headless without error, and each is stored with
its outputs stripped (the repository holds code and prose, not results).

Execution uses nbclient with a kernel spec written for this test that runs the interpreter of
the test itself (``sys.executable``), so the notebooks see the same environment (the project's
virtual environment) whatever kernels are installed elsewhere on the machine. Notebooks are
found by globbing, so a new notebook is tested without editing this file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL_NAME = "hwnas-test-python"
#: Seconds one cell may run before the notebook fails (they take a minute at most in total).
CELL_TIMEOUT = 600


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_outputs_are_stripped(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.get("outputs") == [], (f"{path.name}: code cell {i} has stored outputs; "
                                           f"clear all outputs before saving the notebook")
        assert cell.get("execution_count") is None, \
            f"{path.name}: code cell {i} has an execution count"
        assert "execution" not in cell.get("metadata", {}), \
            f"{path.name}: code cell {i} has execution timings in its metadata"


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Jupyter data directory holding one kernel spec that runs this interpreter."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
    }))
    return root


#: Smaller budgets for executing the notebooks here (their own settings are sized for a reader's
#: results; every cell runs the same code at either size). Each text must occur exactly once in
#: the notebook's code, so a notebook whose settings change fails here instead of silently
#: running at full size.
TEST_BUDGETS = {
    "01_pareto_fronts.ipynb": [("epochs=5,", "epochs=1,"), ("trials=24,", "trials=8,")],
    "03_quantization.ipynb": [("SEED, EPOCHS = 0, 6", "SEED, EPOCHS = 0, 1")],
    "04_cnn_vs_transformer.ipynb": [('epochs=6, name="04-vit-digits"',
                                     'epochs=2, name="04-vit-digits"')],
}
#: where the notebooks write their runs (notebooks/runs/); the test writes into a temporary folder
RUNS_OUT = 'out="runs"'


def with_test_budgets(nb, name: str, runs: Path):
    """``nb`` with the budgets of :data:`TEST_BUDGETS` and its runs written under ``runs``
    (a reader's notebooks/runs/ is neither reused nor overwritten)."""
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for old, new in TEST_BUDGETS.get(name, []):
        hits = sum(cell.source.count(old) for cell in code)
        assert hits == 1, f"{name}: {old!r} occurs {hits} times in its code (expected once)"
        for cell in code:
            cell.source = cell.source.replace(old, new)
    for cell in code:
        cell.source = cell.source.replace(RUNS_OUT, f"out={str(runs)!r}")
    return nb


def test_test_budgets_apply_once_and_move_the_runs(tmp_path: Path) -> None:
    for path in NOTEBOOKS:
        nb = with_test_budgets(nbformat.read(path, as_version=4), path.name, tmp_path)
        assert RUNS_OUT not in "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert set(TEST_BUDGETS) <= {p.name for p in NOTEBOOKS}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("EPOCHS = 3")])
    with pytest.raises(AssertionError, match="occurs 0 times"):
        with_test_budgets(nb, "03_quantization.ipynb", tmp_path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes(path: Path, kernel_dir: Path, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
        [str(kernel_dir), *filter(None, [os.environ.get("JUPYTER_PATH")])]))
    # one thread each for torch/BLAS: the notebooks are small and CI machines are shared
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = with_test_budgets(nbformat.read(path, as_version=4), path.name, tmp_path / "runs")
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the cell that failed
    seconds = time.perf_counter() - start
    print(f"{path.name}: executed in {seconds:.1f} s")
    stderr = [out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.get("name") == "stderr"]
    assert not any("Traceback" in text for text in stderr), \
        f"{path.name}: a cell printed a traceback to stderr"


#: what a notebook may import from hwnas: the packages' public names, and the one function
#: that shares its module's name (hwnas.quant's docstring says to import it from there)
PUBLIC = {"hwnas", "hwnas.search", "hwnas.supernet", "hwnas.latency", "hwnas.quant",
          "hwnas.export", "hwnas.quant.ptq"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebooks_use_the_public_api(path: Path) -> None:
    import ast

    nb = nbformat.read(path, as_version=4)
    code = "\n".join(line for cell in nb.cells if cell.cell_type == "code"
                     for line in cell.source.splitlines() if not line.startswith("%"))
    used = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            used.add(node.module)
        elif isinstance(node, ast.Import):
            used.update(a.name for a in node.names)
    internal = sorted(m for m in used if m.split(".")[0] == "hwnas" and m not in PUBLIC)
    assert not internal, f"{path.name} imports internal modules: {internal}"


NEEDS_SHARED_DATA = [p for p in NOTEBOOKS if "shared_data_dir" in p.read_text()]


@pytest.mark.parametrize("path", NEEDS_SHARED_DATA, ids=_ids(NEEDS_SHARED_DATA))
def test_notebook_without_shared_data(path: Path, kernel_dir: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook that reads ../shared/data still executes where the data is absent, and
    says why it skipped its analysis."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    monkeypatch.setenv("HWNAS_SHARED_DATA", str(tmp_path / "no-such-dir"))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    # the test budgets, and runs written under tmp_path (never into the checkout)
    nb = with_test_budgets(nbformat.read(path, as_version=4), path.name, tmp_path / "runs")
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL_NAME,
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    stdout = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []) if out.get("name") == "stdout")
    assert "not available" in stdout and "HWNAS_SHARED_DATA" in stdout, stdout


#: where notebook 04 reads the committed CIFAR-10 fronts (benchmarks/cifar10_fronts.py writes them)
CIFAR_FRONTS = 'FRONTS_JSON = Path("../benchmarks/cifar10_fronts.json")'


def test_cifar10_fronts_section_without_its_json(kernel_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Notebook 04's CIFAR-10 section (run alone, after the imports) reads the committed
    benchmark JSON and evaluates nothing; where the file is absent it says so and skips its
    cells instead of failing."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    nb = nbformat.read(NOTEBOOK_DIR / "04_cnn_vs_transformer.ipynb", as_version=4)
    start = next(i for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" and c.source.startswith("## 5. CIFAR-10"))
    imports = next(c for c in nb.cells if c.cell_type == "code")
    code = [imports] + [c for c in nb.cells[start:] if c.cell_type == "code"]
    assert sum(c.source.count(CIFAR_FRONTS) for c in code) == 1, "the section's JSON path moved"
    assert (NOTEBOOK_DIR / "../benchmarks/cifar10_fronts.json").is_file()
    missing = tmp_path / "cifar10_fronts.json"
    for cell in code:
        cell.source = cell.source.replace(CIFAR_FRONTS, f"FRONTS_JSON = Path({str(missing)!r})")
    nb.cells = code
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL_NAME,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
    outputs = [out for cell in nb.cells for out in cell.get("outputs", [])]
    stdout = "".join(out.get("text", "") for out in outputs if out.get("name") == "stdout")
    assert "not available" in stdout and "benchmarks/cifar10_fronts.py" in stdout, stdout
    assert not any(out.get("output_type") in ("display_data", "execute_result")
                   for out in outputs), "a cell displayed something without the results"


def test_kernel_is_this_interpreter(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebooks run in the interpreter (virtual environment) that runs the tests."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys; print(sys.executable)")])
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL_NAME).execute()
    assert nb.cells[0].outputs[0]["text"].strip() == sys.executable
