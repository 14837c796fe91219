"""Driver-side evaluation on one split of the shards: arrays in, the model's outputs out.

Used for the exported model's test score and the baselines; reads Parquet with pyarrow (no Ray),
builds the same inputs the loaders give the workers (rows, or per-ticker windows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from alchemetric_ray.data.batches import date_batches
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
    if cross:  # the rows of whole dates, packed in date order as the loop's validation packs them
        code = torch.from_numpy(np.unique(np.asarray(date), return_inverse=True)[1].reshape(-1))
        batches = [idx.numpy() for idx, _ in date_batches(code, batch_size, seed=0, shuffle=False)]
    else:
        batches = [np.arange(i, min(i + batch_size, len(x))) for i in range(0, len(x), batch_size)]
    out = []
    for rows in batches:
        xb = torch.from_numpy(np.ascontiguousarray(x[rows] if cross else x[rows[0]:rows[-1] + 1])).to(device)
        with precision.autocast():
            raw = model(xb, code[torch.from_numpy(rows)].to(device)) if cross else model(xb)
        out.append(outputs_of(raw, regression).cpu().numpy())
    if not out:
        return np.zeros((0, 0), np.float32)
    scored = np.concatenate(out)
    if not cross:
        return scored
    result = np.empty_like(scored)
    result[np.concatenate(batches)] = scored  # back in the rows' order
    return result
