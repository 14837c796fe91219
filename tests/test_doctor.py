"""The backend doctor: real checks on the CPU (asked for explicitly), and the decision logic on patched findings."""

import copy
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from device_probes import no_cuda

from alchemetric_ray.checks.run import run_doctor
from alchemetric_ray.checks.verdict import decide
from alchemetric_ray.cli import main
from alchemetric_ray.config import load_config


@pytest.fixture(scope="module")
def mlp_report():
    return run_doctor(load_config(), device="cpu", quick=True)


def _target(report, device_type, mode):
    return next(t for t in report.targets if t.device_type == device_type and t.mode == mode)


@pytest.mark.slow
def test_every_check_runs_for_cpu_fp32_and_bf16(mlp_report):
    for mode in ("fp32", "bf16"):
        t = _target(mlp_report, "cpu", mode)
        assert t.checks.op_coverage["n_ops"] > 10 and t.checks.op_coverage["unsupported"] == {}
        assert "addmm" in t.checks.op_coverage["ops"]
        assert t.checks.op_coverage["fallback_env"] == "PYTORCH_ENABLE_MPS_FALLBACK=0"
        assert t.checks.parity["passed"] and t.checks.amp["passed"]
        # the run's shapes (the default config: 16 features, 3 classes, batch 512), not a toy's
        assert t.checks.op_coverage["rows"] == t.checks.parity["batch"] == 512
        assert [r["batch"] for r in t.checks.speed["ladder"]] == [128, 512]  # quick: a quarter of the batch, the batch
        assert all(r["samples_per_s"] > 0 and r["peak_memory_bytes"] > 0 for r in t.checks.speed["ladder"])
        # no entry of the known-bug table is about the CPU: nothing matched, nothing to probe
        bugs = t.checks.known_bugs
        assert bugs["matched"] == [] and bugs["probes"] == [] and bugs["passed"]
    run = mlp_report.as_dict()["run"]
    assert run == {"model": run["model"], "n_features": 16, "outputs": 3, "window": 20,
                   "loss": "ce", "batch": 512, "describe": "mlp: 16 features -> 3 output(s), ce loss, "
                                                           "512 rows a step"}
    # at each rung of the ladder the bf16 step's numbers are compared with CPU float32's (fp32 is the reference)
    assert [r["numbers"] for r in _target(mlp_report, "cpu", "fp32").checks.speed["ladder"]] == [None, None]
    for rung in _target(mlp_report, "cpu", "bf16").checks.speed["ladder"]:
        assert rung["numbers"]["passed"] and 0 < rung["numbers"]["logits_max_rel"] <= rung["numbers"]["tolerance_rel"]
    # parity CPU fp32 vs CPU bf16: a real, small difference inside the bf16 tolerance
    bf16 = _target(mlp_report, "cpu", "bf16").checks.parity
    assert 0 < bf16["logits_max_rel"] <= bf16["tolerance_rel"]
    assert _target(mlp_report, "cpu", "fp32").checks.parity["logits_max_rel"] == 0.0
    assert _target(mlp_report, "cpu", "bf16").checks.amp["skipped_steps"] == 0
    assert _target(mlp_report, "cpu", "fp16").refused is not None
    rec = mlp_report.verdict.recommended
    assert rec.device == "cpu" and rec.precision in ("fp32", "bf16") and mlp_report.verdict.exit_code == 0
    json.dumps(mlp_report.as_dict())  # one JSON object


@pytest.mark.slow
def test_lstm_under_cpu_autocast_is_a_blocker_and_fp32_is_recommended():
    report = run_doctor(load_config(None, ["model.name=lstm", "model.hidden=16"]), device="cpu", quick=True)
    bf16 = _target(report, "cpu", "bf16")
    assert any("LSTM fails under CPU autocast" in b for b in bf16.blockers)
    assert report.verdict.recommended.as_dict() == {"device": "cpu", "precision": "fp32"}


# ---- decision logic on patched findings ----------------------------------------------------------


