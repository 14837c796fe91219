"""One torch pin, in one place: constraints.txt, and every install of the project reads it.

The three installs users run: ``make install`` (the Makefile, dry-run here with ``make -n``),
k8s/Dockerfile (the KubeRay image) and cluster.yaml's setup commands (the ``ray up`` nodes).  Each
must install with ``-c constraints.txt`` and none may name a torch version of its own.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"
PLATFORMS = {  # the platforms the project is installed on, as pip's markers see them
    "linux-x86_64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    "linux-aarch64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
    "macos-arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
}


def _pins() -> list[Requirement]:
    lines = [ln.split("#", 1)[0].strip() for ln in CONSTRAINTS.read_text().splitlines()]
    return [Requirement(ln) for ln in lines if ln]


def _torch_pin(platform: str) -> str:
    """The torch version constraints.txt gives ``platform``: exactly one ``==`` line must apply."""
    env = {**default_environment(), **PLATFORMS[platform]}
    found = [r for r in _pins() if r.name == "torch" and (r.marker is None or r.marker.evaluate(env))]
    assert len(found) == 1, f"{platform}: {len(found)} torch lines apply in constraints.txt"
    (spec,) = found[0].specifier
    assert spec.operator == "==", f"{platform}: torch is not pinned exactly ({spec})"
    return spec.version


def test_constraints_pin_one_torch_per_platform_within_the_packages_range():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_range,) = [Requirement(d) for d in dependencies if Requirement(d).name == "torch"]
    assert not any(s.operator == "==" for s in torch_range.specifier)  # the version lives in constraints.txt
    for platform in PLATFORMS:
        assert torch_range.specifier.contains(_torch_pin(platform)), platform


def test_make_install_reads_the_constraints_for_every_pip_install():
    dry = subprocess.run(["make", "-n", "-B", ".venv/bin/.installed"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0, dry.stderr
    pips = [shlex.split(ln) for ln in dry.stdout.splitlines() if re.search(r"\bpip install\b", ln)]
    assert len(pips) == 2 and pips[0][-1] == "torch" and pips[1][-1] == ".[dev]", pips  # torch first, then us
    for argv in pips:
        assert argv[argv.index("-c") + 1] == "constraints.txt", argv


def test_the_docker_image_installs_torch_and_the_project_under_the_constraints():
    text = (REPO / "k8s" / "Dockerfile").read_text().replace("\\\n", " ")
    steps = [ln.strip() for ln in text.splitlines() if re.match(r"\s*(COPY|RUN)\b", ln)]
    copied = next(i for i, s in enumerate(steps) if s.startswith("COPY") and "constraints.txt" in s.split())
    pips = [(i, cmd.strip()) for i, s in enumerate(steps) if s.startswith("RUN")
            for cmd in s[3:].split("&&") if "pip install" in cmd]
    assert [cmd.split()[-1] for _, cmd in pips] == ["torch", "."], pips
    for i, cmd in pips:
        assert i > copied and "-c constraints.txt" in cmd, cmd
    assert "constraints.txt" not in (REPO / ".dockerignore").read_text().split()


def test_the_cluster_nodes_install_under_the_constraints():
    cfg = yaml.safe_load((REPO / "cluster.yaml").read_text())
    (mount,) = [path for path, local in cfg["file_mounts"].items() if local == "."]  # the checkout, on every node
    pips = [shlex.split(c) for c in cfg["setup_commands"] if "pip install" in c]
    assert pips
    for argv in pips:
        assert argv[argv.index("-c") + 1] == f"{mount}/constraints.txt", argv


def test_no_install_names_a_torch_version_of_its_own():
    for name in ("Makefile", "k8s/Dockerfile", "cluster.yaml", "k8s/rayjob.yaml", "pyproject.toml", ".ci/run"):
        assert not re.search(r"torch\s*==", (REPO / name).read_text()), name
