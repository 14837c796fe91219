"""`alchemetric-ray env` as a user runs it, and the session's Ray harness."""

import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "alchemetric_ray.cli"]


def _run(*args, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


def test_env_json_reports_versions_device_and_precision():
    env = {**os.environ, "PYTORCH_ENABLE_MPS_FALLBACK": "0"}
    out = _run("env", "--json", env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    import ray
    import torch

    assert report["torch"] == torch.__version__ and report["ray"] == ray.__version__
    assert report["device"]["device"] == "cpu"
    assert report["device"]["reason"] == "no CUDA, MPS or XPU available"
    assert report["precision"]["mode"] == "fp32" and "automatic only on CUDA" in report["precision"]["reason"]
    assert report["mps_fallback"] == {"value": "0", "set_before_torch_loaded": True}
    assert isinstance(report["cpu"]["avx512_bf16"], bool) and report["cpu"]["cores"] >= 1


def test_env_human_readable_and_bf16_request():
    out = _run("env", "--precision", "bf16")
    assert out.returncode == 0, out.stderr
    assert "device            cpu (no CUDA, MPS or XPU available)" in out.stdout
    assert "precision         bf16 (bf16 autocast on CPU as requested" in out.stdout


def test_env_refused_requests_exit_nonzero_with_one_line():
    out = _run("env", "--device", "cuda")
    assert out.returncode == 2
    assert "ERROR: the config asked for device 'cuda' but CUDA is not available (found: cpu)" in out.stdout
    bad = _run("env", "train.lr=0")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "alchemetric-ray env: error: config 'train.lr': 0.0 is invalid, expected > 0"
    lstm = _run("env", "--precision", "bf16", "model.name=lstm")
    assert lstm.returncode == 2 and "LSTM fails under CPU autocast" in lstm.stdout


def test_ray_session_has_state_api_and_logical_cpus(ray_session):
    from ray.util.state import list_nodes

    nodes = list_nodes()
    assert len(nodes) == 1 and nodes[0].state == "ALIVE"
    assert ray_session.cluster_resources()["CPU"] >= 4
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.1"
