"""The backend doctor: real checks on the CPU (asked for explicitly), and the decision logic on patched findings."""

import copy
import json
import subprocess
import sys

import numpy as np
import pytest
from device_probes import no_cuda

from alchemetric_ray.cli import main
from alchemetric_ray.config import load_config
from alchemetric_ray.doctor.run import decide, run_doctor


@pytest.fixture(scope="module")
def mlp_report():
    return run_doctor(load_config(), device="cpu", quick=True)


def _target(report, device_type, mode):
    return next(t for t in report["targets"] if t["device_type"] == device_type and t["mode"] == mode)


def test_every_check_runs_for_cpu_fp32_and_bf16(mlp_report):
    for mode in ("fp32", "bf16"):
        t = _target(mlp_report, "cpu", mode)
        assert t["op_coverage"]["n_ops"] > 10 and t["op_coverage"]["unsupported"] == {}
        assert "addmm" in t["op_coverage"]["ops"]
        assert t["op_coverage"]["fallback_env"] == "PYTORCH_ENABLE_MPS_FALLBACK=0"
        assert t["parity"]["passed"] and t["amp"]["passed"]
        assert [r["batch"] for r in t["speed"]["ladder"]] == [256, 1024]
        assert all(r["samples_per_s"] > 0 and r["peak_memory_bytes"] > 0 for r in t["speed"]["ladder"])
    # parity CPU fp32 vs CPU bf16: a real, small difference inside the bf16 tolerance
    bf16 = _target(mlp_report, "cpu", "bf16")["parity"]
    assert 0 < bf16["logits_max_rel"] <= bf16["tolerance_rel"]
    assert _target(mlp_report, "cpu", "fp32")["parity"]["logits_max_rel"] == 0.0
    assert _target(mlp_report, "cpu", "bf16")["amp"]["skipped_steps"] == 0
    assert "refused" in _target(mlp_report, "cpu", "fp16")
    rec = mlp_report["verdict"]["recommended"]
    assert rec["device"] == "cpu" and rec["precision"] in ("fp32", "bf16") and mlp_report["verdict"]["exit_code"] == 0
    json.dumps(mlp_report)  # one JSON object


def test_lstm_under_cpu_autocast_is_a_blocker_and_fp32_is_recommended():
    report = run_doctor(load_config(None, ["model.name=lstm", "model.hidden=16"]), device="cpu", quick=True)
    bf16 = _target(report, "cpu", "bf16")
    assert any("LSTM fails under CPU autocast" in b for b in bf16["blockers"])
    assert report["verdict"]["recommended"] == {"device": "cpu", "precision": "fp32"}


# ---- decision logic on patched findings ----------------------------------------------------------


def _found(mlp_report):
    cpu = copy.deepcopy(_target(mlp_report, "cpu", "fp32"))
    gpu = copy.deepcopy(cpu)
    gpu.update(device="mps", device_type="mps", mode="fp32")
    gpu["speed"]["best_samples_per_s"] = cpu["speed"]["best_samples_per_s"] * 3
    for t in (cpu, gpu):
        t.pop("blockers", None)
        t.pop("passed", None)
    return cpu, gpu


def test_decision_fastest_passing_target_wins(mlp_report):
    cpu, gpu = _found(mlp_report)
    verdict = decide([cpu, gpu])
    assert verdict["recommended"] == {"device": "mps", "precision": "fp32"} and verdict["exit_code"] == 0
    assert any("3.00x CPU float32" in r for r in verdict["reasons"])


def test_decision_unsupported_operator_blocks(mlp_report):
    cpu, gpu = _found(mlp_report)
    gpu["op_coverage"]["unsupported"] = {"aten::_linalg_eigh": "not implemented for 'MPS'"}
    decide([cpu, gpu])
    assert gpu["blockers"] == ["operators without a mps kernel (would fall back to the CPU): aten::_linalg_eigh"]
    assert decide([cpu, gpu])["recommended"] == {"device": "cpu", "precision": "fp32"}


def test_decision_parity_failure_blocks(mlp_report):
    cpu, gpu = _found(mlp_report)
    gpu["parity"].update(passed=False, logits_max_rel=0.3)
    decide([cpu, gpu])
    assert gpu["blockers"][0].startswith("numerical parity with CPU float32 failed (logits rel 3.00e-01")


def test_decision_slower_device_blocks(mlp_report):
    cpu, gpu = _found(mlp_report)
    gpu["speed"]["best_samples_per_s"] = cpu["speed"]["best_samples_per_s"] / 2
    verdict = decide([cpu, gpu])
    assert gpu["blockers"][0].startswith("slower than the CPU for this model")
    assert verdict["recommended"]["device"] == "cpu"


