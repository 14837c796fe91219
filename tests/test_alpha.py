"""The research feature sets (issue 42 item 1): the Panel's windowed primitives, Alpha158 and Alpha360,
each against a direct slow computation (a plain per-ticker loop over windows, written here), on a
small synthetic market with edge cases and on hand-computed values; no look-ahead; a build and a
training epoch on them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.data.features import Panel


def _series(lengths: list[int], seed: int) -> tuple[list[np.ndarray], Panel]:
    """Per-ticker series with ties, a flat stretch and a missing value, and their panel."""
    rng = np.random.default_rng(seed)
    xs = []
    for j, n in enumerate(lengths):
        x = np.round(100 + np.cumsum(rng.normal(0, 1, n)), 1)  # rounded: ties inside windows
        if n > 40:
            x[20:33] = x[20]  # a flat stretch longer than a 10-bar window
        if j == 1 and n > 50:
            x[45] = np.nan  # a hole: every window holding it is NaN
        xs.append(x)
    cols = {c: np.concatenate(xs) if xs else np.empty(0) for c in ("open", "high", "low", "close", "volume")}
    return xs, Panel(cols, np.array(lengths))


LENGTHS = [70, 64, 3, 12, 1, 40]


def _slow(xs: list[np.ndarray], w: int, fn, *others: list[np.ndarray]) -> np.ndarray:
    """fn(window, *other windows) for each bar of each ticker, NaN before a full window or with a NaN in it."""
    out = []
    for j, x in enumerate(xs):
        for i in range(len(x)):
            wins = [x[i - w + 1: i + 1]] + [o[j][i - w + 1: i + 1] for o in others]
            if i < w - 1 or any(np.isnan(v).any() for v in wins):
                out.append(np.nan)
            else:
                out.append(fn(*wins))
    return np.array(out, dtype=np.float64)


def _close(a: np.ndarray, b: np.ndarray, tol: float = 1e-9) -> None:
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a[~np.isnan(b)], b[~np.isnan(b)], rtol=tol, atol=tol)


def _fit(v: np.ndarray) -> tuple[float, float, float]:
    """slope, R^2 and the last bar's residual of the least-squares line of v against 1..len(v)."""
    t = np.arange(1, len(v) + 1, dtype=float)
    if v.max() == v.min():
        return 0.0, 0.0, 0.0
    slope, intercept = np.polyfit(t, v, 1)
    fitted = slope * t + intercept
    rsq = 1 - ((v - fitted) ** 2).sum() / ((v - v.mean()) ** 2).sum()
    return slope, rsq, v[-1] - fitted[-1]


@pytest.mark.parametrize("w", [1, 2, 5, 10])
def test_window_primitives_equal_a_per_ticker_loop(w):
    xs, p = _series(LENGTHS, 7)
    ys, _ = _series(LENGTHS, 8)
    x, y = np.concatenate(xs), np.concatenate(ys)
    _close(p.rolling_sum(x, w), _slow(xs, w, np.sum))
    _close(p.rolling_max(x, w), _slow(xs, w, np.max))
    _close(p.rolling_min(x, w), _slow(xs, w, np.min))
    _close(p.rolling_argmax(x, w), _slow(xs, w, lambda v: float(np.argmax(v) + 1)))
    _close(p.rolling_argmin(x, w), _slow(xs, w, lambda v: float(np.argmin(v) + 1)))
    q = p.rolling_quantile(x, w, [0.2, 0.8])
    _close(q[:, 0], _slow(xs, w, lambda v: np.quantile(v, 0.2)))
    _close(q[:, 1], _slow(xs, w, lambda v: np.quantile(v, 0.8)))
    _close(p.rolling_rank(x, w), _slow(xs, w, lambda v: pd.Series(v).rank(pct=True).iloc[-1]))

    def corr(a, b):
        return 0.0 if a.max() == a.min() or b.max() == b.min() else np.corrcoef(a, b)[0, 1]

    _close(p.rolling_corr(x, y, w), _slow(xs, w, corr, ys))
    trend = p.rolling_trend(x, w)
    for k in range(3):
        _close(trend[:, k], _slow(xs, w, lambda v, k=k: _fit(v)[k]), tol=1e-7)


def test_windows_never_cross_a_ticker_boundary():
    xs, p = _series([30, 30], 3)
    x = np.concatenate(xs)
    m = p.rolling_max(x, 5)
    assert np.isnan(m[30:34]).all() and np.isfinite(m[34:]).all()
    assert np.isnan(p.rolling_sum(x, 5)[30:34]).all()


def test_known_primitive_values():
    p = Panel({c: np.zeros(6) for c in ("open", "high", "low", "close", "volume")}, np.array([6]))
    x = np.array([3.0, 9.0, 1.0, 9.0, 4.0, 2.0])
    assert p.rolling_argmax(x, 5)[4] == 2.0 and p.rolling_argmax(x, 5)[5] == 1.0  # the first 9 of the window
    assert p.rolling_argmin(x, 3)[5] == 3.0  # 2 is the current bar
    assert p.rolling_rank(x, 4)[3] == pytest.approx((2 + 1.5) / 4)  # 9 ties with 9: average rank 3.5
    line = np.arange(6, dtype=float) * 2 + 1
    slope, rsq, resid = p.rolling_trend(line, 4)[5]
    assert slope == pytest.approx(2.0) and rsq == pytest.approx(1.0) and resid == pytest.approx(0.0, abs=1e-12)
    assert p.rolling_corr(x, -x, 3)[4] == pytest.approx(-1.0)
