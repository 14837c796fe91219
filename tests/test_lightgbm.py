"""The LightGBM contender (issue 42 item 2): a classifier for class targets and a regressor for
cross-sectional ones, fitted on the baselines' rows and stopped early on the validation segment,
scored beside the other baselines in ``evaluate`` and in the verdict.  Real fits on real rows: a
market built here whose effect needs more boosting than HistGradientBoosting's 100 iterations, and
the synthetic markets of ``bars/synthetic.py`` (null and planted)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from alchemetric_ray.config import load_config
from alchemetric_ray.scoring.baselines import LIGHTGBM_MAX_ROUNDS, LIGHTGBM_STOPPING_ROUNDS


def test_lightgbm_stops_on_the_validation_rows_and_refits_to_the_same_numbers():
    """A small table with a plain effect: the fit stops at a round chosen on the validation rows
    (it runs ``LIGHTGBM_STOPPING_ROUNDS`` past it, never the maximum), and fitting again gives the
    same predictions to the bit (seed, deterministic mode, one thread)."""
    from alchemetric_ray.scoring.baselines import fit_lightgbm, lightgbm_model, predict_baseline

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 4))
    y = (x[:, 0] + rng.normal(size=3000) > 0).astype(int)
    fits, outputs = [], []
    for _ in range(2):
        model = lightgbm_model(seed=7, regression=False, rows=2000)
        fits.append(fit_lightgbm(model, x[:2000], y[:2000], x[2000:2500], y[2000:2500]))
        outputs.append(predict_baseline(model, x[2500:], n_classes=2))
    fit = fits[0]
    assert fit == fits[1] and np.array_equal(outputs[0], outputs[1])
    assert fit["rounds"] == fit["best_iteration"] + LIGHTGBM_STOPPING_ROUNDS < LIGHTGBM_MAX_ROUNDS, fit
    assert fit["val_rows"] == 500
    assert np.corrcoef(outputs[0][:, 1], x[2500:, 0])[0, 1] > 0.8  # it learned the effect


def _nonlinear_market(seed: int, names: int = 40, days: int = 600, k: int = 12, noise: float = 0.25):
    """A cross-section whose next return is a sum of ``k`` non-monotone terms (sin 2x) of the
    features, plus noise: ridge regression sees little of it and boosting must fit every term, which
    takes more rounds than HistGradientBoosting's 100.  Splits: 360 train days, 120 validation, 119
    test, one day of embargo between them."""
    from alchemetric_ray.data.manifest import Manifest

    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2015-01-01", periods=days)
    x = rng.normal(size=(names * days, k))
    fwd = 0.01 * (np.sin(2 * x).sum(axis=1) + noise * np.sqrt(k) * rng.normal(size=len(x)))
    frame = pd.DataFrame({"date": np.repeat(dates.to_numpy(), names),
                          "ticker": np.tile([f"T{i:02d}" for i in range(names)], days),
                          **{f"x{i}": x[:, i] for i in range(k)}, "mom_20": rng.normal(size=len(x)), "fwd_ret": fwd})
    frame["label"] = frame.groupby("date")["fwd_ret"].rank(pct=True) - 0.5  # a cross-sectional target

    def day(i: int) -> str:
        return str(dates[i].date())

    manifest = Manifest(features=[f"x{i}" for i in range(k)], label={"classes": [], "horizon": 1, "reach": 1},
                        splits={"train_start": day(0), "train_end": day(359), "val_start": day(361),
                                "val_end": day(479), "test_start": day(481), "test_end": day(599), "embargo": 1},
                        normalization={}, rows={})
    # a model without skill, scored beside them: the verdict compares it with the best baseline
    model = frame[["date", "ticker", "fwd_ret"]].assign(score=rng.normal(size=len(frame)), position=0)
    return frame, manifest, model


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_lightgbm_is_the_best_baseline_where_the_effect_needs_more_boosting(seed):
    """On a market whose effect needs many boosting rounds, LightGBM's early stopping runs past
    HistGradientBoosting's 100 iterations and ranks the test segment better than it (and far better
    than ridge regression and the 20-day rule): it is the best baseline, named in the verdict line,
    and the paired difference is taken against it.  Its stop was chosen on the validation
    segment's dates, all before the test segment."""
    from alchemetric_ray.signals.contenders import contender_frames, score_contenders

    frame, manifest, model = _nonlinear_market(seed)
    cfg = load_config(None, ["signals.quantile=0.2"])
    contenders = contender_frames(model, frame, manifest, cfg)
    result = score_contenders(contenders, manifest, cfg)
    rank_ic = {row.name: row.rank_ic.mean for row in result.rows}
    assert list(rank_ic) == ["deep model", "ridge regression", "hist gradient boosting", "lightgbm", "momentum 20d",
                             "buy and hold"]
    assert rank_ic["lightgbm"] > rank_ic["hist gradient boosting"] > rank_ic["ridge regression"] + 0.2, rank_ic
    assert result.best_baseline == "lightgbm"
    assert f"lightgbm {rank_ic['lightgbm']:.3f}; difference" in result.verdict.line, result.verdict.line
    assert result.verdict.difference.mean < 0  # the unskilled model against it
    (fit,) = result.baseline_fits["lightgbm"]
    assert 100 < fit["best_iteration"] <= LIGHTGBM_MAX_ROUNDS, fit
    splits = manifest.splits
    assert splits["val_start"] == fit["val_start"] and fit["val_end"] == splits["val_end"] < splits["test_start"]
    assert fit["fit_end"] == splits["train_end"] and fit["val_rows"] == 40 * 119


