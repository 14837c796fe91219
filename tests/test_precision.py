"""The precision policy (patched probes) and the optimizer step (real CPU training)."""

import pytest
import torch
from torch import nn

from alchemetric_ray.errors import NonFiniteLossError, PrecisionError, TooManySkippedSteps
from alchemetric_ray.hardware import device as dev
from alchemetric_ray.hardware import inventory
from alchemetric_ray.hardware import precision as prec
from alchemetric_ray.hardware.optimizer import OptimizerStep
from alchemetric_ray.hardware.precision import Precision, resolve_precision
from alchemetric_ray.models import model_spec

CUDA0 = torch.device("cuda", 0)
MPS = torch.device("mps")
CPU = torch.device("cpu")


@pytest.fixture
def gpu(monkeypatch):
    def make(capability=(9, 0), bf16=True):
        monkeypatch.setattr(dev, "cuda_capability", lambda i: capability)
        monkeypatch.setattr(prec, "cuda_bf16_native", lambda: bf16)

    return make


def test_auto_on_ampere_or_newer_is_bf16_without_scaler(gpu):
    gpu((8, 0), bf16=True)
    p = resolve_precision("auto", CUDA0)
    assert (p.mode, p.autocast_dtype, p.use_scaler) == ("bf16", torch.bfloat16, False)
    assert "native bf16 on capability 8.0" in p.reason


def test_auto_on_volta_is_fp16_with_scaler(gpu):
    gpu((7, 0), bf16=False)
    p = resolve_precision("auto", CUDA0)
    assert (p.mode, p.autocast_dtype, p.use_scaler) == ("fp16", torch.float16, True)
    assert p.reason == "fp16 autocast with GradScaler (auto: capability 7.0 has no native bf16)"


def test_cuda_fp32_reports_tf32(gpu):
    gpu()
    on = resolve_precision("fp32", CUDA0, tf32=True)
    off = resolve_precision("fp32", CUDA0, tf32=False)
    assert on.autocast_dtype is None and not on.use_scaler
    assert "TF32 matmuls on" in on.reason and on.tf32
    assert "TF32 matmuls off" in off.reason and not off.tf32


def test_tf32_setting_reaches_matmuls_and_cudnn_through_one_api(gpu):
    """precision.tf32 decides matmuls AND cuDNN convolutions/RNNs (a TCN is convolutions): torch's
    cuDNN default is TF32 on, so 'off' must be set, not assumed; and through one API only (torch
    refuses to read flags that were set through both)."""
    gpu()
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn, torch.backends.cudnn.conv, torch.backends.cudnn.rnn)
    saved = [f.fp32_precision for f in flags]
    try:
        for tf32, want in ((False, "ieee"), (True, "tf32"), (False, "ieee")):
            resolve_precision("fp32", CUDA0, tf32=tf32).apply_tf32_settings()
            assert [f.fp32_precision for f in flags] == [want] * 4
        resolve_precision("fp32", torch.device("cpu")).apply_tf32_settings()  # a CPU run leaves CUDA's alone
        assert [f.fp32_precision for f in flags] == ["ieee"] * 4
    finally:
        for f, value in zip(flags, saved):
            f.fp32_precision = value


def test_cuda_bf16_refused_without_native_support(gpu):
    gpu((7, 5), bf16=False)
    with pytest.raises(PrecisionError, match=r"'bf16' requested but this GPU \(capability 7.5\) has no native bf16"):
        resolve_precision("bf16", CUDA0)


def test_cuda_fp16_explicit(gpu):
    gpu((9, 0), bf16=True)
    p = resolve_precision("fp16", CUDA0)
    assert p.use_scaler and p.autocast_dtype == torch.float16 and "requested" in p.reason


@pytest.mark.parametrize("device", [MPS, CPU])
def test_auto_off_cuda_is_float32(device):
    p = resolve_precision("auto", device)
    assert (p.mode, p.autocast_dtype, p.use_scaler) == ("fp32", None, False)
    assert "automatic only on CUDA" in p.reason


def test_mps_bf16_needs_new_torch_and_macos(monkeypatch):
    monkeypatch.setattr(inventory, "torch_version", lambda: (2, 8))
    monkeypatch.setattr(inventory, "macos_version", lambda: (14, 5))
    p = resolve_precision("bf16", MPS)
    assert (p.mode, p.autocast_dtype, p.use_scaler) == ("bf16", torch.bfloat16, False)
    monkeypatch.setattr(inventory, "torch_version", lambda: (2, 5))
    with pytest.raises(PrecisionError, match=r"needs torch >= 2.6 \(installed 2.5\)"):
        resolve_precision("bf16", MPS)
    monkeypatch.setattr(inventory, "torch_version", lambda: (2, 8))
    monkeypatch.setattr(inventory, "macos_version", lambda: (13, 6))
    with pytest.raises(PrecisionError, match=r"needs macOS 14 or newer \(found 13.6\)"):
        resolve_precision("bf16", MPS)


def test_mps_fp16_refused_for_gradscaler_bugs():
    with pytest.raises(PrecisionError, match=r"'fp16' on MPS is refused.*pytorch/pytorch#184286"):
        resolve_precision("fp16", MPS)


