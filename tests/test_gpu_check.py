"""The CUDA check script runs the product's precision branches end to end (here on the CPU)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def test_gpu_check_runs_on_cpu_and_reports(tmp_path):
    out_json = tmp_path / "rows.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--steps", "16", "--batch", "64",
                          "--models", "mlp,lstm", "--json", str(out_json)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(out_json.read_text())["rows"]
    by = {(r["model"], r["precision"]): r for r in rows}
    assert by[("mlp", "fp32")]["last_loss"] < by[("mlp", "fp32")]["first_loss"]
    assert by[("mlp", "bf16")]["skipped"] == 0 and by[("mlp", "bf16")]["samples_per_s"] > 0
    assert "refused" in by[("mlp", "fp16")]
    assert "LSTM fails under CPU autocast" in by[("lstm", "bf16")]["refused"]
