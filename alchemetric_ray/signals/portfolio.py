"""The books a signal trades and their P&L: the equal-weight, dollar-neutral top-minus-bottom
quantile portfolio (:func:`long_short`), per-name positions (:func:`position_returns`; the quantile
positions of a cross-sectional score, :func:`quantile_positions`), their hit rate, and the one P&L
computation both books share (costs on turnover, compounded equity, drawdown, Sharpe ratio).

The signals frame and its conventions are ``signals/panel.py``'s.  Simple returns are
``exp(fwd_ret) - 1``: weights multiply simple returns, never log returns.  Everything is vectorised
numpy (``bincount``/``lexsort``), no per-date Python loop, and deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from alchemetric_ray.data.cross_section import LONG_SHORT_MIN_NAMES, long_short_weights, quantile_legs
from alchemetric_ray.signals.panel import prepare_panel

__all__ = [
    "PortfolioStats",
    "long_short",
    "position_returns",
    "hit_rate",
]

_PORTFOLIO_COLUMNS = ["date", "gross", "cost", "net", "equity"]


@dataclass
class PortfolioStats:
    """P&L summary of a rebalanced portfolio; one "period" is one rebalance (``n_days`` of them).

    * ``annual_return`` = mean net period return * periods per year (arithmetic, so that
      ``sharpe == annual_return / annual_vol``); the compounded path is ``daily["equity"]``.
    * ``annual_vol`` = std (ddof=1) of net period returns * sqrt(periods per year).
    * ``sharpe`` = mean / std of net period returns * sqrt(periods per year); 0.0 when the returns
      are identically zero, NaN when undefined (fewer than 2 periods, or zero std with nonzero mean).
    * ``max_drawdown`` is a POSITIVE fraction: 0.23 means the compounded net equity (starting at 1)
      fell 23% below its running peak at worst.  0.0 when it never fell.
    * ``turnover`` = mean over periods of sum_i |w_t,i - w_t-1,i| (the first period pays the entry
      from flat; the final exit after the last period is not charged).
    * ``hit_rate`` = share of *active* periods (nonzero exposure or nonzero turnover) with net return
      > 0; NaN when the strategy never traded (a flat book neither wins nor loses).
    * ``periods_per_year`` = annualization / horizon.
    * ``daily``: one row per period, columns ``date`` (decision date t; the position is held from the
      open of t+1), ``gross``, ``cost``, ``net``, ``equity`` (compounded net, starting from 1).
    """

    annual_return: float
    annual_vol: float
    sharpe: float
    max_drawdown: float
    turnover: float
    hit_rate: float
    n_days: int
    daily: pd.DataFrame = field(repr=False)
    periods_per_year: float = 252.0


def _check_horizon(horizon: int) -> int:
    if int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon}")
    return int(horizon)


def _rebalance_grid(n_dates: int, horizon: int) -> np.ndarray:
    """Boolean mask over candidate dates: every ``horizon``-th one, starting with the first."""
    return (np.arange(n_dates) % horizon) == 0


def _turnover(p: np.ndarray, j: np.ndarray, w: np.ndarray, P: int) -> np.ndarray:
    """Per period, turnover_t = sum_i |w_t,i - w_{t-1},i| with missing weights = 0, from the nonzero
    entries only: a name's weight is paid on entry and on every change, and its exit at the next
    rebalance where it is flat or absent (none after the last period)."""
    nz = w != 0
    pp, jj, ww = p[nz], j[nz], w[nz]
    order = np.lexsort((pp, jj))
    pp, jj, ww = pp[order], jj[order], ww[order]
    m = pp.size
    prev_w = np.zeros(m)
    has_next = np.zeros(m, dtype=bool)
    if m > 1:
        linked = (jj[1:] == jj[:-1]) & (pp[1:] == pp[:-1] + 1)  # entry i+1 continues entry i
        prev_w[1:] = np.where(linked, ww[:-1], 0.0)
        has_next[:-1] = linked
    turnover = np.bincount(pp, np.abs(ww - prev_w), P) if P else np.zeros(0)
    exit_ = ~has_next & (pp + 1 < P)  # position closed at the next rebalance (name flat/absent there)
    if exit_.any():
        turnover += np.bincount(pp[exit_] + 1, np.abs(ww[exit_]), P)
    return turnover


def _annualised(net: np.ndarray, periods_per_year: float) -> tuple[float, float, float]:
    """(annual return, annual volatility, Sharpe ratio) of the net period returns, as
    :class:`PortfolioStats` defines them."""
    P = int(net.size)
    nan = float("nan")
    if P >= 2:
        mu = float(net.mean())
        sd = float(net.std(ddof=1))
        annual_return = mu * periods_per_year
        annual_vol = sd * math.sqrt(periods_per_year)
        if sd > 0:
            sharpe = mu / sd * math.sqrt(periods_per_year)
        else:
            sharpe = 0.0 if mu == 0 else nan
    else:
        annual_return = float(net.mean()) * periods_per_year if P else nan
        annual_vol = sharpe = nan
    return annual_return, annual_vol, sharpe


def _portfolio(  # noqa: PLR0913 (the panel's arrays, a kernel)
    p: np.ndarray,
    j: np.ndarray,
    w: np.ndarray,
    simple_ret: np.ndarray,
    period_dates: np.ndarray,
    *,
    cost_bps: float,
    periods_per_year: float,
) -> PortfolioStats:
    """P&L of weights ``w`` on rows (period ``p``, ticker code ``j``), one row per (p, j)."""
    P = int(period_dates.size)
    gross = np.bincount(p, w * simple_ret, P) if P else np.zeros(0)
    exposure = np.bincount(p, np.abs(w), P) if P else np.zeros(0)
    turnover = _turnover(p, j, w, P)

    cost = float(cost_bps) * 1e-4 * turnover
    net = gross - cost
    equity = np.cumprod(1.0 + net)
    daily = pd.DataFrame({"date": period_dates, "gross": gross, "cost": cost, "net": net, "equity": equity})

    annual_return, annual_vol, sharpe = _annualised(net, periods_per_year)
    nan = float("nan")
    if P:
        peak = np.maximum.accumulate(np.concatenate(([1.0], equity)))
        max_dd = float(np.max(1.0 - np.concatenate(([1.0], equity)) / peak))
        active = (exposure > 0) | (turnover > 0)
        hit = float((net[active] > 0).mean()) if active.any() else nan
        mean_turnover = float(turnover.mean())
    else:
        max_dd = hit = mean_turnover = nan
    return PortfolioStats(
        annual_return=float(annual_return),
        annual_vol=float(annual_vol),
        sharpe=float(sharpe),
        max_drawdown=max_dd,
        turnover=mean_turnover,
        hit_rate=hit,
        n_days=P,
        daily=daily,
        periods_per_year=float(periods_per_year),
    )


def _empty_portfolio(periods_per_year: float) -> PortfolioStats:
    nan = float("nan")
    daily = pd.DataFrame({c: pd.Series(dtype=np.float64) for c in _PORTFOLIO_COLUMNS})
    return PortfolioStats(nan, nan, nan, nan, nan, nan, 0, daily, float(periods_per_year))


def quantile_positions(score: np.ndarray, dates: np.ndarray, quantile: float) -> np.ndarray:
    """Positions from a score on a cross-sectional scale (a regression target's): +1 for each date's
    top ``quantile`` of stocks, -1 for its bottom one, 0 between (:func:`quantile_legs`)."""
    _, code = np.unique(np.asarray(dates), return_inverse=True)
    is_long, is_short = quantile_legs(np.asarray(score, dtype=np.float64), code, int(code.max(initial=-1)) + 1,
                                      quantile)
    return np.where(is_long & ~is_short, 1, np.where(is_short & ~is_long, -1, 0)).astype(np.int8)


def long_short(
    signals: pd.DataFrame,
    *,
    quantile: float = 0.2,
    cost_bps: float = 5.0,
    horizon: int = 1,
    annualization: int = 252,
    min_names: int = LONG_SHORT_MIN_NAMES,
) -> PortfolioStats:
    """Equal-weight, dollar-neutral top-minus-bottom quantile portfolio.

    Each rebalance date t with n names (NaN rows dropped; dates with n < ``min_names`` are skipped
    entirely, as if absent): k = max(1, floor(quantile * n)); rank the scores (ties share their
    average rank r); LONG the names with r >= n - k + 1, SHORT those with r <= k.  A tie group that
    straddles a boundary is in or out as a whole, by its average rank, so the result never depends on
    row order.  If either leg is empty (e.g. a constant score: every name ranks (n+1)/2) the book is
    flat that date: zero weights, zero return; closing an open book still pays its turnover.

    Gross-exposure convention: GROSS 1, dollar neutral -- each long weighs +0.5 / n_long and each
    short -0.5 / n_short (long leg sums to +0.5, short leg to -0.5).  The period return is
    sum_i w_i * (exp(fwd_ret_i) - 1): decided at t, held from the open of t+1 (``fwd_ret`` already
    starts there).

    Horizon h > 1: NON-OVERLAPPING rebalancing -- only every h-th kept date (the first, the
    (h+1)-th, ...) is a period, each holding for its h-day ``fwd_ret``; periods per year =
    annualization / h.  Nothing is counted twice.

    Costs: ``cost_bps`` per unit of turnover, turnover_t = sum_i |w_t,i - w_{t-1},i| over the
    previous period's book (missing = 0).  Max drawdown is a positive fraction.  See
    :class:`PortfolioStats` for every field.
    """
    if not 0.0 < quantile <= 0.5:
        raise ValueError(f"quantile must lie in (0, 0.5], got {quantile}")
    if min_names < 2:
        raise ValueError(f"min_names must be >= 2 for a long and a short leg, got {min_names}")
    horizon = _check_horizon(horizon)
    periods_per_year = annualization / horizon
    panel = prepare_panel(signals)
    date_code, dates, ticker_code = panel.dcode, panel.dates, panel.tcode

    names_on_date = np.bincount(date_code, minlength=len(dates))
    kept_dates = np.flatnonzero(names_on_date >= min_names)
    rebalance_dates = kept_dates[_rebalance_grid(kept_dates.size, horizon)]
    period_of_date = np.full(len(dates), -1, dtype=np.int64)
    period_of_date[rebalance_dates] = np.arange(rebalance_dates.size)

    row_period = period_of_date[date_code]
    in_a_period = row_period >= 0
    period = row_period[in_a_period]  # from here on, one entry per row held in some period
    ticker = ticker_code[in_a_period]
    score = panel.score[in_a_period]
    simple_return = np.expm1(panel.fwd_ret[in_a_period])
    n_periods = int(rebalance_dates.size)
    if n_periods == 0:
        return _empty_portfolio(periods_per_year)

    weight = long_short_weights(score, period, n_periods, quantile, min_names)
    return _portfolio(period, ticker, weight, simple_return, dates[rebalance_dates], cost_bps=cost_bps,
                      periods_per_year=periods_per_year)


def position_returns(
    signals: pd.DataFrame,
    *,
    cost_bps: float = 5.0,
    horizon: int = 1,
    annualization: int = 252,
) -> PortfolioStats:
    """P&L of per-name positions (single names, or too few names for a cross-section; also the
    momentum and buy-and-hold baselines).

    Uses the ``position`` column (-1/0/+1, any finite float is a signed size); without it the
    position is sign(score).  On each rebalance date with n names present, weight_i =
    position_i / n (an equal-weight average over the names: gross exposure = share of names with a
    position, at most 1; one name -> its position).  Period return sum_i w_i * (exp(fwd_ret_i) - 1),
    held from the open of t+1.  Costs: ``cost_bps`` per unit of turnover sum_i |w_t,i - w_{t-1},i|.
    Horizon h > 1: non-overlapping, every h-th date, periods per year = annualization / h (as in
    :func:`long_short`).  See :class:`PortfolioStats` for every field.
    """
    horizon = _check_horizon(horizon)
    periods_per_year = annualization / horizon
    panel = prepare_panel(signals, need_position=True)
    date_code, dates, ticker_code = panel.dcode, panel.dates, panel.tcode
    if dates.size == 0:
        return _empty_portfolio(periods_per_year)
    rebalance_dates = np.flatnonzero(_rebalance_grid(len(dates), horizon))
    period_of_date = np.full(len(dates), -1, dtype=np.int64)
    period_of_date[rebalance_dates] = np.arange(rebalance_dates.size)
    row_period = period_of_date[date_code]
    in_a_period = row_period >= 0
    period = row_period[in_a_period]
    n_names = np.bincount(period, minlength=int(rebalance_dates.size)).astype(np.float64)
    position = cast(np.ndarray, panel.position)  # cast: need_position=True fills it
    weight = position[in_a_period] / n_names[period]
    simple_return = np.expm1(panel.fwd_ret[in_a_period])
    return _portfolio(period, ticker_code[in_a_period], weight, simple_return, dates[rebalance_dates],
                      cost_bps=cost_bps, periods_per_year=periods_per_year)


def hit_rate(signals: pd.DataFrame) -> float:
    """Share of rows with a nonzero position whose sign matches sign(fwd_ret).

    Uses ``position`` (sign(score) without it); a zero return counts as a miss; NaN rows are dropped;
    NaN when no row has a position.
    """
    pn = prepare_panel(signals, need_position=True)
    position = cast(np.ndarray, pn.position)  # cast: need_position=True fills it
    active = position != 0
    if not active.any():
        return float("nan")
    return float(np.mean(np.sign(position[active]) == np.sign(pn.fwd_ret[active])))
