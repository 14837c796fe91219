"""Architecture rules, checked on the source: only hardware/ knows device kinds.

Outside ``alchemetric_ray/hardware/`` no module may call torch's device back-ends or branch on a
device kind ("cuda", "mps", "xpu", "cpu", "cuda:0"): no comparison, ``in`` test, ``startswith``,
dict keyed by a kind, ``match`` case, ``getattr(torch, kind)``, or list of kinds to pick from.
The one list of kinds a user may write is a ``Literal[...]`` type in config/vocabulary.py;
what each kind means lives in hardware/, so adding a device kind touches nothing else with logic.
"""

import ast
from pathlib import Path

from source_scan import dotted as _dotted

PACKAGE = Path(__file__).resolve().parents[1] / "alchemetric_ray"
ALLOWED = {"hardware"}
DEVICE_WORDS = {"cuda", "mps", "xpu", "cpu"}
PROBE_PREFIXES = ("torch.cuda.", "torch.backends.mps", "torch.mps.", "torch.xpu.", "torch.backends.cudnn")
TEXT_TESTS = {"startswith", "endswith", "removeprefix", "removesuffix", "find", "rfind", "index", "rindex", "count"}
ATTRIBUTE_CALLS = {"getattr", "hasattr", "setattr", "delattr"}


def _is_device_word(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.split(":")[0] in DEVICE_WORDS)


def _device_words(node: ast.AST) -> list[ast.AST]:
    """``node`` itself if it is a device-kind string, else the device-kind strings it lists."""
    if _is_device_word(node):
        return [node]
    return [e for e in getattr(node, "elts", []) if _is_device_word(e)]


def _literal_types(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``Literal[...]`` subscripts: a type's vocabulary, not a branch."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _dotted(node.value).split(".")[-1] == "Literal":
            inside |= {id(n) for n in ast.walk(node.slice)}
    return inside


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    vocabulary = _literal_types(tree)
    found = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{path.name}:{node.lineno} {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name.startswith(PROBE_PREFIXES):
                flag(node, f"uses {name}")
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                for c in _device_words(side):
                    flag(node, f"compares against device kind {c.value!r}")
        elif isinstance(node, ast.Call):
            func = _dotted(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_TESTS:
                for arg in node.args:
                    for c in _device_words(arg):
                        flag(node, f"tests text against device kind {c.value!r} with {node.func.attr}")
            if func in ATTRIBUTE_CALLS and node.args and _dotted(node.args[0]).split(".")[0] == "torch":
                attr = node.args[1] if len(node.args) > 1 else None
                if attr is None or not isinstance(attr, ast.Constant) or _is_device_word(attr):
                    flag(node, f"looks up a torch back-end by name with {func}")
            if func == "dict":
                for kw in node.keywords:
                    if kw.arg and kw.arg in DEVICE_WORDS:
                        flag(node, f"builds a dict keyed by device kind {kw.arg!r}")
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if key is not None and _is_device_word(key):
                    flag(node, f"builds a dict keyed by device kind {key.value!r}")
        elif isinstance(node, ast.MatchValue) and _is_device_word(node.value):
            flag(node, f"matches device kind {node.value.value!r}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in vocabulary:
            # a list of names to pick from (all strings, one a device kind); ("cpu", cpu_model()) is a pair
            words = _device_words(node)
            if words and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                flag(node, f"lists device kinds {[w.value for w in words]}")
    return found


def test_no_device_branching_outside_hardware():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ALLOWED:
            continue
        offenders += _violations(path)
    assert offenders == []


def test_every_package_but_hardware_is_checked():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert ALLOWED == {"hardware"} and "checks" in packages - ALLOWED


def test_the_checker_catches_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nif dev.type == 'mps':\n    pass\n"
                   "x = torch.cuda.is_available()\ny = d in ('cuda', 'cpu')\n")
    lines = sorted({f.split(" ")[0] for f in _violations(bad)})
    assert lines == ["bad.py:2", "bad.py:4", "bad.py:5"]


def test_the_checker_catches_the_dodges(tmp_path):
    dodges = {
        "startswith": "ok = name.startswith('cuda')\n",
        "startswith a tuple": "ok = name.endswith(('mps', 'xpu'))\n",
        "dict keyed by kind": "probe = {'cuda': cuda_ok, 'mps': mps_ok}[kind]\n",
        "dict() keyed by kind": "probe = dict(cuda=cuda_ok)[kind]\n",
        "getattr(torch, kind)": "import torch\nbackend = getattr(torch, kind)\n",
        "getattr(torch, 'mps')": "import torch\nbackend = getattr(torch, 'mps')\n",
        "hasattr(torch.backends, kind)": "import torch\nok = hasattr(torch.backends, kind)\n",
        "match": "match kind:\n    case 'cuda':\n        pass\n    case _:\n        pass\n",
        "match an or-pattern": "match kind:\n    case 'cpu' | 'mps':\n        pass\n",
        "match a class pattern": "match dev:\n    case torch.device(type='xpu'):\n        pass\n",
        "a list of kinds to pick from": "KINDS = ('cuda', 'mps', 'cpu')\nkinds = [k for k in KINDS if ok(k)]\n",
        "an indexed name": "if name == 'cuda:0':\n    pass\n",
    }
    for what, source in dodges.items():
        bad = tmp_path / "bad.py"
        bad.write_text(source)
        assert _violations(bad), f"the checker misses {what}: {source!r}"


def test_the_checker_leaves_alone_what_is_not_a_branch(tmp_path):
    fine = tmp_path / "fine.py"
    fine.write_text("from typing import Literal\n"
                    "DeviceKind = Literal['cpu', 'mps', 'cuda', 'xpu']\n"  # the vocabulary, as a type
                    "x = 'a cuda device'.startswith(prefix)\n"
                    "import torch\ndtype = getattr(torch, 'bfloat16')\n"
                    "y = {'fp32': 1e-4, 'bf16': 5e-2}[mode]\n"
                    "meta = (('torch', version), ('cpu', cpu_model()))\n")
    assert _violations(fine) == []
