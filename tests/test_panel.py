"""The vectorized panel (``data/panel.py``, ``data/features.py``, ``data/labels.py``) against the
per-ticker pandas implementation it replaced (``tests/reference_features.py``): every feature of
the registry, every label scheme, the label end and next-bar dates, the filtering of rows, the
skipped tickers and the count of non-finite rows, on the packaged stocknet data and on a small
synthetic market with edge cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import reference_features as ref

from alchemetric_ray.bars.sources import open_source
from alchemetric_ray.config import DataConfig
from alchemetric_ray.data import features as feat
from alchemetric_ray.data.labels import LabelSpec
from alchemetric_ray.data.panel import bars_digest, compute_group, feature_table, feature_tables

ALL = list(feat.FEATURES)
SPECS = {
    "three_class_vol": LabelSpec("three_class", horizon=1, threshold_mode="vol", vol_multiple=0.25),
    "three_class_fixed": LabelSpec("three_class", horizon=3, threshold=0.01, threshold_mode="fixed"),
    "binary": LabelSpec("binary", horizon=5),
    "triple_barrier": LabelSpec("triple_barrier", barrier_up=1.5, barrier_down=2.0, barrier_bars=7),
    "cs_rank": LabelSpec("cs_rank", horizon=2),
    "cs_zscore": LabelSpec("cs_zscore", horizon=1),
}
RTOL, ATOL = 1e-9, 1e-12


def _need(names: list[str], spec: LabelSpec) -> int:
    return feat.warmup_bars(names) + spec.reach + 20  # as the build asks (min_history, window 20)


def assert_same_values(new: pd.DataFrame, old: pd.DataFrame) -> None:
    """Same columns and rows; floats to RTOL/ATOL (NaN where NaN), everything else exactly.

    Bollinger %B is compared as %B - 0.5 = (close - mid) / (4 std): near %B = 0 the subtraction
    cancels, and pandas' running-sum std (the reference) carries a relative error of about 1e-10
    on a price's window, which there shows up as an absolute 1e-11."""
    assert list(new.columns) == list(old.columns)
    assert len(new) == len(old)
    for col in old.columns:
        a, b = new[col].to_numpy(), old[col].to_numpy()
        if b.dtype.kind == "f":
            if col == "bb_pctb_20":
                a, b = a - 0.5, b - 0.5
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=col)
        else:
            assert (pd.isna(a) == pd.isna(b)).all(), col
            assert (a[~pd.isna(b)] == b[~pd.isna(b)]).all(), col


def assert_group_matches(frames, names, spec, need) -> None:
    result = compute_group(frames, names, spec, need)
    rows, kept, skipped, nonfinite = ref.reference_group(frames, names, spec, need)
    assert result.tickers == kept
    assert result.skipped == skipped and list(result.skipped) == list(skipped)
    assert result.nonfinite == nonfinite
    assert result.rows_in == sum(len(f) for _, f in frames)
    assert result.digests == {t: bars_digest(f) for t, f in frames}  # each ticker's own bars, hashed alone
    if not kept:
        assert result.table.num_rows == 0
        return
    assert result.table.schema.equals(pa.Table.from_pandas(rows, preserve_index=False).schema, check_metadata=True)
    assert_same_values(result.table.to_pandas(), rows)


def test_the_registry_is_the_references():
    """Names, warm-ups and flags as the per-ticker implementation had them; a feature added since
    needs its direct pandas definition in tests/reference_features.py to be compared."""
    assert [(f.name, f.warmup, f.description, f.cross_sectional) for f in feat.FEATURES.values()] == \
        [(f.name, f.warmup, f.description, f.cross_sectional) for f in ref.FEATURES.values()]


# ---- the packaged data ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def stocknet(stocknet_dir) -> list[tuple[str, pd.DataFrame]]:
    """The packaged stocknet prices (88 tickers), through ingest from their CSVs, as the build reads them."""
    return list(open_source(DataConfig(path=str(stocknet_dir), source="files")).bars)


@pytest.mark.slow
def test_every_feature_equals_the_reference_on_the_packaged_data(stocknet):
    assert len(stocknet) == 88
    spec = SPECS["three_class_vol"]
    assert_group_matches(stocknet, ALL, spec, _need(ALL, spec))


@pytest.mark.parametrize("scheme", [s for s in SPECS if s != "three_class_vol"])
def test_every_label_scheme_equals_the_reference_on_the_packaged_data(stocknet, scheme):
    names = list(feat.DEFAULT_FEATURES)
    spec = SPECS[scheme]
    assert_group_matches(stocknet[::4], names, spec, _need(names, spec))  # a quarter of the tickers each


