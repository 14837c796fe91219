"""The suite must pass on any host: CPU-only Linux, a Mac with MPS, a CUDA box.  Checked on the source.

Rule: a test function whose assertions expect a device name ("cpu", "cuda", "mps", "xpu", "cuda:0",
``torch.device("cpu")``, or such a name inside an expected message or a ``pytest.raises`` match)
must pin the device, or the expectation holds only on hosts like the one it was written on.

Where a device name counts as expected: in an ``assert``'s condition (not its message), outside
the arguments of ordinary calls (``_target(report, "cpu", mode)`` selects, it does not expect),
outside subscripts' keys; inside ``torch.device(...)``, ``set``/``sorted``/``any``/``all``/...
and the text arguments of ``startswith``/``endswith``; a module-level name bound to a device
(``CPU = torch.device("cpu")``) counts as the device.  In longer text only a lowercase device word
counts (``device cpu (...``, ``found: cpu``, ``'cuda:3'``), never ``CPU``/``CUDA`` prose.

Pinning, in the test function's own source or in a helper or fixture it uses (a module-level
function of its file, a function imported from a helper module beside the tests, or a conftest
fixture; followed transitively):
  * asking for the CPU: ``--device cpu``, ``device.name=cpu``, ``device="cpu"``, or building the
    device it hands to the code itself (a line ``cpu = torch.device("cpu")``; a ``torch.device("cpu")``
    written inline only as an argument does not count, it may only feed a reference computation);
  * ``CUDA_VISIBLE_DEVICES`` (a subprocess or worker that sees no CUDA);
  * patching a device probe: ``setattr`` on ``torch.cuda``, ``torch.backends.mps`` or ``torch.xpu``,
    or on one of the probe functions of ``alchemetric_ray/hardware/device.py`` (``PROBES``), or an
    assignment to one (``dev.mps_available = lambda: True`` in a subprocess's script).
Asking for cuda, mps or xpu pins nothing by itself: whether that device exists is the host's say.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from source_scan import dotted as _dotted

TESTS = Path(__file__).resolve().parent
DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu")
_DEVICE = r"(?:cpu|cuda|mps|xpu)(?::\d+)?"
WHOLE = re.compile(rf"\s*{_DEVICE}\s*\Z")
IN_TEXT = re.compile(rf"(?<![\w./-]){_DEVICE}(?![\w-])")
# The probe functions of alchemetric_ray/hardware/device.py (the only calls into torch's back-ends).
PROBES = ("cuda_available", "cuda_count", "cuda_name", "cuda_capability", "mps_built", "mps_available",
          "xpu_available", "xpu_count", "ray_worker_device")
_TORCH_PROBES = ("is_available", "is_built", "device_count")
PINS = (
    re.compile(r"""--device["',\s=]+cpu\b"""),
    re.compile(r"\bdevice\.name=cpu\b"),
    re.compile(r"""\bdevice\s*=\s*["']cpu["']"""),
    re.compile(r"""^\s*\w+\s*=\s*torch\.device\(\s*["']cpu["']\s*\)\s*$""", re.MULTILINE),
    re.compile(r"CUDA_VISIBLE_DEVICES"),
    re.compile(r"\bsetattr\(\s*torch\.(?:cuda|backends\.mps|xpu)\b"),
    re.compile(rf"""\bsetattr\(\s*[\w.]+\s*,\s*["'](?:{'|'.join(PROBES)})["']"""),
    re.compile(rf"\.(?:{'|'.join(PROBES + _TORCH_PROBES)})\s*=(?!=)"),
)
# Calls whose arguments are still expected values; other calls' arguments are inputs.
TRANSPARENT = {"torch.device", "set", "frozenset", "sorted", "list", "tuple", "dict", "str", "repr", "any", "all"}
TEXT_METHODS = {"startswith", "endswith", "find", "index", "count"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    function: str
    literal: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.function} expects device {self.literal!r} without pinning the device"


def _device_text(value: str) -> str | None:
    """The device word in ``value`` (a whole device name, or a lowercase one inside text), if any."""
    if WHOLE.match(value):
        return value.strip()
    found = IN_TEXT.search(value)
    return found.group(0) if found else None


def _expected(node: ast.AST, device_names: set[str]):
    """(node, device word) for each device an expression expects (see the module docstring)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str) and (word := _device_text(node.value)):
            yield node, word
        return
    if isinstance(node, ast.Name):
        if node.id in device_names:
            yield node, node.id
        return
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        if name in TRANSPARENT:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                yield from _expected(arg, device_names)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_METHODS:
            for arg in [node.func.value, *node.args]:
                yield from _expected(arg, device_names)
        elif isinstance(node.func, ast.Attribute):
            yield from _expected(node.func.value, device_names)  # the receiver of a method, e.g. "...".format()
        return
    if isinstance(node, ast.Subscript):
        yield from _expected(node.value, device_names)  # the key selects, it does not expect
        return
    if isinstance(node, ast.Attribute):
        yield from _expected(node.value, device_names)
        return
    if isinstance(node, ast.Lambda):
        return
    for child in ast.iter_child_nodes(node):
        yield from _expected(child, device_names)


def _module_device_names(tree: ast.Module) -> set[str]:
    """Module-level names bound to a device: ``CPU = torch.device("cpu")``, ``GPU = "cuda"``."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(True for _ in _expected(node.value, set())):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _expectations(fn: ast.FunctionDef, device_names: set[str]):
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            yield from _expected(node.test, device_names)
        elif isinstance(node, ast.Call) and _dotted(node.func) == "pytest.raises":
            for k in node.keywords:
                if k.arg == "match":
                    yield from _expected(k.value, device_names)