def _market_cfg(tmp_path, *overrides: str):
    return load_config(None, ["data.source=synthetic", f"storage.path={tmp_path / 'results'}",
                              f"storage.models_dir={tmp_path / 'models'}", "storage.name=lgb", "train.epochs=1",
                              "model.hidden=16", "device.name=cpu", *overrides])


@pytest.mark.slow
def test_on_the_null_market_lightgbm_stops_early_on_validation_and_the_test_segment_has_one_look(tmp_path):
    """No effect planted (the null market of test_cross_section.py's cs_rank test): the LightGBM
    regressor's validation loss stops improving within its first rounds, so it stops long before its
    500; the rows it stopped on are the validation segment's, whose labels end before the test
    segment; training recorded no look at the test segment and ``evaluate`` is its one look.
    LightGBM's row, its fit and the line that says where it stopped are in the record and the report."""
    from alchemetric_ray.artifacts import ledger
    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.signals.evaluate import evaluate
    from alchemetric_ray.training.trainer import run_training

    cfg = _market_cfg(tmp_path, "data.synthetic_tickers=20", "data.synthetic_days=400", "data.synthetic_effect=0.0",
                      "data.seed=3", "features.label=cs_rank")
    model_dir = run_training(cfg, progress=False).model_dir
    splits = load_model(model_dir).manifest.splits
    assert ledger.looks_at(model_dir, splits["test_start"], splits["test_end"]) == []  # sealed until evaluate
    result = evaluate(model_dir, None, tmp_path / "report")
    assert result.looks.count == 1
    row = next(r for r in result.rows if r.name == "lightgbm")
    assert np.isfinite(row.rank_ic.mean) and row.rank_ic.n_days == result.rows[0].rank_ic.n_days
    (fit,) = result.baseline_fits["lightgbm"]
    assert fit["best_iteration"] < LIGHTGBM_MAX_ROUNDS and fit["rounds"] < LIGHTGBM_MAX_ROUNDS, fit
    assert splits["val_start"] <= fit["val_start"] <= fit["val_end"] <= splits["val_end"] < splits["test_start"]
    assert fit["fit_end"] <= splits["train_end"] < fit["val_start"]
    assert not result.verdict.signal and not result.verdict.edge, result.verdict.line
    saved = json.loads((tmp_path / "report" / "evaluation.json").read_text())
    assert [r["name"] for r in saved["rows"]] == ["deep model", "ridge regression", "hist gradient boosting",
                                                   "lightgbm", "momentum 20d", "buy and hold"]
    assert saved["baseline_fits"] == {"lightgbm": [fit]}
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| lightgbm |" in report
    assert (f"LightGBM, stopping early on the validation rows {fit['val_start']}..{fit['val_end']}" in report
            and f"best round {fit['best_iteration']} of at most {LIGHTGBM_MAX_ROUNDS}" in report)


@pytest.mark.slow
def test_on_a_planted_effect_the_lightgbm_classifier_finds_it(tmp_path):
    """The synthetic market's planted momentum effect (``data.synthetic_effect=1``, the last 10 days'
    return, 40 names x 900 days, seed 3) with a binary class target: the LightGBM classifier ranks
    the test segment with a rank IC above 0, its interval included."""
    from alchemetric_ray.signals.evaluate import evaluate
    from alchemetric_ray.training.trainer import run_training

    cfg = _market_cfg(tmp_path, "data.synthetic_tickers=40", "data.synthetic_days=900", "data.synthetic_effect=1.0",
                      "data.seed=3", "features.label=binary")
    result = evaluate(run_training(cfg, progress=False).model_dir, None, tmp_path / "report")
    row = next(r for r in result.rows if r.name == "lightgbm")
    assert row.rank_ic.ci_low > 0, row.rank_ic
    assert row.classification is not None and row.classification["balanced_accuracy"] > 0.5
    (fit,) = result.baseline_fits["lightgbm"]
    assert fit["best_iteration"] >= 1 and fit["val_end"] < result.segment.start


@pytest.mark.slow
def test_new_data_without_the_models_training_rows_holds_out_its_own_last_dates_to_stop_on():
    """New data that begins after the model's training end: the baselines are fitted on its own rows
    before the scored window, and LightGBM holds out the last 15 % of those rows' dates to stop on,
    after the label's reach as embargo; nothing of the scored window is used."""
    from alchemetric_ray.signals.contenders import contender_frames

    frame, manifest, model = _nonlinear_market(0)
    # the model was trained, validated and tested on dates before the data's first (2015-01-01)
    manifest = replace(manifest, splits={**manifest.splits, "train_start": "2013-01-01", "train_end": "2014-06-30",
                                         "val_start": "2014-07-02", "val_end": "2014-11-28",
                                         "test_start": "2014-12-02", "test_end": "2014-12-31"})
    days = np.unique(frame["date"].to_numpy())
    start, end = str(days[500])[:10], str(days[-1])[:10]  # the window scored: the data's last 100 days
    contenders = contender_frames(model, frame, manifest, load_config(None, []), segment=(start, end))
    assert contenders.baselines_note.startswith("the learned baselines were fitted on the data's own rows")
    assert "lightgbm" in contenders.frames
    (fit,) = contenders.fits["lightgbm"]
    early = days[:499]  # before the window, less the label's reach (1 day)
    held_out = [d for d in early if str(d)[:10] >= fit["val_start"]]
    assert fit["val_end"] == str(early[-1])[:10] < start
    assert len(held_out) == round(0.15 * len(early)) and fit["val_rows"] == 40 * len(held_out)
    assert str(early[-len(held_out) - 2])[:10] == fit["fit_end"]  # one day of embargo before the held-out dates