# ---- a synthetic market with edge cases -----------------------------------------------------
def _walk(rng: np.random.Generator, n: int, start: str = "2015-01-02") -> pd.DataFrame:
    close = 50 * np.exp(np.cumsum(0.015 * rng.standard_normal(n)))
    open_ = close * np.exp(0.003 * rng.standard_normal(n))
    high = np.maximum(open_, close) * np.exp(np.abs(0.01 * rng.standard_normal(n)))
    low = np.minimum(open_, close) * np.exp(-np.abs(0.01 * rng.standard_normal(n)))
    volume = np.exp(12 + 0.4 * rng.standard_normal(n)).round()
    return pd.DataFrame({"date": pd.bdate_range(start, periods=n), "open": open_, "high": high, "low": low,
                         "close": close, "volume": volume})


def edge_market() -> list[tuple[str, pd.DataFrame]]:
    rng = np.random.default_rng(41)
    plain = _walk(rng, 260)
    flat = _walk(rng, 260)  # a dead stretch: every price 40, no volume (std 0, range 0)
    flat.loc[100:170, ["open", "high", "low", "close"]] = 40.0
    flat.loc[100:170, "volume"] = 0.0
    dead = _walk(rng, 240)  # flat from its first bar: RSI's gain and loss both 0
    dead.loc[:90, ["open", "high", "low", "close"]] = 12.5
    dead.loc[:90, "volume"] = 500.0
    bad = _walk(rng, 260)  # non-finite values after the warm-up: a missing close, an infinite volume
    bad.loc[150, "close"] = np.nan
    bad.loc[200, "volume"] = np.inf
    bad.loc[230, "high"] = np.nan
    gap = _walk(rng, 261).drop(index=120).reset_index(drop=True)  # one trading day missing
    short = _walk(rng, 70)  # shorter than the features and labels need
    one = _walk(rng, 1)
    return [("PLAIN", plain), ("FLAT", flat), ("DEAD", dead), ("BAD", bad), ("GAP", gap), ("SHORT", short),
            ("ONE", one)]


@pytest.mark.parametrize("scheme", list(SPECS))
def test_edge_cases_equal_the_reference(scheme):
    spec = SPECS[scheme]
    frames = edge_market()
    assert_group_matches(frames, ALL, spec, _need(ALL, spec))
    assert_group_matches(frames, ALL, spec, 0)  # the short tickers through the panel too: no row each


def test_edge_cases_are_what_they_claim():
    frames = dict(edge_market())
    spec = SPECS["three_class_vol"]
    result = compute_group(list(frames.items()), ALL, spec, _need(ALL, spec))
    assert set(result.skipped) == {"SHORT", "ONE"} and "fewer than the" in result.skipped["SHORT"]
    assert result.nonfinite > 0  # BAD's rows after the warm-up
    table = result.table.to_pandas()
    flat = table[(table["ticker"] == "FLAT") & (table["date"] == frames["FLAT"]["date"][160])]
    assert flat["bb_pctb_20"].item() == 0.5 and flat["volume_z_20"].item() == 0.0 and flat["vol_20"].item() == 0.0
    bad_dates = set(table.loc[table["ticker"] == "BAD", "date"])
    assert bad_dates and frames["BAD"]["date"][150] not in bad_dates and frames["BAD"]["date"][149] in bad_dates
    gap = table[table["ticker"] == "GAP"].set_index("date")["label_end"]
    assert gap[frames["GAP"]["date"][119]] == frames["GAP"]["date"][121]  # the label's reach skips the missing day


def test_a_single_ticker_group_and_the_one_ticker_table():
    frames = edge_market()
    for spec in (SPECS["three_class_vol"], SPECS["triple_barrier"]):
        for ticker, frame in frames:
            assert_group_matches([(ticker, frame)], ALL, spec, 0)
            new, late = feature_table(ticker, frame, ALL, spec)
            old, old_late = ref.feature_table(ticker, frame, ALL, spec)
            assert late == old_late
            assert_same_values(new, old)  # every bar, next_date and has_features included


@pytest.mark.parametrize("batch_rows", [1, 500, 10_000])
def test_feature_tables_in_batches_are_each_tickers_table(batch_rows):
    """What predict stages: every ticker's table, whatever the batches the tickers were computed in."""
    frames = edge_market()
    spec = SPECS["cs_rank"]
    got = list(feature_tables(iter(frames), ALL, spec, batch_rows=batch_rows))
    assert [t for t, _, _ in got] == [t for t, _ in frames]
    assert all(f is frame for (_, f, _), (_, frame) in zip(got, frames))
    for (ticker, frame), (_, _, table) in zip(frames, got):
        assert_same_values(table, ref.feature_table(ticker, frame, ALL, spec)[0])


