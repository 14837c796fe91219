"""The tear sheet of the model's signal on the scored segment: the figures a factor analyst reads
first, and their plots.

Inputs: the model's ``signals`` on the segment (columns ``date``, ``ticker``, ``score``) and the
``opens`` of every bar of those tickers from the segment's first date on (columns ``date``,
``ticker``, ``open``: each ticker's own bars, in any order).  Every return is the one the labels use
(``data/labels.py``, ``forward_return_panel``): a signal of bar t is traded at the open of the
ticker's next bar, so its horizon-h return is ``log(open[t+1+h] / open[t+1])``, counted in the
ticker's own bars; NaN where the ticker has no bar t+1+h yet.  Nothing at or before t's close is
earned and nothing after t+1+h is read.

The figures (``horizon`` H: the model's label horizon; ``quantiles`` Q, 5):

* **quantiles**: on each date with at least Q names, the names (rows with a score and a horizon-H
  return) are sorted by score; a name at 0-based position a of n (tied scores take the lowest
  position of their tie) is in quantile ``max(1, ceil(Q * a / (n - 1)))``: quantile k holds the
  names above the cut at position ``(n - 1)(k - 1) / Q`` up to and with the one at
  ``(n - 1) k / Q`` (the cuts of the linearly interpolated sample quantiles, closed on the right).
  A quantile's mean return is the mean over dates of its names' mean *simple* horizon-H return
  (``exp(r) - 1``) that date; the **spread** is, per date, the top quantile's mean less the bottom
  one's, and its mean over those dates.
* **IC decay**: for h = 1..20, the mean over dates of the per-date Spearman correlation of score and
  horizon-h return (``signals.metrics.daily_ic``: at least 3 names, constant dates dropped); at
  h = H it is the evaluation's rank IC of the model.
* **rank IC by month**: the horizon-H daily rank ICs averaged per calendar month.
* **turnover** of the top and bottom quantiles: on each date whose previous date (in the segment's
  dates) had quantiles, the share of the quantile's names that were not in the same quantile on that
  previous date; and its mean over dates.

Everything is vectorised numpy/pandas.  Plots are drawn on their own Agg canvas (no backend is
chosen, pyplot is never imported) and written beside the report as PNGs, each in one step
(:func:`~alchemetric_ray.fsutil.atomic_write_bytes`).
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from alchemetric_ray.errors import EvaluationError
from alchemetric_ray.fsutil import atomic_write_bytes
from alchemetric_ray.signals import metrics as sm

if TYPE_CHECKING:
    from collections.abc import Iterable

    from matplotlib.figure import Figure

__all__ = ["PNGS", "TearSheet", "bar_opens", "forward_returns", "plot_figures", "quantile_codes", "tear_sheet",
           "write_pngs"]

QUANTILES = 5
MAX_HORIZON = 20
#: The tear sheet's plots, one PNG each, in the report's order.
PNGS = {"quantiles": "tearsheet_quantiles.png", "ic_decay": "tearsheet_ic_decay.png",
        "ic_month": "tearsheet_ic_month.png", "turnover": "tearsheet_turnover.png"}


@dataclass
class TearSheet:
    """The tear sheet's figures (:func:`tear_sheet`); :meth:`as_dict` is ``evaluation.json``'s
    ``tear_sheet``.  The per-date series the plots draw are kept beside them, not in the record."""

    horizon: int
    quantiles: int
    days: int  # dates with quantiles
    quantile_returns: list[dict[str, Any]]  # {"quantile", "mean", "days"}, bottom (1) to top
    spread: dict[str, Any]  # {"mean", "std", "days"}: top minus bottom, per date
    ic_decay: list[dict[str, Any]]  # {"horizon", "mean", "days"}, h = 1..max_horizon
    ic_by_month: list[dict[str, Any]]  # {"month": "YYYY-MM", "mean", "days"}
    turnover: dict[str, Any]  # {"top", "bottom", "days"}: mean shares of new names
    daily: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)  # what the plots draw

    def as_dict(self) -> dict[str, Any]:
        return {"horizon": self.horizon, "quantiles": self.quantiles, "days": self.days,
                "quantile_returns": self.quantile_returns, "spread": self.spread, "ic_decay": self.ic_decay,
                "ic_by_month": self.ic_by_month, "turnover": self.turnover, "pngs": list(PNGS.values())}


def _float(value: float) -> float | None:
    """A figure for the record: None where it is undefined (JSON has no NaN)."""
    return None if value is None or not math.isfinite(value) else float(value)


def bar_opens(bars: Iterable[tuple[str, pd.DataFrame]], tickers: Iterable[str], start: str) -> pd.DataFrame:
    """The ``opens`` :func:`tear_sheet` reads: every bar from ``start`` on of the named tickers in
    ``bars`` ((ticker, OHLCV frame) pairs, as a bars source yields them)."""
    wanted, first, parts = set(tickers), np.datetime64(pd.Timestamp(start), "ns"), []
    for ticker, frame in bars:
        if ticker not in wanted:
            continue
        dates = np.asarray(pd.to_datetime(frame["date"]).to_numpy(), dtype="datetime64[ns]")
        keep = dates >= first
        parts.append(pd.DataFrame({"date": dates[keep], "ticker": ticker,
                                   "open": frame["open"].to_numpy(dtype=np.float64)[keep]}))
    if not parts:
        return pd.DataFrame({"date": np.array([], dtype="datetime64[ns]"), "ticker": pd.Series([], dtype=object),
                             "open": np.array([], dtype=np.float64)})
    return pd.concat(parts, ignore_index=True)


def _columns(frame: Any, what: str, needed: tuple[str, ...]) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise EvaluationError(f"tear sheet: {what} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise EvaluationError(f"tear sheet: {what} lacks the column(s) {', '.join(missing)} "
                              f"(needs {', '.join(needed)})")


def _dates(values: Any, what: str) -> np.ndarray:
    try:
        with warnings.catch_warnings():  # pandas' note on guessing a format: the error below says it all
            warnings.simplefilter("ignore", UserWarning)
            return np.asarray(pd.to_datetime(values).to_numpy(), dtype="datetime64[ns]")
    except (ValueError, TypeError, OverflowError) as err:
        raise EvaluationError(f"tear sheet: the {what}' dates do not read as dates: "
                              f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None


def forward_returns(signals: pd.DataFrame, opens: pd.DataFrame, horizons: Iterable[int]) -> np.ndarray:
    """Per row of ``signals`` and per horizon h: ``log(open[t+1+h] / open[t+1])`` in the row's
    ticker's own bars (t: the row's bar), NaN where a bar is missing or an open is not positive.
    Shape (rows, horizons)."""
    horizons = list(horizons)
    table = pd.DataFrame({"date": _dates(opens["date"], "opens"),
                          "ticker": opens["ticker"].astype(str).to_numpy(),
                          "open": pd.to_numeric(opens["open"], errors="coerce").to_numpy(dtype=np.float64)})
    table = table.sort_values(["ticker", "date"], kind="stable").reset_index(drop=True)
    if table.duplicated(["ticker", "date"]).any():
        raise EvaluationError("tear sheet: the opens hold a (date, ticker) pair twice")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_open = np.where(table["open"].to_numpy() > 0, np.log(table["open"].to_numpy()), np.nan)
    code = pd.factorize(table["ticker"])[0]
    n = len(table)
    keys = pd.DataFrame({"date": _dates(signals["date"], "signals"),
                         "ticker": signals["ticker"].astype(str).to_numpy()})
    row = keys.merge(table[["date", "ticker"]].assign(row=np.arange(n)), on=["date", "ticker"], how="left")["row"]
    row = row.to_numpy(dtype=np.float64)  # NaN: the signal's bar is not among the opens
    found = np.isfinite(row)
    at = np.where(found, row, 0).astype(np.int64)
    out = np.full((len(keys), len(horizons)), np.nan)
    entry = at + 1
    for j, h in enumerate(horizons):
        exit_ = at + 1 + int(h)
        ok = found & (exit_ < n)
        ok[ok] &= code[exit_[ok]] == code[at[ok]]  # the exit bar is the same ticker's
        out[ok, j] = log_open[exit_[ok]] - log_open[entry[ok]]
    return out


def quantile_codes(score: np.ndarray, dcode: np.ndarray, n_dates: int, quantiles: int = QUANTILES) -> np.ndarray:
    """Each row's quantile 1..``quantiles`` among the rows of its date (``dcode``), 0 on a date with
    fewer than ``quantiles`` rows: the rule of the module docstring (0-based position a of n, ties at
    their lowest position, quantile ``max(1, ceil(quantiles * a / (n - 1)))``)."""
    size = len(score)
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((score, dcode))
    s, g = score[order], dcode[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(size), 0))
    pos = np.arange(size) - group_start
    new_run = new_group | np.r_[True, s[1:] != s[:-1]]
    lowest = pos[np.maximum.accumulate(np.where(new_run, np.arange(size), 0))]  # a tie's lowest position
    count = np.bincount(dcode, minlength=n_dates)[g]
    q = np.where(lowest == 0, 1, (quantiles * lowest + count - 2) // np.maximum(count - 1, 1))
    q = np.where(count >= quantiles, q, 0)
    out = np.empty(size, dtype=np.int64)
    out[order] = q
    return out


def _check(signals: Any, opens: Any, horizon: int, quantiles: int, max_horizon: int) -> None:
    _columns(signals, "signals", ("date", "ticker", "score"))
    _columns(opens, "opens", ("date", "ticker", "open"))
    for name, value, least in (("horizon", horizon, 1), ("quantiles", quantiles, 2), ("max_horizon", max_horizon, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise EvaluationError(f"tear sheet: {name} must be an integer >= {least}, got {value!r}")
    if signals.duplicated(["date", "ticker"]).any():
        raise EvaluationError("tear sheet: the signals hold a (date, ticker) pair twice; keep one row per pair")


def tear_sheet(signals: pd.DataFrame, opens: pd.DataFrame, *, horizon: int = 1, quantiles: int = QUANTILES,
               max_horizon: int = MAX_HORIZON) -> TearSheet:
    """The tear sheet's figures of ``signals`` (the module docstring defines each)."""
    _check(signals, opens, horizon, quantiles, max_horizon)
    score = pd.to_numeric(signals["score"], errors="coerce").to_numpy(dtype=np.float64)
    keep = np.isfinite(score)
    frame = pd.DataFrame({"date": _dates(signals["date"], "signals")[keep],
                          "ticker": signals["ticker"].astype(str).to_numpy()[keep], "score": score[keep]})
    horizons = sorted({*range(1, max_horizon + 1), horizon})
    fwd = forward_returns(frame, opens, horizons)
    decay, daily_ic = [], pd.Series(dtype=np.float64)
    for j, h in enumerate(horizons):
        ic = sm.daily_ic(frame.assign(fwd_ret=fwd[:, j]), rank=True)
        if h == horizon:
            daily_ic = ic
        if h <= max_horizon:
            decay.append({"horizon": h, "mean": _float(ic.mean()) if len(ic) else None, "days": len(ic)})
    own = fwd[:, horizons.index(horizon)]
    rows = frame[np.isfinite(own)].assign(ret=np.expm1(own[np.isfinite(own)])).reset_index(drop=True)
    returns, spread, turnover = _quantile_figures(rows, quantiles)
    months = daily_ic.groupby(daily_ic.index.to_period("M")).agg(["mean", "count"]) if len(daily_ic) else None
    by_month = [] if months is None else [{"month": str(p), "mean": _float(m), "days": int(c)}
                                          for p, m, c in zip(months.index, months["mean"], months["count"])]
    means = returns.mean(axis=0)
    sheet = TearSheet(
        horizon=horizon, quantiles=quantiles, days=len(returns),
        quantile_returns=[{"quantile": k + 1, "mean": _float(means.iloc[k]) if len(returns) else None,
                           "days": int(returns.iloc[:, k].notna().sum())} for k in range(quantiles)],
        spread={"mean": _float(spread.mean()) if len(spread) else None,
                "std": _float(spread.std(ddof=1)) if len(spread) > 1 else None, "days": len(spread)},
        ic_decay=decay, ic_by_month=by_month,
        turnover={"top": _float(turnover["top"].mean()) if len(turnover) else None,
                  "bottom": _float(turnover["bottom"].mean()) if len(turnover) else None, "days": len(turnover)})
    sheet.daily = {"quantile_returns": returns, "spread": spread.to_frame("spread"), "rank_ic": daily_ic.to_frame(),
                   "turnover": turnover}
    return sheet


