"""Every branch of the device resolver, through patched torch probes (and real CPU runs)."""

import logging

import pytest
import torch

from alchemetric_ray.errors import DeviceError
from alchemetric_ray.hardware import device as dev
from alchemetric_ray.hardware.device import device_for_worker, resolve_device, train_accelerator


@pytest.fixture
def machine(monkeypatch):
    """Patch the probes to describe a machine: machine(cuda=2, mps=False, ...)."""

    def make(cuda: int = 0, mps: bool = False, mps_built: bool | None = None, xpu: int = 0,
             capability=(9, 0), name="NVIDIA H200", ray_gpu: torch.device | None = None):
        monkeypatch.setattr(dev, "cuda_available", lambda: cuda > 0)
        monkeypatch.setattr(dev, "cuda_count", lambda: cuda)
        monkeypatch.setattr(dev, "cuda_name", lambda i: name)
        monkeypatch.setattr(dev, "cuda_capability", lambda i: capability)
        monkeypatch.setattr(dev, "mps_available", lambda: mps)
        monkeypatch.setattr(dev, "mps_built", lambda: mps if mps_built is None else mps_built)
        monkeypatch.setattr(dev, "xpu_available", lambda: xpu > 0)
        monkeypatch.setattr(dev, "xpu_count", lambda: xpu)
        monkeypatch.setattr(dev, "ray_worker_device", lambda: ray_gpu)

    monkeypatch.delenv(dev.ENV_VAR, raising=False)
    return make


def test_auto_prefers_cuda(machine):
    machine(cuda=2, mps=True)
    choice = resolve_device()
    assert choice.device == torch.device("cuda", 0)
    assert choice.reason == "NVIDIA H200, capability 9.0"
    assert str(choice) == "cuda:0 (NVIDIA H200, capability 9.0)"


def test_auto_mps_when_no_cuda(machine):
    machine(cuda=0, mps=True)
    choice = resolve_device("auto")
    assert choice.device == torch.device("mps")
    assert choice.reason == "Apple GPU; no CUDA"


def test_auto_xpu_after_mps(machine):
    machine(xpu=1)
    assert resolve_device().device == torch.device("xpu", 0)


def test_auto_cpu_when_nothing(machine):
    machine()
    choice = resolve_device()
    assert choice.device == torch.device("cpu")
    assert choice.reason == "no CUDA, MPS or XPU available"


def test_real_probes_resolve_to_what_torch_reports_here():
    # unpatched, on any host: auto picks what torch itself reports (the CPU on a CPU-only machine)
    expected = ("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available()
                else "xpu" if dev.xpu_available() else "cpu")
    assert resolve_device().device.type == expected


def test_ray_worker_takes_the_device_ray_assigned(machine):
    machine(cuda=4, ray_gpu=torch.device("cuda", 1))
    choice = device_for_worker("cuda", source="the resource plan")
    assert choice.device == torch.device("cuda", 1)
    assert "assigned by Ray Train" in choice.reason
    # the driver (not a worker) never asks Ray
    assert resolve_device().device == torch.device("cuda", 0)


def test_apple_gpu_in_ray_never_means_cuda(machine):
    # Ray advertises an Apple GPU as GPU: 1; torch's probe says there is no CUDA: MPS it is.
    machine(cuda=0, mps=True, ray_gpu=torch.device("cuda", 0))
    choice = device_for_worker(train_accelerator("auto", 1.0, 1).kind, source="the resource plan")
    assert choice.device == torch.device("mps")


def test_argument_beats_environment_beats_auto(machine, monkeypatch):
    machine(cuda=1, mps=False)
    monkeypatch.setenv(dev.ENV_VAR, "cpu")
    assert resolve_device().device == torch.device("cpu")
    assert resolve_device().reason == f"requested by {dev.ENV_VAR}"
    assert resolve_device("cuda").device == torch.device("cuda", 0)
    assert "requested by the config" in resolve_device("cuda:0").reason


def test_explicit_cuda_missing_is_an_error_naming_what_exists(machine):
    machine(cuda=0, mps=True)
    with pytest.raises(DeviceError) as err:
        resolve_device("cuda")
    assert str(err.value) == "the config asked for device 'cuda' but CUDA is not available (found: mps, cpu)"


def test_cuda_index_out_of_range(machine):
    machine(cuda=2)
    with pytest.raises(DeviceError,
                       match=r"asked for device 'cuda:3' but this machine has 2 CUDA device\(s\) \(cuda:0..cuda:1\)"):
        resolve_device("cuda:3")
    assert resolve_device("cuda:1").device == torch.device("cuda", 1)


def test_env_request_for_missing_device_names_the_variable(machine, monkeypatch):
    machine()
    monkeypatch.setenv(dev.ENV_VAR, "mps")
    with pytest.raises(DeviceError, match=rf"{dev.ENV_VAR} asked for device 'mps' but this torch build has no MPS"):
        resolve_device()


def test_mps_built_but_unavailable(machine):
    machine(mps=False, mps_built=True)
    with pytest.raises(DeviceError, match="MPS is not available on this machine"):
        resolve_device("mps")


def test_garbage_device_names(machine):
    machine()
    with pytest.raises(DeviceError, match="unknown device kind"):
        resolve_device("tpu")
    with pytest.raises(DeviceError, match="not a device name"):
        resolve_device("cuda:x")


def test_reason_logged_once_per_process(machine, caplog):
    machine(cuda=1, name="Test GPU", capability=(8, 6))
    with caplog.at_level(logging.INFO, logger="alchemetric_ray.hardware"):
        resolve_device()
        resolve_device()
    lines = [r.message for r in caplog.records if "Test GPU" in r.message]
    assert lines == ["device: cuda:0 (Test GPU, capability 8.6)"]
