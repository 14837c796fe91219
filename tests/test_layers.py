"""Architecture rules, checked on the source: no import cycle inside the package, and every import
points down the layers (or stays in its own layer).

Every import statement counts, wherever it stands: at the top of a module, inside a function (the
lazy imports that keep Ray and torch off the CLI's start-up path), under ``if TYPE_CHECKING``, and
``importlib.import_module("alchemetric_ray....")`` with a literal name.  A cycle hidden in two
function bodies is still a cycle: whichever module loads second sees the other half-initialised.
"""

from __future__ import annotations

import ast
from pathlib import Path

from source_scan import dotted

PACKAGE = Path(__file__).resolve().parents[1] / "alchemetric_ray"
ROOT = PACKAGE.name

# The layers, lowest first.  A module may import modules of its own layer or of a lower one, never
# of a higher one.  Names are the package's top-level modules and sub-packages.
LAYERS: tuple[tuple[str, ...], ...] = (
    # plain helpers: no Ray, no torch models, no devices
    ("startup", "errors", "config", "config_reference", "fsutil", "storage", "outputs", "console", "interrupts"),
    ("hardware",),  # the only package that knows device kinds
    # where a run goes (session, capacity, plan, scale-up): below data, whose feature build joins or
    # starts the run's Ray through the session (placement imports nothing above hardware)
    ("placement",),
    ("bars",),  # market data in: files, the packaged prices, the sample and synthetic markets
    ("data",),  # bars -> features -> shards -> Ray Data
    ("models",),  # nn.Modules chosen by name
    ("scoring",),  # metrics and baselines
    ("artifacts",),  # what a run leaves: checkpoints, the run folder, the exported model, its ledgers
    ("tracking",),  # where a run is logged: MLflow and its registry, TensorBoard
    ("training",),  # the run itself: the TorchTrainer, the per-worker loop, its runtime, losses and checks
    ("sweeps", "signals", "checks"),  # what is built on training: sweeps, predictions, backend checks
    ("refits",),  # the nightly refit: an append, a challenger's training or sweep, its scores, the gate, a promotion
    ("api",),  # the public calls: one per command, typed results, the process guard
    ("cli",),  # the commands
    (ROOT,),  # the package's own __init__: the public surface, above everything it exports
    ("api_reference",),  # docs/python.md, generated from the public surface
)

def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(importer: str, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of the package, line) for every import statement of ``importer``, nested ones included.

    ``from pkg import name`` imports the module ``pkg.name`` where there is one, else ``pkg``."""
    path = modules[importer]
    root = importer.split(".")[0]
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []

    def add(target: str, line: int) -> None:
        if target == root or target.startswith(root + "."):
            while target not in modules and "." in target:  # `import pkg.mod.attr` style: the module part
                target = target.rsplit(".", 1)[0]
            found.append((target, line))

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, importer, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base, node.lineno)
        elif isinstance(node, ast.Call) and dotted(node.func).split(".")[-1] in ("import_module", "__import__"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                add(node.args[0].value, node.lineno)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module of this package: first line that imports it}."""
    modules = package_modules(package)
    graph: dict[str, dict[str, int]] = {}
    for name in modules:
        edges: dict[str, int] = {}
        for target, line in imports_of(name, modules):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]] | dict[str, set[str]], *, prune: bool = True) -> list[list[str]]:
    """Every elementary cycle, each once, as [a, b, ..., a] starting at its smallest name.

    From each start, the paths only go through the nodes (named after it) from which the start can be
    reached again through such nodes: every node of a cycle can, and in an acyclic graph none can, so the
    search costs nothing there (enumerating every path from every start, ``prune=False``, took 25 s on this
    package)."""
    preds: dict[str, set[str]] = {}
    for node, targets in graph.items():
        for target in targets:
            preds.setdefault(target, set()).add(node)
    found = []
    for start in sorted(graph):
        back, todo = {start}, [start]
        while todo and prune:
            for before in preds.get(todo.pop(), ()):
                if before > start and before not in back:
                    back.add(before)
                    todo.append(before)
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.append([*path, start])
                elif nxt > start and (nxt in back or not prune) and nxt not in path:  # from its smallest member
                    stack.append((nxt, [*path, nxt]))
    return sorted(found)