def _quantile_figures(rows: pd.DataFrame, quantiles: int) -> tuple[pd.DataFrame, pd.Series, pd.DataFrame]:
    """Per date with quantiles: each quantile's mean simple return (a column per quantile), the
    top-minus-bottom spread, and the top and bottom quantiles' turnover (from the second such date
    whose previous date had quantiles)."""
    dcode, dates = pd.factorize(rows["date"], sort=True)
    dates = np.asarray(dates, dtype="datetime64[ns]")
    tcode, tickers = pd.factorize(rows["ticker"])
    n_dates = len(dates)
    q = quantile_codes(rows["score"].to_numpy(), dcode, n_dates, quantiles)
    slot = dcode * (quantiles + 1) + q
    sums = np.bincount(slot, rows["ret"].to_numpy(), n_dates * (quantiles + 1)).reshape(n_dates, quantiles + 1)
    counts = np.bincount(slot, minlength=n_dates * (quantiles + 1)).reshape(n_dates, quantiles + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)[:, 1:]
    has = counts[:, 1:].sum(axis=1) > 0
    index = pd.DatetimeIndex(dates[has], name="date")
    returns = pd.DataFrame(mean[has], index=index, columns=range(1, quantiles + 1))
    spread = pd.Series(mean[has, quantiles - 1] - mean[has, 0], index=index, name="spread")
    shares = {}
    for name, k in (("top", quantiles), ("bottom", 1)):
        member = np.zeros((n_dates, len(tickers)), dtype=bool)  # date x name: in quantile k that date
        member[dcode[q == k], tcode[q == k]] = True
        now, before = member[1:], member[:-1]
        with np.errstate(invalid="ignore", divide="ignore"):
            shares[name] = (now & ~before).sum(axis=1) / now.sum(axis=1)
    both = has[1:] & has[:-1]  # a date and its previous date both have quantiles
    turnover = pd.DataFrame({"top": shares["top"][both], "bottom": shares["bottom"][both]},
                            index=pd.DatetimeIndex(dates[1:][both], name="date"))
    return returns, spread, turnover


