"""Architecture rules, checked on the source: only hardware/ (and the doctor) knows device kinds."""

import ast
from pathlib import Path

from source_scan import dotted as _dotted

PACKAGE = Path(__file__).resolve().parents[1] / "alchemetric_ray"
ALLOWED = {"hardware", "doctor"}
DEVICE_WORDS = {"cuda", "mps", "xpu", "cpu"}
PROBE_PREFIXES = ("torch.cuda.", "torch.backends.mps", "torch.mps.", "torch.xpu.", "torch.backends.cudnn")


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name.startswith(PROBE_PREFIXES):
                found.append(f"{path.name}:{node.lineno} uses {name}")
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                consts = [side] if isinstance(side, ast.Constant) else list(getattr(side, "elts", []))
                for c in consts:
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.split(":")[0] in DEVICE_WORDS:
                        found.append(f"{path.name}:{node.lineno} compares against device kind {c.value!r}")
    return found


def test_no_device_branching_outside_hardware():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ALLOWED:
            continue
        offenders += _violations(path)
    assert offenders == []


def test_the_checker_catches_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nif dev.type == 'mps':\n    pass\nx = torch.cuda.is_available()\ny = d in ('cuda', 'cpu')\n")
    lines = sorted({f.split(" ")[0] for f in _violations(bad)})
    assert lines == ["bad.py:2", "bad.py:4", "bad.py:5"]
