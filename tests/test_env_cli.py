"""`alchemetric-ray env` as a user runs it, and the session's Ray harness."""

import json
import os
import subprocess
import sys

import pytest
from device_probes import cpu_only_machine

from alchemetric_ray.cli import main

CLI = [sys.executable, "-m", "alchemetric_ray.cli"]


def _run(*args, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow
def test_env_json_reports_versions_device_and_precision(monkeypatch, capsys):
    # a real process, so that the MPS fallback variable is set before torch loads; the CPU asked for
    env = {**os.environ, "PYTORCH_ENABLE_MPS_FALLBACK": "0"}
    out = _run("env", "--json", "--device", "cpu", env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    import ray
    import torch

    assert report["torch"] == torch.__version__ and report["ray"] == ray.__version__
    assert report["device"]["device"] == "cpu"
    assert report["precision"]["mode"] == "fp32" and "automatic only on CUDA" in report["precision"]["reason"]
    assert report["mps_fallback"] == {"value": "0", "set_before_torch_loaded": True}
    assert isinstance(report["cpu"]["avx512_bf16"], bool) and report["cpu"]["cores"] >= 1
    # auto-detection on a CPU-only machine (torch's probes patched, so in-process)
    cpu_only_machine(monkeypatch)
    capsys.readouterr()
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == {"device": "cpu", "reason": "no CUDA, MPS or XPU available"}
    assert report["precision"]["mode"] == "fp32" and "automatic only on CUDA" in report["precision"]["reason"]


def test_env_human_readable_and_bf16_request(monkeypatch, capsys):
    cpu_only_machine(monkeypatch)
    capsys.readouterr()
    assert main(["env", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "device            cpu (no CUDA, MPS or XPU available)" in out
    assert "precision         bf16 (bf16 autocast on CPU as requested" in out


def test_env_refused_requests_exit_nonzero_with_one_line(monkeypatch, capsys):
    cpu_only_machine(monkeypatch)
    capsys.readouterr()
    assert main(["env", "--device", "cuda"]) == 2
    assert "ERROR: the config asked for device 'cuda' but CUDA is not available (found: cpu)" in capsys.readouterr().out
    assert main(["env", "train.lr=0"]) == 2
    assert (capsys.readouterr().err.strip()
            == "alchemetric-ray env: error: config 'train.lr': 0.0 is invalid, expected > 0")
    assert main(["env", "--device", "cpu", "--precision", "bf16", "model.name=lstm"]) == 2
    assert "LSTM fails under CPU autocast" in capsys.readouterr().out


def test_ray_session_has_state_api_and_logical_cpus(ray_session):
    from ray.util.state import list_nodes

    nodes = list_nodes(address=ray_session.get_runtime_context().gcs_address)  # other Rays may run here
    assert len(nodes) == 1 and nodes[0].state == "ALIVE"
    assert ray_session.cluster_resources()["CPU"] >= 4
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.1"