def _figure(width: float = 8.0, height: float = 4.0) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)  # its own canvas: no backend is chosen, pyplot is not imported
    return fig


def _none(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _plot_quantiles(sheet: TearSheet) -> Figure:
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    labels = [f"Q{r['quantile']}" for r in sheet.quantile_returns] + ["top - bottom"]
    values = [_none(r["mean"]) * 1e4 for r in sheet.quantile_returns] + [_none(sheet.spread["mean"]) * 1e4]
    colors = ["tab:blue"] * len(sheet.quantile_returns) + ["tab:orange"]
    ax.bar(labels, values, color=colors)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"mean {sheet.horizon}-bar return (bp)")
    ax.set_title(f"mean forward return by score quantile ({sheet.days} dates)")
    ax.grid(axis="y", alpha=0.3)
    return fig


def _plot_ic_decay(sheet: TearSheet) -> Figure:
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    horizons = [r["horizon"] for r in sheet.ic_decay]
    ax.bar(horizons, [_none(r["mean"]) for r in sheet.ic_decay], color="tab:blue")
    ax.set_xticks(horizons)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("horizon h (bars; the return from the open of t+1 to the open of t+1+h)")
    ax.set_ylabel("mean rank IC")
    ax.set_title("IC decay")
    ax.grid(axis="y", alpha=0.3)
    return fig