def test_cpu_bf16_allowed_with_warning_unless_recurrent(monkeypatch):
    monkeypatch.setattr(inventory, "cpu_has_bf16", lambda: False)
    p = resolve_precision("bf16", CPU, model=model_spec("mlp"))
    assert p.autocast_dtype == torch.bfloat16 and not p.use_scaler
    assert "often slower than float32" in p.reason
    monkeypatch.setattr(inventory, "cpu_has_bf16", lambda: True)
    assert "has bf16 instructions" in resolve_precision("bf16", CPU, model=model_spec("mlp")).reason
    with pytest.raises(PrecisionError, match="model 'lstm': LSTM fails under CPU autocast"):
        resolve_precision("bf16", CPU, model=model_spec("lstm"))
    with pytest.raises(PrecisionError, match="model 'gru': GRU silently stays float32"):
        resolve_precision("bf16", CPU, model=model_spec("gru"))


def test_cpu_fp16_refused():
    with pytest.raises(PrecisionError, match="'fp16' on CPU is refused"):
        resolve_precision("fp16", CPU)


def test_unknown_mode():
    with pytest.raises(PrecisionError, match="'fp8' is not one of"):
        resolve_precision("fp8", CPU)


# ---- the optimizer step, for real on the CPU ---------------------------------------------------


def _problem(seed=0):
    torch.manual_seed(seed)
    x = torch.randn(512, 16)
    y = (x[:, :4].sum(dim=1) > 0).long()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    return model, x, y


def _train(precision: Precision, steps=60, scaler=None):
    model, x, y = _problem()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stepper = OptimizerStep(opt, precision, grad_clip=1.0, scaler=scaler)
    losses = []
    for step in range(steps):
        with precision.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        losses.append(float(loss.detach()))
        out = stepper(loss, epoch=0, step=step)
        assert not out.skipped and out.grad_norm > 0
    return losses


def test_fp32_step_reduces_loss():
    losses = _train(resolve_precision("fp32", CPU))
    assert losses[-1] < 0.5 * losses[0]


def test_cpu_bf16_autocast_step_reduces_loss():
    p = resolve_precision("bf16", CPU, model=model_spec("mlp"))
    losses = _train(p)
    assert losses[-1] < 0.5 * losses[0]


def test_injected_inf_skips_step_counts_it_and_halves_scale():
    # The CUDA fp16 ordering (scale -> backward -> unscale -> clip -> step -> update), run on
    # the CPU with a real GradScaler("cpu") and CPU fp16 autocast.
    p = Precision("fp16", "cpu", torch.float16, True, False, "test: CPU fp16 with GradScaler")
    model, x, y = _problem()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stepper = OptimizerStep(opt, p, scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    with p.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    assert not stepper(loss, epoch=0, step=0).skipped
    scale = stepper.scaler.get_scale()
    before = [t.detach().clone() for t in model.parameters()]
    with p.autocast():
        loss = nn.functional.cross_entropy(model(x), y) * float("inf")
    out = stepper(loss, epoch=0, step=1)
    assert out.skipped
    assert stepper.skipped_total == 1 and stepper.skipped_in_row == 1
    assert stepper.scaler.get_scale() == scale / 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # weights untouched
    with p.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    assert not stepper(loss, epoch=0, step=2).skipped
    assert stepper.skipped_in_row == 0 and stepper.skipped_total == 1


def test_fp16_gradients_are_unscaled_before_the_clip_norm_is_measured():
    """Clipping must see the true gradients: with a GradScaler at scale 1024, clipping before
    ``unscale_`` measures a norm 1024x too large and then shrinks the real step 1024x too much."""
    p = Precision("fp16", "cpu", torch.float16, True, False, "test: CPU fp16 with GradScaler")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # what make_scaler builds, with a known scale
    assert p.make_scaler().is_enabled() and scaler.is_enabled()
    layer = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(layer.weight)
    x = torch.tensor([[3.0, 4.0]])  # d(sum(w . x))/dw = x: the unscaled gradient norm is exactly 5
    stepper = OptimizerStep(torch.optim.SGD(layer.parameters(), lr=1.0), p, grad_clip=1.0, scaler=scaler)
    with p.autocast():
        loss = layer(x).sum()
    assert loss.dtype == torch.float16  # fp16 autocast really ran
    out = stepper(loss, epoch=0, step=0)
    assert not out.skipped and scaler.get_scale() == 1024.0
    assert out.grad_norm == pytest.approx(5.0, rel=1e-6)  # the norm of the unscaled gradients
    # SGD at lr 1 moves the weights by minus the clipped gradient: x / |x| * grad_clip
    torch.testing.assert_close(layer.weight.detach(), -torch.tensor([[0.6, 0.8]]), rtol=1e-6, atol=1e-7)


def test_run_that_keeps_skipping_stops():
    p = Precision("fp16", "cpu", torch.float16, True, False, "test")
    model, x, y = _problem()
    stepper = OptimizerStep(torch.optim.SGD(model.parameters(), lr=0.1), p, max_skipped_steps=3,
                            scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(TooManySkippedSteps, match=r"3 optimizer steps in a row skipped .* epoch 2 step 2"):
        for step in range(10):
            loss = nn.functional.cross_entropy(model(x), y) * float("nan")
            stepper(loss, epoch=2, step=step)


def test_nonfinite_loss_without_scaler_names_epoch_and_step():
    p = resolve_precision("fp32", CPU)
    model, x, y = _problem()
    stepper = OptimizerStep(torch.optim.SGD(model.parameters(), lr=0.1), p)
    loss = nn.functional.cross_entropy(model(x), y) * float("nan")
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\) at epoch 3 step 17 under fp32"):
        stepper(loss, epoch=3, step=17)