def test_decision_flipped_positions_block_and_nothing_passing_exits_nonzero(mlp_report):
    cpu, gpu = _found(mlp_report)
    cert = {"reference": "cpu/fp32", "max_flip_share": 0.01,
            "backends": {"mps/fp32": {"passed": False, "flipped_positions": 0.07}, "cpu/fp32": {"passed": True}}}
    decide([cpu, gpu], cert)
    assert gpu["blockers"] == ["7.0% of the saved model's positions flip vs cpu/fp32 (limit 1%)"]
    cpu["amp"] = {"passed": False, "final_loss": 2.0, "final_loss_fp32": 0.5, "skipped_steps": 9}
    verdict = decide([cpu, gpu], cert)
    assert verdict["recommended"] is None and verdict["exit_code"] == 1


# ---- the certificate, and predict's warning ------------------------------------------------------


def _positions(score, long_threshold, short_threshold):
    return np.select([score > long_threshold, score < -short_threshold], [1, -1], 0)


def _flip_share_fp32_vs_bf16(model_dir):
    """Share of the certificate rows whose position differs between CPU bf16 autocast and fp32,
    the max |score difference| and the row count, computed with plain torch."""
    import torch

    from alchemetric_ray.doctor.certificate import certificate_rows
    from alchemetric_ray.train.export import load_model

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

    from alchemetric_ray.doctor import certificate
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
                        lambda loaded, x, device, precision: ref if precision.mode == "fp32" else perturbed)
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
    assert cert == json.loads(json.dumps(report["certificate"]))
    assert cert["reference"] == "cpu/fp32"
    same = cert["backends"]["cpu/fp32"]
    assert same["flipped_positions"] == 0.0 and same["score_rank_corr"] == pytest.approx(1.0) and same["rows"] > 100
    bf16 = cert["backends"]["cpu/bf16"]
    assert 0.9 < bf16["score_rank_corr"] <= 1.0
    # the flip share recomputed here from the model's own fp32 and bf16 scores on the same rows
    flips, score_diff, rows = _flip_share_fp32_vs_bf16(model_dir)
    assert bf16["rows"] == rows and bf16["flipped_positions"] == pytest.approx(flips, abs=1e-12)
    assert bf16["max_abs_score_diff"] == pytest.approx(score_diff, rel=1e-6, abs=1e-9) and score_diff > 0
    assert ("cpu/bf16" in cert["certified"]) is bf16["passed"]
    if bf16["passed"]:
        assert warn_if_uncertified(model_dir, "cpu", "bf16") is None


def test_doctor_cli_json_and_exit_code(monkeypatch, capsys):
    out = subprocess.run([sys.executable, "-m", "alchemetric_ray.cli", "doctor", "--device", "cpu", "--quick", "--json",
                          "model.hidden=8"],
                         capture_output=True, text=True, timeout=600)
    report = json.loads(out.stdout)
    assert out.returncode == report["verdict"]["exit_code"] == 0
    assert set(report) == {"inventory", "model", "targets", "certificate", "verdict"}
    assert {"device", "mode", "blockers", "passed"} <= set(report["targets"][0])
    no_cuda(monkeypatch)  # in-process: CUDA absent on any host
    capsys.readouterr()
    assert main(["doctor", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_mps_autocast_in_training_needs_a_passing_doctor_record(tmp_path):
    from alchemetric_ray.hardware.records import (
        DoctorRequired,
        record_path,
        require_doctor_checked_precision,
        write_records,
    )

    cfg = load_config(None, [f"storage.path={tmp_path}", "precision.mode=bf16", "model.hidden=16"])
    require_doctor_checked_precision(cfg, "cpu")  # only MPS is gated
    require_doctor_checked_precision(cfg.replace("precision.mode=fp32"), "mps")  # float32 needs nothing
    with pytest.raises(DoctorRequired,
                       match="needs a passing doctor check for this model; run `alchemetric-ray doctor"):
        require_doctor_checked_precision(cfg, "mps")
    write_records(cfg, [{"device": "mps", "device_type": "mps", "mode": "bf16", "passed": False,
                         "blockers": ["operators without a mps kernel: aten::foo"]}])
    with pytest.raises(DoctorRequired, match="the doctor blocked this model there .*aten::foo"):
        require_doctor_checked_precision(cfg, "mps")
    write_records(cfg, [{"device": "mps", "device_type": "mps", "mode": "bf16", "passed": True, "blockers": []}])
    require_doctor_checked_precision(cfg, "mps")
    # another model setting is another model: its record is separate
    with pytest.raises(DoctorRequired):
        require_doctor_checked_precision(cfg.replace("model.hidden=32"), "mps")
    assert record_path(cfg, "mps", "bf16").is_file()


def test_certificate_rows_are_whole_dates_spread_over_the_segment():
    from alchemetric_ray.doctor.certificate import sample_dates

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