def _plot_ic_month(sheet: TearSheet) -> Figure:
    fig = _figure(max(8.0, 0.35 * len(sheet.ic_by_month)), 4.0)
    ax = fig.add_subplot(1, 1, 1)
    values = [_none(r["mean"]) for r in sheet.ic_by_month]
    ax.bar([r["month"] for r in sheet.ic_by_month], values,
           color=["tab:green" if v >= 0 else "tab:red" for v in values])
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"mean rank IC ({sheet.horizon}-bar)")
    ax.set_title("rank IC by month")
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _plot_turnover(sheet: TearSheet) -> Figure:
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    turnover = sheet.daily.get("turnover")
    if turnover is not None and len(turnover):
        for name, color in (("top", "tab:green"), ("bottom", "tab:red")):
            ax.plot(turnover.index, turnover[name], color=color, alpha=0.25, linewidth=0.8)
            ax.plot(turnover.index, turnover[name].rolling(20, min_periods=5).mean(), color=color, linewidth=1.8,
                    label=f"{name} quantile, 20-date mean (overall {_none(sheet.turnover[name]):.2f})")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_ylim(0.0, 1.05)
    ax.set_ylabel("share of names new to the quantile")
    ax.set_title("turnover of the top and bottom quantiles")
    ax.grid(alpha=0.3)
    return fig


def plot_figures(sheet: TearSheet) -> dict[str, Figure]:
    """The tear sheet's plots, one Figure each (keys: those of :data:`PNGS`), each on its own Agg canvas."""
    figures = {"quantiles": _plot_quantiles(sheet), "ic_decay": _plot_ic_decay(sheet),
               "ic_month": _plot_ic_month(sheet), "turnover": _plot_turnover(sheet)}
    for fig in figures.values():
        fig.tight_layout()
    return figures


def write_pngs(sheet: TearSheet, folder: str | Path) -> list[Path]:
    """Every plot of :func:`plot_figures` as its PNG (:data:`PNGS`) in ``folder``, each written in one step."""
    written = []
    for key, fig in plot_figures(sheet).items():
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        path = Path(folder) / PNGS[key]
        atomic_write_bytes(path, buffer.getvalue())
        written.append(path)
    return written
