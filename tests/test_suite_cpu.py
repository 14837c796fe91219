"""bench/suite_cpu.py on a small suite of its own: a test whose child process burns a known amount of CPU."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="bench/suite_cpu.py reads /proc (Linux only)")
def test_the_cpu_of_a_tests_child_process_is_counted_and_bounds_the_wall_time(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_burn.py").write_text(textwrap.dedent("""
        import subprocess, sys

        def test_burn():
            # a child Python process that computes for 2 s of its own CPU time
            burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 2: pass"
            subprocess.run([sys.executable, "-c", burn], check=True)

        def test_fails():
            assert False
    """))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "suite_cpu.py"), "--out", str(tmp_path / "results"),
                           "--", str(suite), "--maxfail=5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # pytest's own exit code: a test failed
    result = json.loads((tmp_path / "results" / "suite-cpu.json").read_text())
    assert result["exit_code"] == 1 and result["pytest_args"] == [str(suite), "--maxfail=5"]
    burned = result["by_kind"]["other Python processes"]
    # at least the child's 2 s; more where other Python processes ran on the machine meanwhile (the benchmark
    # reads the whole machine), never more than the machine's busy time
    assert burned["processes"] >= 1 and 1.5 <= burned["core_s"] <= result["busy_core_s"], result["by_kind"]
    # the machine's busy time holds the child's and pytest's own; the bound is that time over the cores
    assert result["busy_core_s"] >= burned["core_s"] + result["by_kind"]["pytest (in-process tests)"]["core_s"] - 0.5
    assert result["bound_s"] == pytest.approx(result["busy_core_s"] / result["machine"]["cores"], abs=0.1)
    assert result["bound_s"] <= result["wall_s"]
    lines = done.stdout.splitlines()
    assert any(line.startswith("the cores' busy time: ") and "this much CPU needs at least" in line for line in lines)
    assert any(line.endswith("  other Python processes") for line in lines), done.stdout[-2000:]
    # test by test: the busy time over test_burn holds its child's 2 s, which are not pytest's own
    tests = {row["test"].rsplit("::", 1)[-1]: row for row in result["tests"]["top"]}
    assert result["tests"]["count"] == 2 and set(tests) == {"test_burn", "test_fails"}, result["tests"]
    burn = tests["test_burn"]
    assert burn["busy_core_s"] >= 1.5 and burn["pytest_core_s"] < 1.0 and burn["wall_s"] >= 1.5, burn
    assert [row["test"] for row in result["tests"]["top"]][0].endswith("::test_burn")  # the most CPU first
    assert any(line.startswith("the 2 tests of most CPU (of 2) hold ") for line in lines), done.stdout[-2000:]
    assert any(line.endswith("test_burn") and line.split()[0] == f"{burn['busy_core_s']:.1f}" for line in lines)