def _functions(tree: ast.Module, source: str) -> dict[str, tuple[str, ast.AST]]:
    """Module-level functions (helpers and fixtures), by name: (source, node)."""
    return {n.name: (ast.get_source_segment(source, n) or "", n) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _helper_modules(tree: ast.Module, folder: Path) -> dict[str, tuple[str, ast.AST]]:
    """Functions imported (``from X import f``) from helper modules in the tests' folder, and conftest's."""
    found: dict[str, tuple[str, ast.AST]] = {}
    sources = [folder / "conftest.py"]
    wanted: dict[Path, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            path = folder / (node.module.replace(".", "/") + ".py")
            if path.is_file():
                wanted.setdefault(path, set()).update(a.name for a in node.names)
                sources.append(path)
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text()
        functions = _functions(ast.parse(text), text)
        names = wanted.get(path) if path.name != "conftest.py" else None
        found.update({k: v for k, v in functions.items() if names is None or k in names})
    return found


def _referenced(fn: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names |= {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}  # fixtures
    return names


def _pinned(name: str, known: dict[str, tuple[str, ast.AST]]) -> bool:
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in known:
            continue
        seen.add(current)
        text, node = known[current]
        if any(p.search(text) for p in PINS):
            return True
        todo += sorted(_referenced(node) & known.keys())
    return False


def check_source(source: str, path: str = "<source>", folder: Path = TESTS) -> list[Finding]:
    """Every device a test function of ``source`` expects without pinning the device."""
    tree = ast.parse(source, filename=path)
    device_names = _module_device_names(tree)
    known = {**_helper_modules(tree, folder), **_functions(tree, source)}
    tests = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        tests += [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    findings = []
    for fn in tests:
        if not fn.name.startswith("test"):
            continue
        expected = list(_expectations(fn, device_names))
        if not expected:
            continue
        known_here = {**known, fn.name: (ast.get_source_segment(source, fn) or "", fn)}
        if _pinned(fn.name, known_here):
            continue
        findings += [Finding(path, node.lineno, fn.name, word) for node, word in expected]
    return findings


# ---- the suite -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_no_test_expects_a_device_it_did_not_ask_for():
    files = sorted(TESTS.glob("test_*.py"))
    assert len(files) > 10
    findings = [str(f) for path in files for f in check_source(path.read_text(), path.name)]
    assert findings == [], "\n".join(findings)


def test_probe_names_are_the_products():
    from alchemetric_ray.hardware import device

    assert [p for p in PROBES if not callable(getattr(device, p, None))] == []


# ---- the checker on small sources ----------------------------------------------------------------


def _check(body: str) -> list[tuple[str, str]]:
    source = "import json, pytest, torch\nfrom alchemetric_ray.cli import main\n" + textwrap.dedent(body)
    return [(f.function, f.literal) for f in check_source(source)]


def test_checker_flags_an_unpinned_device_and_passes_a_pinned_one():
    assert _check("""
        def test_env(capsys):
            main(["env", "--json"])
            out = json.loads(capsys.readouterr().out)
            assert out["device"] == "cpu"
    """) == [("test_env", "cpu")]
    assert _check("""
        def test_env(capsys):
            main(["env", "--json", "--device", "cpu"])
            out = json.loads(capsys.readouterr().out)
            assert out["device"] == "cpu"
    """) == []


def test_checker_rules_in_detail():
    flagged = _check("""
        CPU = torch.device("cpu")

        def test_text(out):
            assert "device            cpu (no CUDA, MPS or XPU available)" in out

        def test_match():
            with pytest.raises(ValueError, match="asked for 'cuda:3'"):
                pass

        def test_torch_device(choice):
            assert choice.device in {torch.device("mps"), CPU}

        def test_asking_for_cuda_pins_nothing(capsys):
            main(["env", "--device", "cuda"])
            assert "found: cpu" in capsys.readouterr().out

        def test_inline_reference_device_pins_nothing(predict, reference):
            assert predict()["device"] == "cpu" and reference(torch.device("cpu"))
    """)
    assert flagged == [("test_text", "cpu"), ("test_match", "cuda:3"), ("test_torch_device", "mps"),
                       ("test_torch_device", "CPU"), ("test_asking_for_cuda_pins_nothing", "cpu"),
                       ("test_inline_reference_device_pins_nothing", "cpu")]
    assert _check("""
        import subprocess
        from alchemetric_ray.hardware import device as dev

        def no_gpu(monkeypatch):
            monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

        @pytest.fixture
        def machine(monkeypatch):
            monkeypatch.setattr(dev, "mps_available", lambda: True)

        def test_helper(monkeypatch):
            no_gpu(monkeypatch)
            assert main(["env"]) == "cpu"

        def test_fixture(machine):
            assert dev.resolve_device().device.type == "mps"

        def test_script():
            out = subprocess.run(["python", "-c", "dev.cuda_available = lambda: False; print('cpu')"])
            assert out.stdout == "cpu"

        def test_env_var():
            out = subprocess.run(["alchemetric-ray", "env"], env={"CUDA_VISIBLE_DEVICES": ""})
            assert out.stdout.startswith("cpu")

        def test_built_device(certify):
            cpu = torch.device("cpu")
            assert certify(cpu)["certified"] == ["cpu/fp32"]

        def test_inputs_and_prose(report):
            assert pick(report, "cpu", "fp32")["passed"] and report["by"]["cpu"]
            assert "LSTM fails under CPU autocast" in report["why"] and report["cpus"] == 2
            assert report["ok"], "message about cpu"
    """) == []
