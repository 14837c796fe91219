"""The research feature sets (issue 42 item 1): the Panel's windowed primitives, Alpha158 and Alpha360,
each against a direct slow computation (a plain per-ticker loop over windows, written here), on a
small synthetic market with edge cases and on hand-computed values; no look-ahead; a build and a
training epoch on them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import percentileofscore

from alchemetric_ray.data import features as feat
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


# ---- Alpha158 against a direct slow computation ----------------------------------------------
def _ratio(a: float, b: float, neutral: float) -> float:
    if np.isnan(a) or np.isnan(b):
        return np.nan
    return neutral if abs(b) <= 1e-12 else a / b


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return 0.0 if a.max() == a.min() or b.max() == b.min() else float(np.corrcoef(a, b)[0, 1])


def slow_alpha158(bars: pd.DataFrame) -> pd.DataFrame:
    """Every Alpha158 feature of one ticker, bar by bar and window by window in plain Python."""
    o, h, lo, c, v = (bars[k].to_numpy(np.float64) for k in ("open", "high", "low", "close", "volume"))
    n = len(c)
    out: dict[str, list[float]] = {}
    for i in range(n):
        top, bottom, rng = np.maximum(o[i], c[i]), np.minimum(o[i], c[i]), h[i] - lo[i]  # NaN stays NaN
        row = {"kmid": (c[i] - o[i]) / o[i], "klen": rng / o[i], "kmid2": _ratio(c[i] - o[i], rng, 0.0),
               "kup": (h[i] - top) / o[i], "kup2": _ratio(h[i] - top, rng, 0.0), "klow": (bottom - lo[i]) / o[i],
               "klow2": _ratio(bottom - lo[i], rng, 0.0), "ksft": (2 * c[i] - h[i] - lo[i]) / o[i],
               "ksft2": _ratio(2 * c[i] - h[i] - lo[i], rng, 0.0), "open_0": o[i] / c[i], "high_0": h[i] / c[i],
               "low_0": lo[i] / c[i], "vwap_0": (h[i] + lo[i] + c[i]) / 3 / c[i]}
        for k, val in row.items():
            out.setdefault(f"alpha158_{k}", []).append(val)
    for d in (5, 10, 20, 30, 60):
        for i in range(n):
            row = {}
            cw, hw, lw, vw = (x[i - d + 1: i + 1] for x in (c, h, lo, v))
            cur = c[i]
            row["roc"] = c[i - d] / cur if i >= d else np.nan

            def good(*wins: np.ndarray) -> bool:
                return i >= d - 1 and not any(np.isnan(x).any() for x in wins)

            nan = np.nan
            if good(cw):
                t = np.arange(1, d + 1, dtype=float)
                if cw.max() == cw.min():
                    slope, rsq, resid = 0.0, 0.0, 0.0
                else:
                    slope, icpt = np.polyfit(t, cw, 1)
                    fit = slope * t + icpt
                    rsq = 1 - ((cw - fit) ** 2).sum() / ((cw - cw.mean()) ** 2).sum()
                    resid = cw[-1] - fit[-1]
                row.update(ma=cw.mean() / cur, std=cw.std(ddof=1) / cur, beta=slope / cur, rsqr=rsq, resi=resid / cur,
                           qtlu=np.quantile(cw, 0.8) / cur, qtld=np.quantile(cw, 0.2) / cur,
                           rank=percentileofscore(cw, cur, kind="rank") / 100)
            else:
                row.update(ma=nan, std=nan, beta=nan, rsqr=nan, resi=nan, qtlu=nan, qtld=nan, rank=nan)
            row["max"] = hw.max() / cur if good(hw) else nan
            row["min"] = lw.min() / cur if good(lw) else nan
            row["rsv"] = _ratio(cur - lw.min(), hw.max() - lw.min(), 0.5) if good(hw, lw) else nan
            row["imax"] = (int(np.argmax(hw)) + 1) / d if good(hw) else nan
            row["imin"] = (int(np.argmin(lw)) + 1) / d if good(lw) else nan
            row["imxd"] = (int(np.argmax(hw)) - int(np.argmin(lw))) / d if good(hw, lw) else nan
            row["corr"] = _corr(cw, np.log1p(vw)) if good(cw, vw) else nan
            row["vma"] = _ratio(vw.mean(), v[i], 1.0) if good(vw) else nan
            row["vstd"] = _ratio(vw.std(ddof=1), v[i], 0.0) if good(vw) else nan
            # the measures of bar-to-bar changes: the window's d changes need d + 1 bars
            okc = i >= d and not np.isnan(c[i - d: i + 1]).any()
            okv = i >= d and not np.isnan(v[i - d: i + 1]).any()
            cc, pc = c[i - d + 1: i + 1], c[max(i - d, 0): i]
            vv, pv = v[i - d + 1: i + 1], v[max(i - d, 0): i]
            ch, vch = (cc - pc, vv - pv) if i >= d else (np.zeros(d), np.zeros(d))
            moves, vmoves = np.abs(ch).sum(), np.abs(vch).sum()
            if okc and okv:
                vol_ratio = np.array([_ratio(a, b, 1.0) for a, b in zip(vv, pv)])
                weighted = np.abs(cc / pc - 1) * vv
                row.update(cord=_corr(cc / pc, np.log(vol_ratio + 1)),
                           wvma=_ratio(weighted.std(ddof=1), weighted.mean(), 0.0))
            else:
                row.update(cord=nan, wvma=nan)
            if okc:
                row.update(cntp=np.mean(ch > 0), cntn=np.mean(ch < 0), cntd=np.mean(ch > 0) - np.mean(ch < 0),
                           sump=_ratio(ch[ch > 0].sum(), moves, 0.5), sumn=_ratio(-ch[ch < 0].sum(), moves, 0.5),
                           sumd=_ratio(ch[ch > 0].sum() + ch[ch < 0].sum(), moves, 0.0))
            else:
                row.update(cntp=nan, cntn=nan, cntd=nan, sump=nan, sumn=nan, sumd=nan)
            if okv:
                row.update(vsump=_ratio(vch[vch > 0].sum(), vmoves, 0.5),
                           vsumn=_ratio(-vch[vch < 0].sum(), vmoves, 0.5),
                           vsumd=_ratio(vch[vch > 0].sum() + vch[vch < 0].sum(), vmoves, 0.0))
            else:
                row.update(vsump=nan, vsumn=nan, vsumd=nan)
            for k, val in row.items():
                out.setdefault(f"alpha158_{k}_{d}", []).append(val)
    return pd.DataFrame(out, index=bars.index)


def _walk(rng: np.random.Generator, n: int) -> pd.DataFrame:
    close = 50 * np.exp(np.cumsum(0.015 * rng.standard_normal(n)))
    open_ = close * np.exp(0.003 * rng.standard_normal(n))
    high = np.maximum(open_, close) * np.exp(np.abs(0.01 * rng.standard_normal(n)))
    low = np.minimum(open_, close) * np.exp(-np.abs(0.01 * rng.standard_normal(n)))
    volume = np.exp(12 + 0.4 * rng.standard_normal(n)).round()
    return pd.DataFrame({"date": pd.bdate_range("2015-01-02", periods=n), "open": open_, "high": high, "low": low,
                         "close": close, "volume": volume})


def small_market() -> list[tuple[str, pd.DataFrame]]:
    """Four tickers: a plain walk; a dead stretch (one price, high = low, zero volume, then constant volume);
    a missing close; one shorter than the longest window."""
    rng = np.random.default_rng(42)
    plain = _walk(rng, 130)
    flat = _walk(rng, 140)
    flat.loc[40:110, ["open", "high", "low", "close"]] = 40.0
    flat.loc[40:75, "volume"] = 0.0
    flat.loc[76:110, "volume"] = 800.0
    hole = _walk(rng, 120)
    hole.loc[70, "close"] = np.nan
    short = _walk(rng, 45)
    return [("PLAIN", plain), ("FLAT", flat), ("HOLE", hole), ("SHORT", short)]


def test_alpha158_is_the_published_158_and_named_in_one_scheme():
    names = feat.resolve_feature_names(None, "alpha158")
    assert len(names) == 158 and len(set(names)) == 158
    assert all(n.startswith("alpha158_") and n == n.lower() and n.isascii() for n in names)
    assert feat.warmup_bars(names) == 60 and feat.FEATURES.keys().isdisjoint(names)
    families = {n.removeprefix("alpha158_").rsplit("_", 1)[0] for n in names if n.rsplit("_", 1)[1].isdigit()}
    assert len(families) == 29 + 4  # the 29 rolling families and open/high/low/vwap of the current bar


def test_alpha158_equals_a_slow_per_ticker_computation():
    frames = small_market()
    names = feat.resolve_feature_names(None, "alpha158")
    values, _ = feat.feature_matrix(feat.Panel.from_frames([f for _, f in frames]), names)
    start = 0
    for ticker, frame in frames:
        got = pd.DataFrame(values[start: start + len(frame)], columns=names)
        start += len(frame)
        want = slow_alpha158(frame)[names]
        for name in names:
            a, b = got[name].to_numpy(), want[name].to_numpy()
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"{ticker} {name}")
            np.testing.assert_allclose(a[~np.isnan(b)], b[~np.isnan(b)], rtol=1e-7, atol=1e-9,
                                       err_msg=f"{ticker} {name}")
    assert np.isnan(values[:, names.index("alpha158_ma_60")][-45:]).all()  # SHORT never fills a 60-bar window


def test_alpha158_known_values():
    n = 70
    close = 100.0 + np.arange(n)  # a linear price
    bars = pd.DataFrame({"date": pd.bdate_range("2020-01-01", periods=n), "open": close - 0.5, "high": close + 1,
                         "low": close - 1, "close": close, "volume": 1000.0 + np.arange(n)})
    bars.loc[3, ["open", "high", "low", "close"]] = [10.0, 12.0, 9.0, 11.0]
    bars.loc[64, "high"] = 500.0  # the highest high, 4 bars before the last of a 10-bar window ending at 68
    names = feat.resolve_feature_names(None, "alpha158")
    v, _ = feat.compute_features(bars, names)
    kbar = v.loc[3]
    assert kbar["alpha158_kmid"] == pytest.approx(0.1) and kbar["alpha158_klen"] == pytest.approx(0.3)
    assert kbar["alpha158_kmid2"] == pytest.approx(1 / 3) and kbar["alpha158_kup"] == pytest.approx(0.1)
    assert kbar["alpha158_klow2"] == pytest.approx(1 / 3) and kbar["alpha158_ksft"] == pytest.approx(0.1)
    assert kbar["alpha158_vwap_0"] == pytest.approx((12 + 9 + 11) / 3 / 11)
    t = 40
    assert v.loc[t, "alpha158_roc_5"] == pytest.approx((close[t] - 5) / close[t])
    assert v.loc[t, "alpha158_ma_5"] == pytest.approx((close[t] - 2) / close[t])
    assert v.loc[t, "alpha158_beta_20"] == pytest.approx(1 / close[t])
    assert v.loc[t, "alpha158_rsqr_20"] == pytest.approx(1.0)
    assert v.loc[t, "alpha158_resi_20"] == pytest.approx(0, abs=1e-12)
    assert v.loc[t, "alpha158_rank_10"] == 1.0 and v.loc[t, "alpha158_cntp_10"] == 1.0
    assert v.loc[t, "alpha158_sump_5"] == 1.0 and v.loc[t, "alpha158_sumd_5"] == 1.0
    assert v.loc[t, "alpha158_imax_10"] == 1.0 and v.loc[t, "alpha158_imin_10"] == pytest.approx(0.1)
    assert v.loc[68, "alpha158_imax_10"] == pytest.approx(6 / 10)  # bar 64 is the 6th of bars 59..68
    assert v.loc[68, "alpha158_max_10"] == pytest.approx(500.0 / close[68])
    assert v.loc[t, "alpha158_corr_20"] == pytest.approx(1.0, abs=1e-4)  # close and log volume both rise
    assert np.isnan(v.loc[58, "alpha158_roc_60"]) and np.isnan(v.loc[59, "alpha158_roc_60"])
    assert np.isfinite(v.loc[60, "alpha158_roc_60"]) and np.isfinite(v.loc[59, "alpha158_ma_60"])


def test_alpha158_neutral_values_on_a_dead_stretch():
    frame = dict(small_market())["FLAT"]
    names = feat.resolve_feature_names(None, "alpha158")
    v, bad = feat.compute_features(frame, names)
    assert np.isfinite(v.iloc[60:].to_numpy()).all() and bad == 0
    row = v.loc[105]  # 20+ bars of one price and one volume
    assert row["alpha158_kmid2"] == 0.0 and row["alpha158_rsv_20"] == 0.5 and row["alpha158_sump_20"] == 0.5
    assert row["alpha158_sumd_20"] == 0.0 and row["alpha158_corr_20"] == 0.0 and row["alpha158_rsqr_20"] == 0.0
    assert row["alpha158_std_20"] == 0.0 and row["alpha158_vsump_20"] == 0.5 and row["alpha158_wvma_20"] == 0.0
    assert v.loc[70, "alpha158_vma_20"] == 1.0 and v.loc[70, "alpha158_vstd_20"] == 0.0  # zero volume


# ---- Alpha360 -------------------------------------------------------------------------------
def test_alpha360_shape_and_values_on_a_known_series():
    n = 80
    bars = pd.DataFrame({"date": pd.bdate_range("2020-01-01", periods=n), "open": 1.0 + np.arange(n),
                         "high": 3.0 + np.arange(n), "low": 0.5 + np.arange(n), "close": 2.0 + np.arange(n),
                         "volume": 10.0 * (1 + np.arange(n))})
    names = feat.resolve_feature_names(None, "alpha360")
    assert len(names) == 360 and names[0] == "alpha360_close_0" and names[59] == "alpha360_close_59"
    assert [n.rsplit("_", 1)[0] for n in names[::60]] == [f"alpha360_{f}" for f in
                                                          ("close", "open", "high", "low", "vwap", "volume")]
    assert feat.warmup_bars(names) == 59
    v, bad = feat.compute_features(bars, names)
    assert v.shape == (n, 360) and bad == 0
    assert np.isnan(v.iloc[58]).any() and np.isfinite(v.iloc[59:].to_numpy()).all()
    t = 75
    for k in (0, 1, 30, 59):
        c = 2.0 + t
        assert v.loc[t, f"alpha360_close_{k}"] == pytest.approx((2.0 + t - k) / c)
        assert v.loc[t, f"alpha360_open_{k}"] == pytest.approx((1.0 + t - k) / c)
        assert v.loc[t, f"alpha360_high_{k}"] == pytest.approx((3.0 + t - k) / c)
        assert v.loc[t, f"alpha360_low_{k}"] == pytest.approx((0.5 + t - k) / c)
        assert v.loc[t, f"alpha360_vwap_{k}"] == pytest.approx((5.5 + 3 * (t - k)) / 3 / c)
        assert v.loc[t, f"alpha360_volume_{k}"] == pytest.approx((1 + t - k) / (1 + t))
    assert v.loc[t, "alpha360_close_0"] == 1.0 and v.loc[40, "alpha360_close_40"] == pytest.approx(2 / 42)


def test_alpha360_against_a_slow_loop_across_tickers():
    frames = small_market()
    names = feat.resolve_feature_names(None, "alpha360")
    values, _ = feat.feature_matrix(feat.Panel.from_frames([f for _, f in frames]), names)
    start = 0
    for _, frame in frames:
        got = values[start: start + len(frame)]
        start += len(frame)
        cols = {f: frame[f].to_numpy(float) for f in ("open", "high", "low", "close", "volume")}
        cols["vwap"] = (cols["high"] + cols["low"] + cols["close"]) / 3
        for j, name in enumerate(names):
            field, k = name.removeprefix("alpha360_").rsplit("_", 1)
            for i in range(len(frame)):
                past = cols[field][i - int(k)] if i >= int(k) else np.nan
                den = cols["volume" if field == "volume" else "close"][i]
                want = _ratio(past, den, 1.0) if field == "volume" else past / den
                assert (np.isnan(got[i, j]) and np.isnan(want)) or got[i, j] == pytest.approx(want, rel=1e-12), name


# ---- the sets' names, no look-ahead -----------------------------------------------------------
def test_names_select_from_their_set():
    assert feat.resolve_feature_names(None) == list(feat.DEFAULT_FEATURES)
    assert feat.resolve_feature_names(["alpha158_kmid", "alpha158_roc_5"], "alpha158") == \
        ["alpha158_kmid", "alpha158_roc_5"]
    with pytest.raises(feat.FeatureError, match="belongs to features.set=alpha158, but features.set=basic"):
        feat.resolve_feature_names(["ret_1", "alpha158_kmid"])
    with pytest.raises(feat.FeatureError, match="belongs to features.set=basic, but features.set=alpha360"):
        feat.resolve_feature_names(["ret_1"], "alpha360")
    with pytest.raises(feat.FeatureError, match="did you mean 'alpha158_roc_60'"):
        feat.resolve_feature_names(["alpha158_roc_6"], "alpha158")
    with pytest.raises(feat.FeatureError, match="unknown feature set 'alpha999'"):
        feat.resolve_feature_names(None, "alpha999")


# (the no-look-ahead test of every set, alpha158 and alpha360 included, is in tests/test_features.py)


# ---- a build and a training epoch on the set ----------------------------------------------------
@pytest.mark.slow
def test_an_alpha158_build_writes_158_columns_and_an_mlp_trains_an_epoch_on_them(ray_session, tmp_path):
    import json

    import pyarrow.parquet as pq

    import alchemetric_ray as ar
    from alchemetric_ray.cli import main

    market = ["data.source=synthetic", "data.synthetic_tickers=12", "data.synthetic_days=300", "data.seed=3"]
    out = tmp_path / "shards"
    # as Ray tasks over groups of about 1,000 bars (issue 41's distributed path), in the session's Ray
    assert main(["features", "--quiet", "--out", str(out), *market, "features.set=alpha158",
                 "features.distributed=true", "features.group_rows=1000"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    names = feat.resolve_feature_names(None, "alpha158")
    assert manifest["features"] == names and manifest["built_with"]["set"] == "alpha158"
    assert manifest["build"]["tasks"] > 1, manifest["build"]
    part = next((out / "split=train").glob("*.parquet"))
    columns = pq.read_schema(part).names
    assert [c for c in columns if c.startswith("alpha158_")] == names and not any(c.startswith("ret_") for c in columns)
    table = pq.read_table(out / "split=train").to_pandas()
    assert len(table) > 0 and np.isfinite(table[names].to_numpy()).all()

    cfg = ar.load_config(None, f"storage.path={tmp_path / 'results'}", f"storage.models_dir={tmp_path / 'models'}",
                         "storage.name=alpha158", "train.epochs=1", "model.hidden=8", "device.name=cpu")
    result = ar.train(cfg, data=out)  # features.set left at its default: the shards' own is adopted
    assert list(result.history["epoch"]) == [1] and np.isfinite(result.history["train_loss"]).all()
    assert result.model.features == names and result.config.features.set == "alpha158"


def test_shards_without_a_recorded_set_are_basic_and_a_run_asking_another_set_is_refused():
    from alchemetric_ray.config import RunConfig
    from alchemetric_ray.data.manifest import Manifest, reconcile_features
    from alchemetric_ray.errors import ShardError

    basic = list(feat.DEFAULT_FEATURES)
    old = Manifest(features=basic, label={}, splits={}, normalization={}, rows={}, built_with={"names": None})
    assert old.feature_settings()["set"] == "basic"
    with pytest.raises(ShardError, match="built with features.set=basic, but this run asks for features.set=alpha158"):
        reconcile_features(RunConfig.from_dict({"features": {"set": "alpha158"}}), old, "OLD")
    names = feat.resolve_feature_names(None, "alpha158")
    new = Manifest(features=names, label={}, splits={}, normalization={}, rows={},
                   built_with={"names": None, "set": "alpha158"})
    adopted = reconcile_features(RunConfig.from_dict({}), new, "NEW")
    assert adopted.features.set == "alpha158" and adopted.features.names == names
    assert reconcile_features(RunConfig.from_dict({"features": {"set": "alpha158"}}), new, "NEW").features.set \
        == "alpha158"