def _found(mlp_report):
    cpu = copy.deepcopy(_target(mlp_report, "cpu", "fp32"))
    gpu = dataclasses.replace(copy.deepcopy(cpu), device="mps", device_type="mps", mode="fp32")
    gpu.checks.speed["best_samples_per_s"] = cpu.checks.speed["best_samples_per_s"] * 3
    for t in (cpu, gpu):
        t.blockers, t.passed = [], None
    return cpu, gpu


@pytest.mark.slow
def test_decision_fastest_passing_target_wins(mlp_report):
    cpu, gpu = _found(mlp_report)
    verdict = decide([cpu, gpu])
    assert verdict.recommended.as_dict() == {"device": "mps", "precision": "fp32"} and verdict.exit_code == 0
    assert any("3.00x CPU float32" in r for r in verdict.reasons)


@pytest.mark.slow
def test_decision_unsupported_operator_blocks(mlp_report):
    cpu, gpu = _found(mlp_report)
    gpu.checks.op_coverage["unsupported"] = {"aten::_linalg_eigh": "not implemented for 'MPS'"}
    decide([cpu, gpu])
    assert gpu.blockers == ["operators without a mps kernel (would fall back to the CPU): aten::_linalg_eigh"]
    assert decide([cpu, gpu]).recommended.as_dict() == {"device": "cpu", "precision": "fp32"}


@pytest.mark.slow
def test_decision_parity_failure_blocks(mlp_report):
    cpu, gpu = _found(mlp_report)
    gpu.checks.parity.update(passed=False, logits_max_rel=0.3)
    decide([cpu, gpu])
    assert gpu.blockers[0].startswith("numerical parity with CPU float32 failed (logits rel 3.00e-01")


@pytest.mark.slow
def test_decision_slower_device_blocks(mlp_report):
    cpu, gpu = _found(mlp_report)
    gpu.checks.speed["best_samples_per_s"] = cpu.checks.speed["best_samples_per_s"] / 2
    verdict = decide([cpu, gpu])
    assert gpu.blockers[0].startswith("slower than the CPU for this model")
    assert verdict.recommended.device == "cpu"


@pytest.mark.slow
def test_decision_flipped_positions_block_and_nothing_passing_exits_nonzero(mlp_report):
    cpu, gpu = _found(mlp_report)
    from alchemetric_ray.checks.certificate import backend_verdict

    passed, reasons = backend_verdict(0.07, 0.051, 0.05)
    cert = {"reference": "cpu/fp32", "max_flip_share": 0.01,
            "backends": {"mps/fp32": {"passed": passed, "flipped_positions": 0.07, "reasons": reasons},
                         "cpu/fp32": {"passed": True, "reasons": []}}}
    decide([cpu, gpu], cert)
    assert gpu.blockers == ["certificate vs cpu/fp32: 7.0% of the saved model's positions flip (limit 1%)"]
    cpu.checks.amp = {"passed": False, "final_loss": 2.0, "final_loss_fp32": 0.5, "skipped_steps": 9}
    verdict = decide([cpu, gpu], cert)
    assert verdict.recommended is None and verdict.exit_code == 1


# ---- the certificate, and predict's warning ------------------------------------------------------


def _positions(score, long_threshold, short_threshold):
    return np.select([score > long_threshold, score < -short_threshold], [1, -1], 0)


def _flip_share_fp32_vs_bf16(model_dir):
    """Share of the certificate rows whose position differs between CPU bf16 autocast and fp32,
    the max |score difference| and the row count, computed with plain torch."""
    import torch

    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.checks.certificate import certificate_rows

    loaded = load_model(model_dir)
    x, _ = certificate_rows(loaded)  # the certificate's rows: the model's test segment
    classes, th = loaded.manifest.label["classes"], loaded.config.signals
    with torch.no_grad():
        xt = torch.from_numpy(np.ascontiguousarray(x))
        ref = torch.softmax(loaded.model(xt).float(), dim=1).numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = torch.softmax(loaded.model(xt).float(), dim=1).numpy()
    ref_score = ref[:, classes.index("up")] - ref[:, classes.index("down")]
    low_score = low[:, classes.index("up")] - low[:, classes.index("down")]
    flipped = (_positions(low_score, th.long_threshold, th.short_threshold)
               != _positions(ref_score, th.long_threshold, th.short_threshold))
    return float(flipped.mean()), float(np.abs(low_score - ref_score).max()), len(x)


