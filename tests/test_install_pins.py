"""The torch pins, in one place: constraints.txt, and every install of the project reads it.

The three installs users run: ``make install`` (the Makefile, dry-run here with ``make -n``),
k8s/Dockerfile (the KubeRay image) and cluster.yaml's setup commands (the ``ray up`` nodes).  Each
must install with ``-c constraints.txt`` and none may name a torch version of its own.

constraints.txt has one torch line per platform, told apart by environment markers: 2.13.0 on Linux,
2.14.x on Apple silicon Macs (torch 2.13.0's MPS matmul bug, pytorch/pytorch#193487), and none on Intel
Macs, which torch has no wheels for; ``make`` refuses those before installing anything.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"
PLATFORMS = {  # the platforms the project is installed on, as pip's markers see them
    "linux-x86_64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    "linux-aarch64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
    "macos-arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
}
INTEL_MAC = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "x86_64"}  # refused
UNAME = {  # `uname -s`, `uname -m` on each platform, for the Makefile's check
    "linux-x86_64": ("Linux", "x86_64"), "linux-aarch64": ("Linux", "aarch64"), "macos-arm64": ("Darwin", "arm64"),
}


def _pins() -> list[Requirement]:
    lines = [ln.split("#", 1)[0].strip() for ln in CONSTRAINTS.read_text().splitlines()]
    return [Requirement(ln) for ln in lines if ln]


def _torch_lines(markers: dict[str, str]) -> list[Requirement]:
    """The torch lines of constraints.txt that pip applies in an environment with these marker values."""
    env = {**default_environment(), **markers}
    return [r for r in _pins() if r.name == "torch" and (r.marker is None or r.marker.evaluate(env))]


def _torch_pin(platform: str) -> str:
    """The torch version constraints.txt gives ``platform``: exactly one ``==`` line must apply."""
    found = _torch_lines(PLATFORMS[platform])
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


def test_linux_keeps_2_13_0_and_apple_silicon_gets_2_14():
    assert _torch_pin("linux-x86_64") == _torch_pin("linux-aarch64") == "2.13.0"
    mac = Version(_torch_pin("macos-arm64"))
    assert mac.release[:2] == (2, 14), mac  # 2.14.0 fixed the 2-D MPS matmul (pytorch/pytorch#183535)


def test_no_torch_line_applies_to_an_intel_mac():
    assert _torch_lines(INTEL_MAC) == []  # no wheels since torch 2.2: the Makefile refuses it instead


def _make_dry(*args: str) -> subprocess.CompletedProcess[str]:
    """``make -n ARGS`` in the checkout, free of the flags of a ``make test`` this may run under."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "UNAME_S", "UNAME_M"}}
    return subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)


def test_make_refuses_an_intel_mac_with_one_line():
    dry = _make_dry("UNAME_S=Darwin", "UNAME_M=x86_64", "install")  # refused even where .venv is up to date
    assert dry.returncode != 0, dry.stdout
    assert "pip install" not in dry.stdout, dry.stdout
    (line,) = dry.stderr.strip().splitlines()
    assert "Apple silicon" in line and "x86_64" in line, line


def test_make_refuses_nothing_else_for_an_intel_mac():
    dry = _make_dry("UNAME_S=Darwin", "UNAME_M=x86_64", "clean")  # only installs are refused
    assert dry.returncode == 0, dry.stderr


def test_make_installs_on_every_supported_platform():
    for platform, (system, machine) in UNAME.items():
        dry = _make_dry("-B", f"UNAME_S={system}", f"UNAME_M={machine}", "install")
        assert dry.returncode == 0, (platform, dry.stderr)
        assert "Apple silicon" not in dry.stderr, (platform, dry.stderr)
        assert len(re.findall(r"\bpip install\b", dry.stdout)) == 2, (platform, dry.stdout)


def test_make_install_reads_the_constraints_for_every_pip_install():
    dry = _make_dry("-B", ".venv/bin/.installed")  # this machine's own uname: a Linux one
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