def unit(module: str) -> str:
    """The layer unit of a module: its top-level module or sub-package (``train``, ``fsutil``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(module: str) -> int | None:
    name = unit(module)
    return next((k for k, names in enumerate(LAYERS) if name in names), None)


def upward_imports(graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> list[str]:
    found = []
    for importer, edges in graph.items():
        for target, line in edges.items():
            if layer_of(target) > layer_of(importer):
                where = modules[importer].relative_to(PACKAGE.parent)
                found.append(f"{where}:{line} imports {target} (layer {unit(target)!r} is above {unit(importer)!r})")
    return sorted(found)


# ---- the rules --------------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    unplaced = sorted({unit(m) for m in package_modules() if layer_of(m) is None})
    assert unplaced == [], "add these to LAYERS in tests/test_layers.py"


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_packages():
    """Coarser than modules: signals/ and checks/ share a layer, but only one may lean on the other."""
    coarse: dict[str, set[str]] = {}
    for importer, edges in import_graph().items():
        coarse.setdefault(unit(importer), set()).update(unit(t) for t in edges if unit(t) != unit(importer))
    assert cycles(coarse) == []


def test_imports_point_down_the_layers():
    """No exemption: every module of the package, every import."""
    assert upward_imports(import_graph(), package_modules()) == []


# ---- the checker itself -------------------------------------------------------------------------------


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / ROOT
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_pruned_cycle_search_finds_every_cycle_the_full_one_does():
    """``cycles`` skips the nodes that cannot lead back to the start; on random graphs with many cycles it
    gives what following every path from every start gives."""
    import random

    rng = random.Random(5)
    seen = 0
    for _ in range(200):
        names = [f"m{k}" for k in range(rng.randint(2, 9))]
        graph = {a: {b for b in names if b != a and rng.random() < 0.3} for a in names}
        every = cycles(graph, prune=False)
        assert cycles(graph) == every, graph
        seen += len(every)
    assert seen > 200  # the graphs had cycles to find


def test_the_checker_sees_imports_inside_functions(tmp_path):
    package = _fake_package(tmp_path, {
        "signals/__init__.py": "",
        "signals/predict.py": "def f():\n    from alchemetric_ray.checks.certificate import key\n",
        "checks/__init__.py": "",
        "checks/certificate.py": "def g():\n    if True:\n        from alchemetric_ray.signals import predict\n",
        "training/__init__.py": "",
        "training/a.py": "import alchemetric_ray.training.b as b\n",
        "training/b.py": "import importlib\nX = importlib.import_module('alchemetric_ray.training.a')\n",
        "data/__init__.py": "",
        "data/c.py": "from .. import fsutil\nfrom . import d\n",
        "data/d.py": "",
        "fsutil.py": "def h():\n    from alchemetric_ray.data.c import x\n",
    })
    graph = import_graph(package)
    assert graph[f"{ROOT}.data.c"] == {f"{ROOT}.fsutil": 1, f"{ROOT}.data.d": 2}
    assert cycles(graph) == [
        [f"{ROOT}.checks.certificate", f"{ROOT}.signals.predict", f"{ROOT}.checks.certificate"],
        [f"{ROOT}.data.c", f"{ROOT}.fsutil", f"{ROOT}.data.c"],
        [f"{ROOT}.training.a", f"{ROOT}.training.b", f"{ROOT}.training.a"],
    ]
    assert layer_of(f"{ROOT}.fsutil") < layer_of(f"{ROOT}.data.c") < layer_of(f"{ROOT}.training.a")


def test_the_per_worker_loop_reads_in_one_screen():
    """``run_loop`` stays at most 60 lines: what grows (checks, logging, interrupts) goes into the
    objects that own it, not into the loop."""
    import ast

    source = (Path(__file__).resolve().parents[1] / "alchemetric_ray" / "training" / "loop.py").read_text()
    loop = next(node for node in ast.parse(source).body if getattr(node, "name", None) == "run_loop")
    assert loop.end_lineno - loop.lineno + 1 <= 60
