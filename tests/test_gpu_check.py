"""The one command for a CUDA machine (precision branches, mixed precision, data path, host syncs) runs end to
end with torch alone (here on the CPU)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"
# What the GPU machine lacks: Ray and everything else the service installs beyond torch and numpy.
NOT_THERE = ("ray", "pyarrow", "pandas", "sklearn", "scipy", "yaml", "boto3", "s3fs")


def test_the_one_cuda_command_runs_with_torch_alone(tmp_path):
    """bench/gpu.py with every module but torch and numpy refused: the four parts run and write results."""
    script = (f"import runpy, sys\n"
              f"for name in {NOT_THERE!r}:\n"
              f"    sys.modules[name] = None  # import raises ImportError\n"
              f"sys.argv = [{str(BENCH)!r}, '--device', 'cpu', '--quick', '--out', {str(tmp_path)!r}]\n"
              f"runpy.run_path({str(BENCH)!r}, run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "only the plain host path runs; the device-cache and pinned-staging ratios are NOT measured" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data-path-cpu.json", "gpu-check-cpu.json",
                                                          "mixed-precision-cpu.json", "syncs-cpu.json"]
    # the precision branches: fp32 and bf16 train, the policy refuses what the CPU cannot do
    by = {(r["model"], r["precision"]): r for r in json.loads((tmp_path / "gpu-check-cpu.json").read_text())["rows"]}
    assert by[("mlp", "fp32")]["last_loss"] < by[("mlp", "fp32")]["first_loss"]
    assert by[("mlp", "bf16")]["skipped"] == 0 and by[("mlp", "bf16")]["samples_per_s"] > 0
    assert "refused" in by[("mlp", "fp16")]
    assert "LSTM fails under CPU autocast" in by[("lstm", "bf16")]["refused"]
    # the data path: the host path only, and said so
    rows = json.loads((tmp_path / "data-path-cpu.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["mlp", "lstm"]
    assert all(r["samples_per_s"]["host"] > 0 and r["ratio_vs_host"] == {"host": 1.0} for r in rows)
    # the host syncs: without CUDA, counted on the CPU, one read per check (10 steps, a check every 5, the end)
    assert "torch's sync detector is CUDA-only" in out.stdout
    counts = json.loads((tmp_path / "syncs-cpu.json").read_text())["rows"]
    assert [r["kind"] for r in counts] == ["fp32", "bf16", "fp16", "ic"]
    assert all(r["syncs"] <= r["allowed"] == 3 for r in counts)