def test_certificate_flip_share_on_a_known_case(monkeypatch):
    """certify() on scores with a known answer: 6 of 400 positions cross a threshold under the
    perturbed backend (1.5%, over the 1% limit); tiny score noise that crosses no threshold
    flips nothing; an identical backend flips nothing."""
    import pandas as pd
    import torch

    from alchemetric_ray.checks import certificate
    from alchemetric_ray.hardware import resolve_precision
    from alchemetric_ray.models import model_spec

    rng = np.random.default_rng(3)
    n = 400
    ref = rng.choice([-0.3, -0.2, 0.0, 0.01, 0.2, 0.3], size=n)  # all at least 0.04 from the +-0.05 thresholds
    perturbed = ref + rng.uniform(-0.005, 0.005, size=n)  # noise: no position changes
    moved = rng.choice(n, size=6, replace=False)
    perturbed[moved] = np.where(ref[moved] > 0.05, -0.2, 0.2)  # these 6 positions flip
    rows = pd.DataFrame({"date": np.repeat(pd.bdate_range("2020-01-01", periods=100), 4),
                         "ticker": np.tile(["A", "B", "C", "D"], 100), "fwd_ret": rng.normal(0, 0.01, n)})
    monkeypatch.setattr(certificate, "certificate_rows", lambda loaded: (np.zeros((n, 3), np.float32), rows))
    monkeypatch.setattr(certificate, "_scores",
                        lambda loaded, x, device, precision, date=None: ref if precision.mode == "fp32" else perturbed)
    manifest = type("Manifest", (), {"classes": ["down", "flat", "up"]})()  # a class target: thresholds apply
    loaded = type("Loaded", (), {"config": load_config(), "manifest": manifest})()  # thresholds 0.05 / 0.05
    cpu = torch.device("cpu")
    fp32, bf16 = resolve_precision("fp32", cpu), resolve_precision("bf16", cpu, model=model_spec("mlp"))
    cert = certificate.certify(loaded, [(cpu, fp32), (cpu, bf16)], (cpu, fp32))
    same, other = cert["backends"]["cpu/fp32"], cert["backends"]["cpu/bf16"]
    assert same["flipped_positions"] == 0.0 and same["passed"] and same["max_abs_score_diff"] == 0.0
    assert other["flipped_positions"] == pytest.approx(6 / n) and not other["passed"]
    assert other["rows"] == n and other["max_abs_score_diff"] == pytest.approx(np.abs(perturbed - ref).max())
    assert cert["certified"] == ["cpu/fp32"]
    assert same["rank_ic_change"] == 0.0 and same["reasons"] == []
    assert other["reasons"][0] == "1.5% of the saved model's positions flip (limit 1%)"


@pytest.mark.slow
def test_certificate_for_a_saved_model(stock_model, tmp_path, capsys):
    import shutil

    from alchemetric_ray.signals.predict import warn_if_uncertified

    model_dir = tmp_path / "model"  # a copy of the session's model: the certificate is written into it
    shutil.copytree(stock_model, model_dir)
    cfg = load_config(None, [f"storage.path={tmp_path / 'results'}", "device.name=cpu"])
    assert warn_if_uncertified(model_dir, "cpu", "bf16") is not None  # not certified yet
    assert "never certified" in capsys.readouterr().err
    report = run_doctor(cfg, device="cpu", model_dir=str(model_dir), quick=True)
    cert = json.loads((model_dir / "certificate.json").read_text())
    assert cert == json.loads(json.dumps(report.certificate))
    assert cert["reference"] == "cpu/fp32"
    same = cert["backends"]["cpu/fp32"]
    assert same["flipped_positions"] == 0.0 and same["score_rank_corr"] == pytest.approx(1.0) and same["rows"] > 100
    assert same["rank_ic_change"] == 0.0 and same["passed"] and cert["max_rank_ic_change"] == 0.005
    bf16 = cert["backends"]["cpu/bf16"]
    assert 0.9 < bf16["score_rank_corr"] <= 1.0
    # the flip share recomputed here from the model's own fp32 and bf16 scores on the same rows
    flips, score_diff, rows = _flip_share_fp32_vs_bf16(model_dir)
    assert bf16["rows"] == rows and bf16["flipped_positions"] == pytest.approx(flips, abs=1e-12)
    assert bf16["max_abs_score_diff"] == pytest.approx(score_diff, rel=1e-6, abs=1e-9) and score_diff > 0
    assert ("cpu/bf16" in cert["certified"]) is bf16["passed"]
    if bf16["passed"]:
        assert warn_if_uncertified(model_dir, "cpu", "bf16") is None


