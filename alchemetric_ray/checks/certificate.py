"""Backend certificate: does a saved model make the same trading decisions on another backend?

The model's predictions on the same rows on each backend and precision are compared with its
training backend (or CPU float32 when that backend is not here): rank correlation of the scores,
the share of positions that flip, and the change in rank IC.  A backend is certified when both stay
within their limits (:func:`backend_verdict`).  ``certificate.json`` is written into
the model folder (its name and reader are in ``artifacts/export.py``, with the rest of the folder's
layout); ``predict`` warns when it serves on a backend that was never certified.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from alchemetric_ray.artifacts.export import CERTIFICATE, backend_key
from alchemetric_ray.signals.predict import direction_score, inputs_frame, signal_positions
from alchemetric_ray.storage import Location, locate

MAX_FLIP_SHARE = 0.01  # more than 1% of positions flipping blocks a backend
# A rank IC that moves by more than this (absolute) blocks a backend: positions can all stay put while the
# ranking inside the long and short books, which is what a quantile or size-weighted book trades, changes.
MAX_RANK_IC_CHANGE = 0.005
MAX_ROWS = 20_000  # every row of the test segment up to this many; beyond it, whole dates spread over the segment


def certificate_rows(loaded) -> tuple[np.ndarray, pd.DataFrame]:
    """Inputs (the model's own normalized features) and keys for its test segment."""
    from alchemetric_ray.scoring.predictions import model_inputs

    frame = inputs_frame(loaded, None)
    splits = loaded.manifest.splits
    test = frame[(frame["date"] >= pd.Timestamp(splits["test_start"]))
                 & (frame["date"] <= pd.Timestamp(splits["test_end"]))]
    x, rows = model_inputs(test, loaded.manifest.features, loaded.mode, loaded.config.features.window)
    keep = sample_dates(rows["date"].to_numpy(), MAX_ROWS)
    return x[keep], rows.iloc[keep].reset_index(drop=True)


def sample_dates(dates: np.ndarray, max_rows: int) -> np.ndarray:
    """Row indices: all of them when there are at most ``max_rows``, else every row of evenly
    spaced dates (first to last) up to ``max_rows``.  Whole dates keep every ticker of a date in the
    sample, so its rank IC is a cross-section; spacing them covers the segment's regimes (the
    first rows in ticker order were one or two tickers' whole history)."""
    if len(dates) <= max_rows:
        return np.arange(len(dates))
    unique, code, per_date = np.unique(dates, return_inverse=True, return_counts=True)
    n_dates = max(1, min(len(unique), int(max_rows // per_date.mean())))
    while n_dates > 1:
        chosen = np.unique(np.linspace(0, len(unique) - 1, n_dates).round().astype(np.int64))
        if per_date[chosen].sum() <= max_rows:
            break
        n_dates -= 1
    else:
        chosen = np.array([0])
    return np.flatnonzero(np.isin(code, chosen))


def _scores(loaded, x: np.ndarray, device, precision, date: np.ndarray | None = None) -> np.ndarray:
    from alchemetric_ray.scoring.predictions import predict_proba

    model = loaded.model.to(device)
    try:
        proba = predict_proba(model, x, device, precision, regression=loaded.manifest.regression, date=date)
    finally:
        loaded.model.to("cpu")
    return direction_score(proba, loaded.manifest.classes)


def _rank_ic(rows: pd.DataFrame, score: np.ndarray) -> float:
    from alchemetric_ray.signals.metrics import daily_ic

    frame = pd.DataFrame({"date": rows["date"], "ticker": rows["ticker"], "score": score, "fwd_ret": rows["fwd_ret"]})
    ic = daily_ic(frame, rank=True, min_names=3)
    return float(ic.mean()) if len(ic) else float("nan")


def backend_verdict(flips: float, rank_ic: float, reference_rank_ic: float) -> tuple[bool, list[str]]:
    """Whether a backend passes, and why not (one line per failed criterion): at most
    :data:`MAX_FLIP_SHARE` of the positions flip, and the rank IC moves by at most
    :data:`MAX_RANK_IC_CHANGE` either way.

    NaN rank IC: where the reference's is NaN the rows have no cross-section to rank (fewer than 3
    names on every date), so the criterion cannot apply and the flip share decides alone; where only
    the backend's is NaN its scores lost what the reference's had (NaN or constant scores): it fails."""
    reasons = []
    if not flips <= MAX_FLIP_SHARE:
        reasons.append(f"{flips:.1%} of the saved model's positions flip (limit {MAX_FLIP_SHARE:.0%})")
    if math.isnan(reference_rank_ic):
        pass
    elif math.isnan(rank_ic):
        reasons.append(f"the rank IC cannot be computed from this backend's scores "
                       f"(the reference's is {reference_rank_ic:+.4f})")
    elif abs(rank_ic - reference_rank_ic) > MAX_RANK_IC_CHANGE:
        reasons.append(f"the rank IC changes by {rank_ic - reference_rank_ic:+.4f} "
                       f"(limit {MAX_RANK_IC_CHANGE:g} either way)")
    return not reasons, reasons


def certify(loaded, backends: list[tuple[Any, Any]], reference: tuple[Any, Any]) -> dict:
    """Compare every (device, precision) in ``backends`` with ``reference`` on the same rows."""
    from scipy.stats import spearmanr

    x, rows = certificate_rows(loaded)
    dates, classes = rows["date"].to_numpy(), loaded.manifest.classes
    ref_dev, ref_prec = reference
    ref_score = _scores(loaded, x, ref_dev, ref_prec, dates)
    ref_pos = signal_positions(ref_score, dates, classes, loaded.config)
    ref_ic = _rank_ic(rows, ref_score)
    results = {}
    for device, precision in backends:
        score = _scores(loaded, x, device, precision, dates)
        pos = signal_positions(score, dates, classes, loaded.config)
        flips = float((pos != ref_pos).mean()) if len(pos) else 0.0
        corr = float(spearmanr(score, ref_score).statistic) if len(score) > 2 else float("nan")
        ic = _rank_ic(rows, score)
        passed, reasons = backend_verdict(flips, ic, ref_ic)
        results[backend_key(device.type, precision.mode)] = {
            "rows": int(len(score)), "score_rank_corr": corr, "flipped_positions": flips,
            "rank_ic": ic, "rank_ic_change": ic - ref_ic,
            "max_abs_score_diff": float(np.abs(score - ref_score).max()) if len(score) else 0.0,
            "passed": passed, "reasons": reasons,
        }
    return {"reference": backend_key(ref_dev.type, ref_prec.mode), "reference_rank_ic": ref_ic,
            "max_flip_share": MAX_FLIP_SHARE, "max_rank_ic_change": MAX_RANK_IC_CHANGE, "backends": results,
            "certified": sorted(k for k, v in results.items() if v["passed"]),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_certificate(model_dir: str | Path | Location, cert: dict) -> Location:
    """The certificate beside the saved model's files (a local folder or object storage)."""
    path = locate(model_dir) / CERTIFICATE
    path.write_json(cert)
    return path

