"""docs/python.md: its reference is generated from the docstrings of every name in ``ar.__all__`` and the
committed page is current; its walk-through and the quickstart notebook use only that public surface."""

from __future__ import annotations

import ast
import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import alchemetric_ray as ar
from alchemetric_ray.api_reference import MARKER, PAGE, main, page, render

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"
REGENERATE = f"run `python -m alchemetric_ray.api_reference --out {PAGE}` and commit it"


def test_the_committed_reference_is_current():
    committed = (REPO / PAGE).read_text()
    assert committed.count(MARKER) == 1, f"{PAGE} needs its marker line once: {MARKER}"
    assert committed == page(committed), f"{PAGE}'s reference is stale: {REGENERATE}"


def test_the_reference_documents_every_public_name():
    text = render()
    for name in ar.__all__:
        assert f"`ar.{name}`" in text, name
    for line in text.splitlines():  # each error class has its own line
        if line.startswith("| `ar."):
            assert line.count("|") - line.count("\\|") == 4, line
    assert "stable surface" in text and "internal" in text


def test_the_module_prints_the_reference_and_writes_it_below_the_marker(tmp_path):
    said = io.StringIO()
    with redirect_stdout(said):
        assert main([]) == 0
    assert said.getvalue() == render()
    target = tmp_path / "python.md"
    target.write_text(f"# hand-written\n\nkept\n\n{MARKER}\nold reference\n")
    with redirect_stdout(io.StringIO()):
        assert main(["--out", str(target)]) == 0
    assert target.read_text() == f"# hand-written\n\nkept\n\n{render()}"


def _ar_names(source: str) -> set[str]:
    """Every ``ar.NAME`` that Python source uses."""
    tree = ast.parse(source)
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ar"}


def test_the_walk_through_and_the_notebook_use_only_the_public_surface():
    guide = (REPO / PAGE).read_text().split(MARKER)[0]
    scripts = re.findall(r"```python\n(.*?)```", guide, re.DOTALL)
    assert scripts, f"{PAGE} has a walk-through"
    cells = [cell["source"] for cell in json.loads(NOTEBOOK.read_text())["cells"] if cell["cell_type"] == "code"]
    cells = ["".join(source) if isinstance(source, list) else source for source in cells]
    notebook = "\n".join(line for cell in cells for line in cell.splitlines() if not line.startswith("%"))
    for where, source in ((PAGE, "\n".join(scripts)), (str(NOTEBOOK.relative_to(REPO)), notebook)):
        used = _ar_names(source)
        assert used - set(ar.__all__) == set(), f"{where} uses names outside ar.__all__"
        assert {"env", "load_config", "features", "train", "predict", "tune", "runs", "load_result"} <= used, where
