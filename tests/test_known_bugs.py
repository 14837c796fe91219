"""The known-bug table (``hardware/known_bugs.yaml``), its rules evaluated on a meta-device trace of
the run's own step, the micro-batch workaround, and ``env``'s list of what applies here.

The backends are given as data (``Backend("mps", torch version, GPU family)``): an M1 on torch
2.13.0 is a fact the rules are evaluated against, not a device this CPU pretends to have.  The
workaround's loop path runs for real on the CPU, through ``train.micro_batch_rows``.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from device_probes import cpu_only_machine, no_cuda

from alchemetric_ray.cli import main
from alchemetric_ray.config import load_config
from alchemetric_ray.data.shards import build_shards
from alchemetric_ray.errors import KnownBugError, PrecisionError
from alchemetric_ray.hardware import known_bugs as kb
from alchemetric_ray.hardware import resolve_precision
from alchemetric_ray.models import build_model
from alchemetric_ray.training.backend_check import check_backend, forward, trace_run
from alchemetric_ray.training.losses import DateGroups, make_loss
from alchemetric_ray.training.trainer import run_training

M1_213 = kb.Backend("mps", (2, 13, 0), "Apple7", "Apple M1 Pro")
M1_214 = kb.Backend("mps", (2, 14, 1), "Apple7", "Apple M1 Pro")
M3_213 = kb.Backend("mps", (2, 13, 0), "Apple9", "Apple M3")
CPU = torch.device("cpu")
FP32 = resolve_precision("fp32", CPU)


def _cfg(*overrides):
    return load_config(None, list(overrides))


def test_every_entry_has_a_source_versions_a_rule_and_a_remedy(monkeypatch):
    cpu_only_machine(monkeypatch)  # the backends here are data, whatever this host has
    entries = kb.entries()
    assert len({e.id for e in entries}) == len(entries) >= 10
    for e in entries:
        assert re.fullmatch(r"https://github\.com/pytorch/pytorch/(issues|pull)/\d+", e.source), e.id
        assert e.backend in ("mps", "cuda", "cpu") and e.symptom and e.reproducer and e.remedy
        assert e.kind in kb.TRIGGER_KINDS
        assert kb._version(e.affected_from) and (e.fixed_in is None or kb._version(e.fixed_in) > kb._version(
            e.affected_from))
    large_k = kb.entry("mps-matmul-large-k-2d")
    assert large_k.fixed_in == "2.14.0" and large_k.devices == ("Apple7", "Apple8")
    assert kb.entry("mps-matmul-k32767-2d").fixed_in is None and kb.entry("mps-matmul-large-k-batched").fixed_in is None
    assert large_k.applies(M1_213) and not large_k.applies(M1_214) and not large_k.applies(M3_213)
    assert large_k.applies(kb.Backend("mps", (2, 13, 0), None)) is None  # an unknown chip is not assumed safe


def test_apple_chip_names_map_to_gpu_families():
    assert [kb.apple_gpu_family(c) for c in ("Apple M1", "Apple M2 Max", "Apple M3 Pro", "Apple M4", "Intel(R) Xeon")] \
        == ["Apple7", "Apple8", "Apple9", "Apple9", None]


def test_the_trace_is_the_runs_own_step_on_the_meta_device():
    # a transformer over (batch, window 20, features): its weight gradients multiply batch x window rows
    trace = trace_run(_cfg("model.name=transformer"), 12, 3, rows=2000)
    assert max(c.k for c in trace.matmuls) == 2000 * 20
    assert any(c.op == "bmm" for c in trace.matmuls) and trace.dtypes >= {"float32", "int64"}
    # a step of ten million rows is traced in no memory: nothing is computed
    big = trace_run(_cfg("model.name=mlp"), 12, 3, rows=10_000_000)
    assert max(c.k for c in big.matmuls) == 10_000_000
    ic = trace_run(_cfg("features.label=cs_rank", "train.loss=ic"), 12, 1, rows=512)
    assert max(c.k for c in ic.matmuls) == 512
    lstm = trace_run(_cfg("model.name=lstm"), 12, 3, rows=64)
    assert lstm.opaque == ["rnn (LSTM)"]


def test_an_m1_on_torch_2_13_works_around_the_large_k_matmul_with_exact_micro_batches(monkeypatch):
    cpu_only_machine(monkeypatch)  # the backends here are data, whatever this host has
    cfg = _cfg("model.name=transformer", "train.batch_size=2000")
    check = check_backend(cfg, 12, 3, CPU, FP32, backend=M1_213)
    assert check.micro_rows == 32766 // 20 == 1638
    assert [m.entry.id for m in check.findings.matched] == ["mps-matmul-large-k-2d"]
    line = check.lines[0]
    assert line.startswith("known backend bug mps-matmul-large-k-2d (pytorch/pytorch#193487) on mps (Apple M1 Pro, "
                           "Apple7), torch 2.13.0: the step at 2,000 rows runs mm")
    assert "K = 40,000" in line and "working around it: micro-batches of 1,638 rows" in line
    # torch 2.14 routes these 2-D matmuls to Metal: nothing to work around at this shape; an M3 is not affected
    assert check_backend(cfg, 12, 3, CPU, FP32, backend=M1_214).micro_rows == 0
    assert check_backend(cfg, 12, 3, CPU, FP32, backend=M3_213).findings.matched == []
    # ...but K = 32767..32768 stays affected on 2.14 (an MLP whose batch is exactly 32,768 rows)
    edge = check_backend(_cfg("train.batch_size=32768"), 12, 3, CPU, FP32, backend=M1_214)
    assert [m.entry.id for m in edge.findings.matched] == ["mps-matmul-k32767-2d"] and edge.micro_rows == 32766


def test_runs_the_table_refuses_say_so_in_one_line(monkeypatch):
    cpu_only_machine(monkeypatch)  # the backends here are data, whatever this host has
    with pytest.raises(KnownBugError) as caught:  # MPS's LSTM kernel: dropout between layers
        check_backend(_cfg("model.name=lstm"), 12, 3, CPU, FP32, backend=M1_213)
    assert str(caught.value) == (
        "known backend bug mps-lstm-multilayer-dropout-backward (pytorch/pytorch#190056) on mps (Apple M1 Pro, "
        "Apple7), torch 2.13.0: the model's rnn is a LSTM (2 layers, dropout 0.1); set model.dropout=0 or "
        "model.layers=1 for the LSTM on MPS, or train on the CPU (--device cpu)")
    # one LSTM layer: nothing refuses, but the trace cannot see MPS's own RNN kernels: unknown, probe
    single = check_backend(_cfg("model.name=lstm", "model.layers=1"), 12, 3, CPU, FP32, backend=M1_213)
    assert single.findings.matched == [] and {u.entry.id for u in single.findings.unknown} >= {"mps-matmul-large-k-2d"}
    assert "unknown: probe" in single.lines[0]
    with pytest.raises(KnownBugError, match="the workaround \\(micro-batches\\) needs one worker"):
        check_backend(_cfg("model.name=transformer", "train.batch_size=2000"), 12, 3, CPU, FP32, world=2,
                      backend=M1_213)
    unknown_chip = check_backend(_cfg("model.name=transformer", "train.batch_size=2000"), 12, 3, CPU, FP32,
                                 backend=kb.Backend("mps", (2, 13, 0), None))
    assert unknown_chip.micro_rows == 1638 and unknown_chip.findings.matched[0].family_unknown
    # float64 inside a model on MPS
    found = kb.evaluate(kb.Trace(8, dtypes={"float32", "float64"}), M3_213)
    assert [m.entry.id for m in found.matched] == ["mps-no-float64"]
    # the two GradScaler-era bugs, moved out of precision.py: fp16 on MPS is refused by the table's entry
    assert [m.entry.id for m in kb.evaluate(None, M3_213, kb.RunTraits(grad_scaler=True, fused_optimizer=True)).matched
            ] == ["mps-gradscaler-unscale-low-precision-grads", "mps-fused-adam-ignores-found-inf"]
    from alchemetric_ray.hardware.precision import _mps

    with pytest.raises(PrecisionError, match="mps-gradscaler-unscale-low-precision-grads"):
        _mps("fp16")


@pytest.mark.parametrize("name, loss", [("mlp", "ce"), ("transformer", "ce"), ("mlp", "ic")])
def test_micro_batches_give_the_whole_batchs_gradient(name, loss):
    torch.manual_seed(0)
    outputs = 1 if loss == "ic" else 3
    model = build_model(_cfg(f"model.name={name}", "model.hidden=16", "model.heads=2").model, 6, outputs, window=5)
    model.eval()  # no dropout: one function on both sides
    rows = 96
    x = torch.randn((rows, 5, 6) if name == "transformer" else (rows, 6))
    y = torch.randn(rows) if loss == "ic" else torch.randint(0, 3, (rows,))
    dates = DateGroups.from_sizes([24, 24, 24, 24]) if loss == "ic" else None
    loss_fn = make_loss(loss)
    whole = torch.autograd.grad(loss_fn(model(x), y, dates), list(model.parameters()))
    parts = torch.autograd.grad(loss_fn(forward(model, x, 40), y, dates), list(model.parameters()))  # 40+40+16
    for a, b in zip(whole, parts):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_run_in_micro_batches_trains_as_one_in_whole_batches(ray_session, stocknet_dir, tmp_path):
    shards = build_shards(_cfg(f"data.path={stocknet_dir}", "data.source=files", "data.tickers=AAPL,MSFT"),
                          tmp_path / "shards").out
    args = [f"data.path={shards}", f"storage.path={tmp_path / 'results'}", "device.name=cpu", "model.hidden=16",
            "model.dropout=0", "train.epochs=2", "train.batch_size=128", "train.deterministic=true"]
    whole = run_training(_cfg(*args, "storage.name=whole"), export=False, progress=False)
    micro = run_training(_cfg(*args, "storage.name=micro", "train.micro_batch_rows=48"), export=False,
                         progress=False)
    assert micro.summary.known_bugs["micro_batch_rows"] == 48
    for a, b in zip(whole.summary.history, micro.summary.history):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["val_log_loss"] == pytest.approx(a["val_log_loss"], rel=1e-4)


def test_env_lists_the_entries_that_apply_here(monkeypatch, capsys):
    no_cuda(monkeypatch)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert main(["env", "--json"]) == 0
    bugs = json.loads(capsys.readouterr().out)["known_bugs"]
    assert bugs["apply"] == [] and bugs["entries"] == len(kb.entries())  # a CPU: none of them
    # an M1 Mac with this torch: the MPS entries, each with how it is checked
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(kb.inventory, "cpu_model", lambda: "Apple M1")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^known bug\s+(\S+) \(", out, re.M)
    here = kb.Backend("mps", kb._version(torch.__version__), "Apple7")
    assert listed == [e.id for e in kb.entries() if e.applies(here)]
    assert re.search(r"^known bug\s+mps-sdpa-causal-half-precision .*listed only: no rule to evaluate$", out, re.M)
    assert re.search(r"^known bug\s+mps-lstm-multilayer-dropout-backward .*checked on every run by rule \(refused\)$",
                     out, re.M)
