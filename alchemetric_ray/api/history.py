"""Results kept on disk: every call writes its ``result.json`` last, :func:`load_result` reopens one
(after a kernel restart, from another process, from a job on a cluster), :func:`runs` lists them.

``result.json``: ``{"format": "alchemetric-ray result", "version": 1, "kind": ..., "created": ...,
"result": <the result's record>}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alchemetric_ray.api.results import RefitResult, Shards, SweepResult, TrainResult
from alchemetric_ray.api.saving import FORMAT, RESULT_FILE, VERSION
from alchemetric_ray.errors import ResultError

if TYPE_CHECKING:
    import pandas as pd

    from alchemetric_ray.config import RunConfig


def _kinds() -> dict[str, Any]:
    from alchemetric_ray.api.evaluation import Evaluation

    return {"features": Shards, "train": TrainResult, "sweep": SweepResult, "evaluation": Evaluation,
            "refit": RefitResult}


def load_result(path: str | Path):
    """A result saved by any call: a run, sweep, shard or evaluation folder (or its ``result.json``), a
    model folder (the :class:`Model`), or a signals Parquet file (its DataFrame)."""
    from alchemetric_ray.storage import locate

    where = locate(path)
    text = str(path)
    if text.endswith(".parquet"):
        import pandas as pd

        if not where.is_file():
            raise ResultError(f"{text}: no such signals file")
        return pd.read_parquet(text)
    file = where if text.endswith(".json") else where / RESULT_FILE
    if not file.exists():
        if (where / "meta.json").exists():  # an exported model folder
            from alchemetric_ray.api.model import Model

            return Model.load(text)
        raise ResultError(f"{text}: no {RESULT_FILE} here (a run, sweep, shard or evaluation folder written by "
                          "alchemetric-ray has one once the call finished)")
    try:
        saved = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResultError(f"{file}: not a readable result ({exc})") from None
    return _from_saved(saved, str(file))


def _from_saved(saved: Any, where: str):
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ResultError(f"{where}: not an alchemetric-ray result")
    if not isinstance(saved.get("version"), int) or saved["version"] > VERSION:
        raise ResultError(f"{where}: result version {saved.get('version')} is newer than this alchemetric-ray "
                          f"reads ({VERSION}); upgrade alchemetric-ray")
    kind = _kinds().get(str(saved.get("kind")))
    if kind is None:
        raise ResultError(f"{where}: unknown result kind {saved.get('kind')!r}")
    try:
        if saved.get("kind") == "evaluation":
            return kind.from_record(saved["result"], str(Path(where).parent))
        return kind.from_record(saved["result"])
    except (KeyError, TypeError) as exc:
        raise ResultError(f"{where}: a {saved.get('kind')} result without {exc}") from None


def runs(cfg: RunConfig | None = None) -> pd.DataFrame:
    """Every finished run and sweep under ``storage.path`` (newest first): kind, name, when, the best
    metric and its value, epochs, the model folder, the verdict where it was evaluated, the folder."""
    import pandas as pd

    from alchemetric_ray.config import load_config
    from alchemetric_ray.storage import locate

    cfg = cfg or load_config()
    root = locate(cfg.storage.path)
    rows = []
    if root.exists():
        for name in root.listing(folders=True):
            file = root / name / RESULT_FILE
            if not file.exists():
                continue
            try:
                saved = json.loads(file.read_text())
                rows.append(_row(saved, str(root / name)))
            except (ValueError, KeyError, TypeError):  # a result this reader cannot list: named, not fatal
                rows.append({"kind": "unreadable", "name": name, "path": str(root / name)})
    columns = ["kind", "name", "created", "metric", "best", "epochs", "model_dir", "verdict", "path"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("created", ascending=False, na_position="last").reset_index(drop=True)


def _row(saved: dict, path: str) -> dict[str, Any]:
    record = saved["result"]
    row = {"kind": saved["kind"], "name": record.get("name"), "created": saved.get("created"),
           "model_dir": record.get("model_dir"), "path": path}
    if saved["kind"] == "train":
        row.update(metric=record["best"]["metric"], best=record["best"]["value"], epochs=record["epochs_run"])
    elif saved["kind"] == "sweep":
        row.update(metric=record["metric"], best=record["best"].get("value"), epochs=None)
    folder = record.get("evaluation")
    if folder:
        try:
            row["verdict"] = json.loads((Path(folder) / "evaluation.json").read_text())["verdict"]["line"]
        except (OSError, ValueError, KeyError):
            row["verdict"] = None
    return row
