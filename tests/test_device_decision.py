"""One device decision: made on the driver from the request, passed to every Ray worker as a kind,
and mapped there to the worker's own device, or refused; never re-decided in the worker."""

import typing

import pytest
import torch

from alchemetric_ray.config import DeviceKind, DeviceName, load_config
from alchemetric_ray.errors import DeviceError
from alchemetric_ray.hardware import device as dev
from alchemetric_ray.hardware.device import device_for_worker, train_accelerator


@pytest.fixture
def machine(monkeypatch):
    def make(cuda: int = 0, mps: bool = False, ray_gpu: torch.device | None = None):
        monkeypatch.setattr(dev, "cuda_available", lambda: cuda > 0)
        monkeypatch.setattr(dev, "cuda_count", lambda: cuda)
        monkeypatch.setattr(dev, "cuda_name", lambda i: "NVIDIA H200")
        monkeypatch.setattr(dev, "cuda_capability", lambda i: (9, 0))
        monkeypatch.setattr(dev, "mps_available", lambda: mps)
        monkeypatch.setattr(dev, "mps_built", lambda: mps)
        monkeypatch.setattr(dev, "xpu_available", lambda: False)
        monkeypatch.setattr(dev, "xpu_count", lambda: 0)
        monkeypatch.setattr(dev, "ray_worker_device", lambda: ray_gpu)

    monkeypatch.delenv(dev.ENV_VAR, raising=False)
    return make


@pytest.mark.parametrize("requested, cuda, mps, gpus, workers", [
    ("auto", 0, False, 0, 1), ("auto", 0, False, 4, 4), ("cuda", 0, False, 4, 1), ("cuda:1", 2, False, 2, 1),
    ("auto", 0, True, 1, 1), ("auto", 0, True, 1, 2), ("cpu", 1, False, 1, 1), ("mps", 0, True, 1, 1),
])
def test_the_plan_hands_workers_a_decided_kind_never_auto(machine, requested, cuda, mps, gpus, workers):
    machine(cuda=cuda, mps=mps)
    acc = train_accelerator(requested, gpus, workers)
    assert acc.worker_device == acc.kind and acc.kind in dev.DEVICE_KINDS


def test_a_cuda_worker_without_cuda_fails_instead_of_training_on_the_cpu(machine):
    # the driver saw CUDA GPUs in the cluster; this worker's torch sees none
    machine(cuda=0)
    with pytest.raises(DeviceError) as err:
        device_for_worker("cuda", source="the resource plan")
    assert str(err.value) == "the resource plan asked for device 'cuda' but CUDA is not available (found: cpu)"
    with pytest.raises(ValueError, match="not 'auto'"):
        device_for_worker("auto", source="the resource plan")


def test_a_worker_ignores_the_environment_the_driver_already_read(machine, monkeypatch):
    machine(cuda=2, ray_gpu=torch.device("cuda", 1))
    monkeypatch.setenv(dev.ENV_VAR, "cpu")
    assert train_accelerator("auto", 2, 2).kind == "cpu"  # the driver reads ALCHEMETRIC_DEVICE once
    assert device_for_worker("cuda", source="the resource plan").device == torch.device("cuda", 1)


def test_the_driver_reads_the_request_as_the_resolver_does(machine, monkeypatch):
    machine(cuda=0)
    monkeypatch.setenv(dev.ENV_VAR, "cuda")
    with pytest.raises(DeviceError, match=f"^{dev.ENV_VAR} asked for device 'cuda' but no node of the Ray cluster"):
        train_accelerator("auto", 0, 1)
    monkeypatch.setenv(dev.ENV_VAR, "tpu")
    with pytest.raises(DeviceError, match="unknown device kind"):
        train_accelerator(None, 0, 1)


def test_device_name_is_a_validated_type():
    name = load_config(None, ["device.name=cuda:1"]).device.name
    assert isinstance(name, DeviceName) and name.index == 1 and name.kind == str(name).partition(":")[0]
    assert DeviceName(DeviceName.AUTO).kind == DeviceName.AUTO and DeviceName("mps").index is None
    for bad in ("tpu", "mps:1", "cuda:x", "cuda:"):
        with pytest.raises(ValueError):
            DeviceName(bad)
    for kind in typing.get_args(DeviceKind):
        assert DeviceName(kind).kind == kind and kind in DeviceName.expected()
