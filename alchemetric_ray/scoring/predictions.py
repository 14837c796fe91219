"""Driver-side evaluation on one split of the shards: arrays in, the model's outputs out.

Used for the exported model's test score and the baselines; reads Parquet with pyarrow (no Ray),
builds the same inputs the loaders give the workers (rows, or per-ticker windows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from alchemetric_ray.data.loaders import make_windows
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.data.shards import split_files
from alchemetric_ray.hardware import Precision
from alchemetric_ray.models import is_cross_sectional
from alchemetric_ray.storage import Location


def split_frame(shards: str | Path | Location, split: str, features: list[str],
                manifest: Manifest | None = None) -> pd.DataFrame:
    """One split of the shards (local or on object storage), the files its manifest lists, as a frame."""
    import pyarrow.parquet as pq

    files = split_files(shards, split, manifest or Manifest.read(shards))
    columns = ["date", "ticker", *features, "label", "fwd_ret"]
    if not files:
        return pd.DataFrame(columns=columns)
    return pq.read_table([f.path for f in files], filesystem=files[0].filesystem, columns=columns).to_pandas()


def model_inputs(frame: pd.DataFrame, features: list[str], mode: str, window: int) -> tuple[np.ndarray, pd.DataFrame]:
    """(X, rows) where rows holds date, ticker, label, fwd_ret aligned with X."""
    if mode == "tabular":
        rows = frame[["date", "ticker", "label", "fwd_ret"]].reset_index(drop=True)
        return frame[features].to_numpy(dtype=np.float32), rows
    xs, parts = [], []
    for _, group in frame.groupby("ticker", sort=True):
        out = make_windows({c: group[c].to_numpy() for c in group.columns}, features, window)
        if len(out["label"]):
            xs.append(out["x"])
            parts.append(pd.DataFrame({k: out[k] for k in ("date", "ticker", "label", "fwd_ret")}))
    if not xs:
        return (np.zeros((0, window, len(features)), np.float32),
                pd.DataFrame(columns=["date", "ticker", "label", "fwd_ret"]))
    return np.concatenate(xs), pd.concat(parts, ignore_index=True)


def outputs_of(raw: torch.Tensor, regression: bool) -> torch.Tensor:
    """What a model's raw output stands for, in float32: class probabilities (the softmax of the
    logits), or for a regression target the score itself (one column)."""
    return raw.float() if regression else torch.softmax(raw.float(), dim=1)


@torch.no_grad()
def predict_proba(model: torch.nn.Module, x: np.ndarray, device: torch.device, precision: Precision,  # noqa: PLR0913
                  batch_size: int = 8192, *, regression: bool = False, date: np.ndarray | None = None) -> np.ndarray:
    """The model's outputs for ``x``: class probabilities, or (``regression``) its score column.

    A cross-sectional model needs each row's ``date``: it is given whole dates (as many as
    ``batch_size`` rows hold, a wider date alone), each row's date code beside its features, and its
    outputs come back in the rows' order."""
    model.eval()
    cross = is_cross_sectional(model)
    if cross and date is None:
        raise ValueError("a cross-sectional model scores whole dates: pass each row's date")
    code = np.unique(np.asarray(date), return_inverse=True)[1].reshape(-1) if cross else np.zeros(len(x), np.int64)
    order = np.argsort(code, kind="stable") if cross else np.arange(len(x))
    bounds = _date_bounds(code[order], batch_size) if cross else range(0, len(x) + batch_size, batch_size)
    out = []
    for start, stop in zip(bounds, bounds[1:]):
        rows = order[start:stop]
        xb = torch.from_numpy(np.ascontiguousarray(x[rows] if cross else x[start:stop])).to(device)
        with precision.autocast():
            raw = model(xb, torch.from_numpy(code[rows]).to(device)) if cross else model(xb)
        out.append(outputs_of(raw, regression).cpu().numpy())
    if not out or not len(x):
        return np.zeros((0, 0), np.float32)
    scored = np.concatenate(out)
    result = np.empty_like(scored)
    result[order] = scored
    return result


def _date_bounds(sorted_code: np.ndarray, batch_size: int) -> list[int]:
    """Where batches of whole dates start and end in rows sorted by date: dates packed in turn, at most
    ``batch_size`` rows a batch unless one date alone holds more."""
    ends = (np.flatnonzero(np.r_[sorted_code[1:] != sorted_code[:-1], True]) + 1).tolist() if len(sorted_code) else []
    bounds = [0]
    for begins, end in zip([0, *ends[:-1]], ends):
        if end - bounds[-1] > batch_size and begins > bounds[-1]:
            bounds.append(begins)
    return [*bounds, len(sorted_code)] if ends else bounds
