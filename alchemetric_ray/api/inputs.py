"""What a call takes as input beyond its config: overrides as strings or a dict, and data as a path,
a URI or a pandas DataFrame of bars."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from alchemetric_ray.errors import DataError

Overrides = Sequence[str] | Mapping[str, Any]
BAR_COLUMNS = ("ticker", "date", "open", "high", "low", "close", "volume")


def override_strings(overrides: Overrides) -> list[str]:
    """``section.key=value`` strings from a dict (flat dotted keys or nested sections) or a sequence."""
    if not isinstance(overrides, Mapping):
        return [str(item) for item in overrides]
    out = []
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            out += [f"{key}.{inner}" for inner in override_strings(value)]
        else:
            out.append(f"{key}={json.dumps(value)}")
    return out


def data_path(data: Any, scratch: contextlib.ExitStack) -> str | None:
    if data is None:
        return None
    if isinstance(data, (str, Path)):
        return str(data)
    import pandas as pd

    if not isinstance(data, pd.DataFrame):
        raise DataError(f"data: a path, a URI or a pandas DataFrame of bars, not {type(data).__name__}")
    missing = [c for c in BAR_COLUMNS if c not in data.columns]
    if missing:
        raise DataError(f"data (a DataFrame): missing column(s) {', '.join(missing)}; "
                        f"bars need {', '.join(BAR_COLUMNS)}")
    folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="alchemetric-bars-")))
    data.to_parquet(folder / "bars.parquet", index=False)
    return str(folder / "bars.parquet")
