"""The signals frame as flat arrays: what every statistic of ``signals/metrics.py`` and every book
of ``signals/portfolio.py`` reads first.

Input: a DataFrame ``signals`` with one row per (date, ticker) and the columns

* ``date``      decision date t (datetime64; any sortable, hashable value works),
* ``ticker``    name (str),
* ``score``     float, higher = more bullish (e.g. P(up) - P(down)),
* ``fwd_ret``   realised forward *log* return from the open of t+1 to the open of t+1+h.  It is
  earned only after a position decided at t takes effect at t+1, so it is already aligned: no
  statistic or book shifts it again,
* ``position``  optional, -1/0/+1 (any finite float is accepted as a signed size); read only by
  :func:`~alchemetric_ray.signals.portfolio.position_returns` and
  :func:`~alchemetric_ray.signals.portfolio.hit_rate`, which fall back to sign(score) without it.

Rows with NaN ``score`` or ``fwd_ret`` are dropped first (and, where a position is used, rows with a
NaN ``position``).  A duplicated (date, ticker) pair is an error (``ValueError``): it would silently
double a name's weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

_REQUIRED = ("date", "ticker", "score", "fwd_ret")


@dataclass
class Panel:
    """The NaN-free rows as flat arrays; dates/tickers factorised (sorted, compact codes)."""

    dcode: np.ndarray  # int64 row -> index into dates
    dates: np.ndarray  # ascending unique dates that have at least one row
    tcode: np.ndarray  # int64 row -> index into tickers
    n_tickers: int
    score: np.ndarray
    fwd_ret: np.ndarray
    position: np.ndarray | None


def _numeric(col: pd.Series) -> np.ndarray:
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _compact_codes(col: pd.Series, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted factorisation of ``col`` restricted to the rows in ``keep`` (codes 0..k-1, no gaps)."""
    codes, uniques = pd.factorize(col, sort=True)  # on the Series: fast for Arrow strings too
    codes = codes[keep].astype(np.int64, copy=False)
    used = np.bincount(codes, minlength=len(uniques)) > 0
    if not used.all():
        remap = np.cumsum(used) - 1
        codes = remap[codes]
        uniques = uniques[used]
    return codes, np.asarray(uniques)


def prepare_panel(signals: pd.DataFrame, *, need_position: bool = False) -> Panel:
    """Check columns, drop NaN rows, factorise date and ticker, reject duplicated (date, ticker)."""
    if not isinstance(signals, pd.DataFrame):
        raise TypeError(f"signals must be a pandas DataFrame, got {type(signals).__name__}")
    missing = [c for c in _REQUIRED if c not in signals.columns]
    if missing:
        raise ValueError(f"signals is missing column(s) {missing}; needs {list(_REQUIRED)}")
    score = _numeric(signals["score"])
    fwd = _numeric(signals["fwd_ret"])
    ok = np.isfinite(score) & np.isfinite(fwd)
    pos = None
    if need_position:
        if "position" in signals.columns:
            pos = _numeric(signals["position"])
            ok &= np.isfinite(pos)
        else:
            pos = np.sign(score)
    ok &= signals["date"].notna().to_numpy() & signals["ticker"].notna().to_numpy()
    dcode, dates = _compact_codes(signals["date"], ok)
    tcode, tickers = _compact_codes(signals["ticker"], ok)
    key = dcode * max(len(tickers), 1) + tcode
    if key.size and not pd.Index(key).is_unique:
        raise ValueError("signals has duplicated (date, ticker) rows; keep one row per pair")
    return Panel(
        dcode=dcode,
        dates=dates,
        tcode=tcode,
        n_tickers=len(tickers),
        score=score[ok],
        fwd_ret=fwd[ok],
        position=None if pos is None else pos[ok],
    )