def test_digests_of_frames_that_differ_in_their_columns():
    frames = edge_market()[:3]
    frames[1] = (frames[1][0], frames[1][1].assign(volume=frames[1][1]["volume"].astype("int64")))
    frames[2] = (frames[2][0], frames[2][1].assign(extra="x"))
    result = compute_group(frames, ["ret_1"], SPECS["binary"], 0)
    assert result.digests == {t: bars_digest(f) for t, f in frames}


def test_an_empty_group():
    result = compute_group([], ALL, SPECS["binary"], 10)
    assert result.tickers == [] and result.table.num_rows == 0 and result.rows_in == 0


def test_ewm_follows_pandas_through_missing_values():
    """The EMA primitive against pandas' own: leading NaN, a missing value in the middle, inf.  (Not
    alpha = 0.5: after a missing value pandas 3.1 gives other values at that one rate; no feature uses it.)"""
    rng = np.random.default_rng(7)
    series = [rng.standard_normal(50) for _ in range(4)]
    series[0][:5] = np.nan
    series[1][[10, 11, 30]] = np.nan
    series[2][20] = np.inf
    series[3][:] = np.nan
    panel = feat.Panel({c: np.concatenate(series) for c in ("open", "high", "low", "close", "volume")},
                       np.array([len(s) for s in series]))
    for kwargs in ({"alpha": 1 / 14, "min_periods": 14}, {"span": 9, "min_periods": 9}, {"span": 26, "min_periods": 26},
                   {"alpha": 0.3, "min_periods": 1}):
        got = panel.ewm(panel.close, **kwargs)
        want = np.concatenate([pd.Series(s).ewm(adjust=False, **kwargs).mean().to_numpy() for s in series])
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_emas_resumed_from_their_kept_states_equal_the_whole_history():
    """What an append does (data/tails.py): the EMAs' states kept after a bar of each ticker (one with a
    missing close, whose EMAs take pandas' exact recurrence), then a panel of only the bars a row looks back
    on and the bars after that one, its EMAs resumed from those states: every feature after the bar equals
    the whole history's, and the states kept further on equal the whole history's there."""
    rng = np.random.default_rng(3)
    lengths = np.array([300, 250, 400])
    close = np.exp(np.cumsum(rng.normal(0, 0.01, lengths.sum()))) * 50
    cols = {"open": close * 1.001, "high": close * 1.01, "low": close * 0.99, "close": close,
            "volume": rng.uniform(1e5, 1e6, lengths.sum())}
    cols["close"][310] = np.nan  # ticker 1's bar 10
    names = list(feat.DEFAULT_FEATURES)
    at, back, later = lengths - 30, 70, lengths - 5

    whole = feat.Panel(cols, lengths)
    whole.keep_emas_at = at
    values, _ = feat.feature_matrix(whole, names)
    assert set(whole.kept_emas) == {"rsi_gain", "rsi_loss", "macd_fast", "macd_slow", "macd_signal", "atr"}
    starts = np.cumsum(lengths) - lengths
    take = np.concatenate([np.arange(s + a - back, s + n) for s, a, n in zip(starts, at, lengths)])
    short_lengths = lengths - (at - back)
    short = feat.Panel({c: v[take] for c, v in cols.items()}, short_lengths)
    short.resume = feat.EmaStates(np.full(3, back), dict(whole.kept_emas))
    short.keep_emas_at = short_lengths - (lengths - later)
    resumed, _ = feat.feature_matrix(short, names)
    short_starts = np.cumsum(short_lengths) - short_lengths
    for j in range(3):
        after = values[starts[j] + at[j] + 1: starts[j] + lengths[j]]
        again = resumed[short_starts[j] + back + 1: short_starts[j] + short_lengths[j]]
        assert np.isfinite(after).all()
        np.testing.assert_allclose(again, after, rtol=1e-12, atol=1e-12)
        assert np.isnan(resumed[short_starts[j]: short_starts[j] + back + 1, names.index("rsi_14")]).all()

    further = feat.Panel(cols, lengths)
    further.keep_emas_at = later
    feat.feature_matrix(further, names)
    for key, states in further.kept_emas.items():
        np.testing.assert_allclose(short.kept_emas[key], states, rtol=1e-12, atol=1e-12)
    # the valid values counted: the closes (MACD's EMAs), the close-to-close moves (RSI's)
    for j in range(3):
        bars = cols["close"][starts[j]: starts[j] + later[j] + 1]
        assert further.kept_emas["macd_fast"][j, 2] == np.isfinite(bars).sum()
        assert further.kept_emas["rsi_gain"][j, 2] == np.isfinite(np.diff(bars)).sum()
    assert further.kept_emas["macd_fast"][1, 2] == later[1]  # the missing close is not counted
    broken = feat.Panel(cols, lengths)
    broken.resume = feat.EmaStates(np.zeros(3, dtype=np.int64), {})
    with pytest.raises(ValueError, match="no state to resume the EMA 'atr' from"):
        feat.feature_matrix(broken, ["atr_14"])
