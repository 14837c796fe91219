"""scripts/mac_check.py, the check a Mac user runs and sends back: its three steps run here on the CPU
(the same code a Mac runs on MPS, the device named on the command line), with a real local Ray, the
packaged prices and real training steps.  No test depends on a Mac."""

import importlib.util
import json
from pathlib import Path

import pytest
from device_probes import cpu_only_machine

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mac_check.py"
SMALL = ["data.tickers=AAPL,MSFT,XOM", "model.hidden=16", "train.batch_size=256", "train.shadow_every=4"]


@pytest.fixture
def mac_check():
    spec = importlib.util.spec_from_file_location("mac_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _written(folder: Path) -> dict:
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name.startswith("mac-check-") and files[0].suffix == ".json", files
    return json.loads(files[0].read_text())


@pytest.mark.slow
def test_every_step_runs_and_passes_on_the_cpu_and_the_file_to_send_back_holds_them(
        ray_session, mac_check, tmp_path, capsys, monkeypatch):
    cpu_only_machine(monkeypatch)
    out = tmp_path / "out"
    assert mac_check.main(["--device", "cpu", "--out", str(out), *SMALL]) == 0
    printed = capsys.readouterr().out
    steps = [line.split()[:2] for line in printed.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert steps == [["PASS", "known"], ["PASS", "doctor"], ["PASS", "train"]], printed
    assert "every step passed: send back" in printed
    sent = _written(out)
    assert sent["passed"] and sent["device"] == "cpu" and sent["overrides"] == SMALL
    assert [s["step"] for s in sent["steps"]] == ["known bugs", "doctor", "train"]
    assert sent["machine"]["torch"] and sent["machine"]["mps"] == {"built": False, "available": False}
    doctor = sent["steps"][1]["report"]
    assert doctor["verdict"]["recommended"]["device"] == "cpu"
    summary = sent["steps"][2]["summary"]
    assert summary["epochs_run"] == 2
    shadow = summary["shadow"]
    # fp32 on the CPU against its float32 CPU copy: the same sums, so exactly equal
    assert shadow["checks"] >= 2 and shadow["max_error"] == 0.0
    assert f"shadow check: {shadow['checks']} checks, largest whole-gradient error 0" in printed


def test_a_machine_without_the_device_fails_the_first_step_in_one_line_and_still_writes_the_file(
        mac_check, tmp_path, capsys, monkeypatch):
    cpu_only_machine(monkeypatch)
    assert mac_check.main(["--out", str(tmp_path)]) == 1  # the default device: mps
    printed = capsys.readouterr().out
    fails = [line for line in printed.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL  known bugs no mps device here (torch ")
    sent = _written(tmp_path)
    assert not sent["passed"] and [s["step"] for s in sent["steps"]] == ["known bugs"]


def test_a_bad_override_is_refused_in_one_line_before_any_step(mac_check, tmp_path, capsys):
    assert mac_check.main(["--device", "cpu", "--out", str(tmp_path), "train.epochs=two"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mac_check.py: error: ") and "train.epochs" in err and "\n" not in err
    assert not list(tmp_path.iterdir())
