"""What every benchmark script shares: the machine description and the atomic results file."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alchemetric_ray.fsutil import atomic_write_json


def machine(**extra: Any) -> dict[str, Any]:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), **extra}


def write_result(out: str | Path, name: str, result: dict[str, Any]) -> Path:
    """``out/<name>.json``, written to a temporary file and renamed."""
    path = Path(out) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result)
    print(f"results: {path}")
    return path
