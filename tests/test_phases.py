"""The worker's phase records: seconds per phase, and on Linux the memory at each phase's end and its peak."""

from pathlib import Path

import numpy as np

from alchemetric_ray.training.phases import PhaseLog, seconds_by_phase

LINUX_PROC = Path("/proc/self/status").is_file()


def test_each_phase_has_its_own_seconds_and_peak():
    log = PhaseLog()
    block = np.ones(40_000_000)  # 305 MiB, gone before the phase ends
    block[::4096] = 2.0
    del block
    log.mark("train", 0)
    log.mark("validate", 0)
    log.mark("train", 1)
    phases = [(r.phase, r.epoch) for r in log.records]
    assert phases == [("start", None), ("train", 0), ("validate", 0), ("train", 1)]
    assert all(r.seconds >= 0 for r in log.records) and log.records[0].seconds == 0.0
    assert seconds_by_phase(log.records) == {"train": round(log.records[1].seconds + log.records[3].seconds, 4),
                            "validate": log.records[2].seconds}
    if not LINUX_PROC:  # macOS: no /proc, the memory fields say "unknown"
        assert all(r.private_mib is None and r.peak_mib is None for r in log.records)
        return
    first, second = log.records[1], log.records[2]
    # the spike is in the phase it happened in, and only there: the peak is reset at each phase's start
    assert first.peak_mib - first.rss_mib > 250, first
    assert second.peak_mib - second.rss_mib < 100, second
    assert first.private_mib - log.records[0].private_mib < 100  # freed before the phase's end