@pytest.mark.slow
def test_doctor_cli_json_and_exit_code(monkeypatch, capsys):
    out = subprocess.run([sys.executable, "-m", "alchemetric_ray.cli", "doctor", "--device", "cpu", "--quick", "--json",
                          "model.hidden=8"],
                         capture_output=True, text=True, timeout=600)
    report = json.loads(out.stdout)
    assert out.returncode == report["verdict"]["exit_code"] == 0
    assert set(report) == {"inventory", "model", "run", "targets", "certificate", "verdict"}
    assert report["run"]["model"]["hidden"] == 8 and report["run"]["batch"] == 512
    assert {"device", "mode", "blockers", "passed"} <= set(report["targets"][0])
    no_cuda(monkeypatch)  # in-process: CUDA absent on any host
    capsys.readouterr()
    assert main(["doctor", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_mps_autocast_in_training_needs_a_passing_doctor_record(tmp_path):
    from alchemetric_ray.checks.report import TargetResult
    from alchemetric_ray.errors import DoctorRequired
    from alchemetric_ray.hardware.records import record_path, require_doctor_checked_precision, write_records

    cfg = load_config(None, [f"storage.path={tmp_path}", "precision.mode=bf16", "model.hidden=16"])
    require_doctor_checked_precision(cfg, "cpu")  # only MPS is gated
    require_doctor_checked_precision(cfg.replace("precision.mode=fp32"), "mps")  # float32 needs nothing
    with pytest.raises(DoctorRequired,
                       match="needs a passing doctor check for this model; run `alchemetric-ray doctor"):
        require_doctor_checked_precision(cfg, "mps")
    write_records(cfg, [TargetResult(device="mps", device_type="mps", mode="bf16", passed=False,
                                     blockers=["operators without a mps kernel: aten::foo"])])
    with pytest.raises(DoctorRequired, match="the doctor blocked this model there .*aten::foo"):
        require_doctor_checked_precision(cfg, "mps")
    write_records(cfg, [TargetResult(device="mps", device_type="mps", mode="bf16", passed=True, blockers=[])])
    require_doctor_checked_precision(cfg, "mps")
    # another model setting is another model: its record is separate
    with pytest.raises(DoctorRequired):
        require_doctor_checked_precision(cfg.replace("model.hidden=32"), "mps")
    assert record_path(cfg, "mps", "bf16").is_file()


def test_certificate_rows_are_whole_dates_spread_over_the_segment():
    from alchemetric_ray.checks.certificate import sample_dates

    dates = np.repeat(np.arange("2017-01-02", "2017-07-01", dtype="datetime64[D]"), 50)  # 180 days x 50 tickers
    small = sample_dates(dates[:900], 1000)
    assert np.array_equal(small, np.arange(900))  # few rows: every one
    keep = sample_dates(dates, 2000)
    kept, per_day = np.unique(dates[keep], return_counts=True)
    assert len(keep) <= 2000 and len(keep) >= 1900  # as many whole dates as fit
    assert (per_day == 50).all()  # every ticker of each date
    assert kept[0] == dates[0] and kept[-1] == dates[-1]  # from the first date to the last
    gaps = np.diff(kept).astype(int)
    assert gaps.max() - gaps.min() <= 1  # evenly spread
    ragged = np.concatenate([dates, np.repeat(np.datetime64("2017-07-03"), 3000)])  # one date over the limit
    assert len(sample_dates(ragged, 2000)) <= 2000


# ---- the run's own shapes and loss ---------------------------------------------------------------


def test_the_doctor_takes_the_runs_shapes_from_its_config():
    from alchemetric_ray.checks.step import RunShape, date_sizes, make_batch

    shape = RunShape.of(load_config(None, ["model.name=lstm", "features.window=7", "train.batch_size=300",
                                           "features.names=ret_1,ret_5,vol_20", "features.label=binary"]))
    assert (shape.n_features, shape.outputs, shape.window, shape.loss, shape.batch) == (3, 2, 7, "ce", 300)
    x, y, sizes = make_batch(shape, shape.batch)
    assert x.shape == (300, 7, 3) and set(y.tolist()) == {0, 1}
    regression = RunShape.of(load_config(None, ["features.label=cs_rank"]))
    assert (regression.outputs, regression.loss, regression.n_features) == (1, "mse", 16)
    ic = RunShape.of(load_config(None, ["features.label=cs_zscore", "train.loss=ic", "train.batch_size=120"]))
    assert ic.loss == "ic" and date_sizes(ic.batch) == [50, 50, 20]  # whole dates of 50 names (the last one short)
    x, y, sizes = make_batch(ic, ic.batch)
    assert x.shape == (120, 16) and y.dtype.is_floating_point and sizes == [50, 50, 20]
    assert RunShape.from_json(json.loads(json.dumps(ic.to_json()))) == ic  # what the probe's subprocess gets


def test_parity_and_mixed_precision_run_the_ic_loss_on_whole_dates():
    """The IC loss (a per-date correlation: index_add over the dates) on CPU bf16 vs float32: real, small
    differences inside the tolerance, and a loss that is minus a correlation (between -1 and 0 once learnt)."""
    import torch

    from alchemetric_ray.checks.amp import amp_sanity
    from alchemetric_ray.checks.coverage import record_ops
    from alchemetric_ray.checks.parity import parity
    from alchemetric_ray.checks.step import RunShape
    from alchemetric_ray.hardware import resolve_precision
    from alchemetric_ray.models import model_spec

    cpu = torch.device("cpu")
    shape = RunShape.of(load_config(None, ["features.label=cs_rank", "train.loss=ic", "train.batch_size=200",
                                           "model.hidden=16"]))
    bf16 = resolve_precision("bf16", cpu, model=model_spec(shape.model))
    p = parity(shape, cpu, bf16)
    assert p["passed"] and p["batch"] == 200 and 0 < p["logits_max_rel"] <= p["tolerance_rel"]
    a = amp_sanity(shape, cpu, bf16, steps=20)
    assert a["passed"] and -1 <= a["final_loss_fp32"] < a["first_loss"] <= 1 and a["final_loss_fp32"] < 0
    assert "index_add" in record_ops(shape)  # the IC loss's own operator is part of the coverage


# ---- the known-bug table at the run's shapes ------------------------------------------------------


def test_matmul_probe_against_the_float64_product_after_dirtying_the_allocator():
    import torch

    from alchemetric_ray.checks.bug_probes import PROBE_TOLERANCE, probe_matmul

    cpu = torch.device("cpu")
    for op, batch in (("mm", 1), ("addmm", 1), ("bmm", 3), ("baddbmm", 2)):
        got = probe_matmul(op, 16, 5000, 24, cpu, batch=batch)
        assert got["op"] == op and got["passed"] and 0 < got["max_rel_error"] < 1e-5
        assert got["shape"] == ([batch, 16, 5000, 24] if batch > 1 else [16, 5000, 24])
    low = probe_matmul("mm", 16, 5000, 24, cpu, dtype=torch.bfloat16)
    # bf16 operands, float32 accumulation, a bf16 result: its rounding (2**-9 of a value) and no more
    assert low["passed"] and 1e-4 < low["max_rel_error"] < PROBE_TOLERANCE["bfloat16"]


def _apple_m2():
    from alchemetric_ray.hardware import known_bugs as kb

    return kb.Backend("mps", (2, 13, 0), "Apple8", "Apple M2")


def test_known_bug_probes_run_at_the_shapes_the_trace_recorded():
    """The table matched against an M2 on torch 2.13 (its entries apply there), the probes run here on
    the CPU: at 40,000 rows the MLP's first two weight gradients multiply over K = 40,000."""
    import torch

    from alchemetric_ray.checks.bug_probes import known_bugs
    from alchemetric_ray.checks.step import RunShape
    from alchemetric_ray.hardware import resolve_precision

    cpu = torch.device("cpu")
    cfg = load_config(None, ["train.batch_size=40000"])
    found = known_bugs(cfg, RunShape.of(cfg), cpu, resolve_precision("fp32", cpu), backend=_apple_m2())
    assert found["rows"] == 40000 and found["trace_error"] is None
    assert {m["id"]: m["source"] for m in found["matched"]}["mps-matmul-large-k-2d"] == \
        "https://github.com/pytorch/pytorch/issues/193487"
    assert "mps-large-reductions-silent" in [e["id"] for e in found["not_evaluable"]]
    shapes = [p["shape"] for p in found["probes"]]
    assert shapes[:2] == [[64, 40000, 64], [64, 40000, 16]]  # the hits (hidden 64 x 16 features), largest first
    assert all(p["passed"] and p["max_rel_error"] < 1e-5 for p in found["probes"]) and found["passed"]
    assert all(p["entries"] == ["mps-matmul-large-k-2d"] for p in found["probes"])
    # an LSTM runs MPS's own kernels: "unknown: probe" -> the largest-K matmuls of its trace
    lstm = load_config(None, ["model.name=lstm", "model.hidden=16", "train.batch_size=300"])
    found = known_bugs(lstm, RunShape.of(lstm), cpu, resolve_precision("fp32", cpu), backend=_apple_m2())
    assert {u["id"] for u in found["unknown"]} >= {"mps-matmul-large-k-2d", "mps-matmul-large-k-batched"}
    large_k = [p for p in found["probes"] if "mps-matmul-large-k-2d" in p["entries"]]
    assert large_k[0]["shape"][1] == 300 and all(p["passed"] for p in found["probes"])  # K = the step's rows
    assert any(p["op"] == "bmm" for p in found["probes"])  # the batched entry, at the trace's largest K


@pytest.mark.slow
def test_decision_failed_probe_and_unworkable_bug_block(mlp_report):
    from alchemetric_ray.checks.report import format_report

    cpu, gpu = _found(mlp_report)
    gpu.checks.known_bugs = {
        "backend": "mps (Apple M2, Apple8), torch 2.13.0", "rows": 40000, "trace_error": None,
        "matched": [{"id": "mps-matmul-large-k-2d", "source": "https://github.com/pytorch/pytorch/issues/193487",
                     "evidence": "the step at 40,000 rows runs mm", "workaround": "micro_batches"},
                    {"id": "mps-no-float64", "source": "https://github.com/pytorch/pytorch/issues/142397",
                     "evidence": "the step computes in float64", "workaround": None}],
        "unknown": [], "not_evaluable": [{"id": "mps-large-reductions-silent", "source": "x"}],
        "probes": [{"entries": ["mps-matmul-large-k-2d"], "op": "mm", "shape": [64, 40000, 16],
                    "call": "mm (64, 40000) @ (40000, 16), K = 40,000", "dtype": "float32", "tolerance": 1e-3,
                    "max_rel_error": 0.21, "passed": False}], "passed": False}
    verdict = decide([cpu, gpu])
    assert gpu.blockers == [
        "known backend bug mps-no-float64 (https://github.com/pytorch/pytorch/issues/142397): the step computes in "
        "float64; training refuses this run",
        "known backend bug mps-matmul-large-k-2d: mm (64, 40000) @ (40000, 16), K = 40,000 on mps is off by "
        "2.10e-01 of its scale after the allocator was dirtied (tolerance 0.001)"]
    assert verdict.recommended.as_dict() == {"device": "cpu", "precision": "fp32"}
    text = format_report(dataclasses.replace(mlp_report, targets=[cpu, gpu], verdict=verdict, certificate=None))
    assert "known bugs at 40,000 rows: matched mps-matmul-large-k-2d (https://github.com/pytorch/pytorch/issues" \
           "/193487)" in text
    assert "probe mm (64, 40000) @ (40000, 16), K = 40,000 in float32: rel error 2.1e-01 (tolerance 0.001) FAIL" in text


# ---- the catch path, on an operator the CPU really lacks -----------------------------------------


@pytest.fixture
def eigh_model():
    """``model.module=unsupported_model``: its forward runs torch.linalg.eigh on a bfloat16 tensor
    (conftest's ``model_registry`` drops the model after the test)."""
    return load_config(None, ["model.module=unsupported_model", "model.name=eigh", "model.hidden=8",
                              "device.name=cpu"])


@pytest.mark.slow
def test_an_operator_without_a_kernel_is_listed_finished_in_float32_and_blocks(eigh_model):
    """torch 2.13 has no bfloat16 eigh on the CPU.  In float32 the model's own bf16 tensor reaches the
    kernel: the probe lists ``_linalg_eigh`` with its first error line, finishes the call in float32 and
    the step goes on to the optimizer; under CPU bf16 autocast, eigh is one of the operators autocast
    runs in float32, so the step has no gap there (but its float32 reference does)."""
    from pathlib import Path

    import torch

    from alchemetric_ray.checks.coverage import module_folder, probe_in_process
    from alchemetric_ray.checks.run import examine
    from alchemetric_ray.checks.step import RunShape

    cpu = torch.device("cpu")
    shape = RunShape.of(eigh_model)
    assert module_folder(eigh_model.model) == str(Path(__file__).parent)  # the probe's subprocess imports it there
    error = "\"linalg_eigh_cpu\" not implemented for 'BFloat16'"
    assert probe_in_process(shape.to_json(), "cpu", "fp32") == {"unsupported": {"_linalg_eigh": error}, "error": None}
    assert probe_in_process(shape.to_json(), "cpu", "bf16") == {"unsupported": {}, "error": None}
    found = [examine(eigh_model, cpu, mode, quick=True, shape=shape) for mode in ("fp32", "bf16")]
    fp32, bf16 = found
    coverage = fp32.checks.op_coverage
    assert coverage["unsupported"] == {"_linalg_eigh": error} and coverage["error"] is None
    assert "_linalg_eigh" in fp32.checks.op_coverage["ops"]
    assert fp32.checks.parity["skipped"].startswith("skipped: the step needs operators")
    verdict = decide(found)
    assert fp32.blockers == ["operators without a cpu kernel (training would fail): _linalg_eigh"]
    assert bf16.checks.op_coverage["passed"]
    assert f"the parity check failed: NotImplementedError: {error}" in bf16.blockers
    assert verdict.recommended is None and verdict.exit_code == 1


def test_the_fallback_keeps_dtypes_devices_and_in_place_writes():
    import torch

    from alchemetric_ray.checks.coverage import finish_on_reference

    a = torch.randn(6, 4)
    gram = (a.T @ a).to(torch.bfloat16)
    values, vectors = finish_on_reference(torch.ops.aten._linalg_eigh.default, (gram,), {})
    assert values.dtype == vectors.dtype == torch.bfloat16 and values.device == gram.device
    expected = torch.linalg.eigvalsh(gram.float())
    assert torch.allclose(values.float(), expected, rtol=1e-2, atol=1e-2)
    x = torch.ones(3, dtype=torch.bfloat16)
    out = finish_on_reference(torch.ops.aten.add_.Tensor, (x, torch.full((3,), 2.0)), {})
    assert out is x and x.tolist() == [3.0, 3.0, 3.0]  # the caller's tensor was written, and is returned


# ---- the certificate's pass rule -----------------------------------------------------------------


def test_backend_verdict_flip_share_and_rank_ic_change():
    from alchemetric_ray.checks.certificate import MAX_FLIP_SHARE, MAX_RANK_IC_CHANGE, backend_verdict

    nan = float("nan")
    assert backend_verdict(0.0, 0.04, 0.04) == (True, [])
    assert backend_verdict(MAX_FLIP_SHARE, 0.04 + MAX_RANK_IC_CHANGE / 2, 0.04) == (True, [])
    assert backend_verdict(0.0, 0.03, 0.04) == (False, ["the rank IC changes by -0.0100 (limit 0.005 either way)"])
    assert backend_verdict(0.02, 0.04, 0.04) == (False, ["2.0% of the saved model's positions flip (limit 1%)"])
    assert backend_verdict(0.0, nan, nan) == (True, [])  # no cross-section to rank: the flip share decides
    assert backend_verdict(0.0, nan, 0.04)[1] == [
        "the rank IC cannot be computed from this backend's scores (the reference's is +0.0400)"]


@pytest.mark.slow
def test_certificate_fails_a_backend_on_its_rank_ic_alone(monkeypatch, mlp_report):
    """Every score stays long (no position flips) but the perturbed backend reverses the order within
    each date: the rank IC goes from +1 to -1, and only that criterion fails it."""
    import pandas as pd
    import torch

    from alchemetric_ray.checks import certificate
    from alchemetric_ray.checks.report import format_report
    from alchemetric_ray.hardware import resolve_precision
    from alchemetric_ray.models import model_spec

    rng = np.random.default_rng(5)
    days, names = 60, 5
    rows = pd.DataFrame({"date": np.repeat(pd.bdate_range("2021-01-01", periods=days), names),
                         "ticker": np.tile(list("ABCDE"), days), "fwd_ret": rng.normal(0, 0.01, days * names)})
    rank = rows.groupby("date")["fwd_ret"].rank().to_numpy()
    ref = 0.2 + 0.01 * rank  # all long, ordered as the returns: rank IC +1
    reversed_ = 0.2 + 0.01 * (names + 1 - rank)  # all long, ordered against them: rank IC -1
    monkeypatch.setattr(certificate, "certificate_rows", lambda loaded: (np.zeros((len(rows), 3), np.float32), rows))
    monkeypatch.setattr(certificate, "_scores",
                        lambda loaded, x, device, precision, date=None: ref if precision.mode == "fp32" else reversed_)
    manifest = type("Manifest", (), {"classes": ["down", "flat", "up"]})()
    loaded = type("Loaded", (), {"config": load_config(), "manifest": manifest})()
    cpu = torch.device("cpu")
    fp32, bf16 = resolve_precision("fp32", cpu), resolve_precision("bf16", cpu, model=model_spec("mlp"))
    cert = certificate.certify(loaded, [(cpu, fp32), (cpu, bf16)], (cpu, fp32))
    same, other = cert["backends"]["cpu/fp32"], cert["backends"]["cpu/bf16"]
    assert cert["reference_rank_ic"] == pytest.approx(1.0)
    assert same["rank_ic_change"] == 0.0 and same["passed"]
    assert other["flipped_positions"] == 0.0 and other["rank_ic"] == pytest.approx(-1.0)
    assert other["rank_ic_change"] == pytest.approx(-2.0) and not other["passed"]
    assert other["reasons"] == ["the rank IC changes by -2.0000 (limit 0.005 either way)"]
    assert cert["certified"] == ["cpu/fp32"]
    found = copy.deepcopy(_target(mlp_report, "cpu", "bf16"))
    found.blockers = []
    decide([found], cert)
    assert found.blockers == ["certificate vs cpu/fp32: the rank IC changes by -2.0000 (limit 0.005 either way)"]
    text = format_report(dataclasses.replace(mlp_report, certificate=cert))
    assert "certificate cpu/bf16   vs cpu/fp32: rank corr -1.0000, flipped positions 0.00% (limit 1%), " \
           "rank IC change -2.0000 (limit 0.005) FAIL" in text
