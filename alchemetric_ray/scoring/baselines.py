"""Baselines on the same split, features and target.

Class targets: the majority class, logistic regression and HistGradientBoosting (classifier).
Regression (cross-sectional) targets: the mean, ridge regression and HistGradientBoosting
(regressor); for both, LightGBM stopped early on the validation segment.  A deep model is only
worth its cost if it beats these; the export reports them side by side, with the same metrics as
the model (the target's own and the signal metrics).  They use each row's own features (no
windows) and at most ``MAX_TRAIN_ROWS`` train rows.  LightGBM (:func:`lightgbm_model`,
:func:`fit_lightgbm`) is the gradient-boosting baseline Qlib publishes; ``evaluate`` refits it
beside the others in every walk-forward refit.
"""

from __future__ import annotations

import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lightgbm as lgb
import numpy as np
from sklearn.base import BaseEstimator
from sklearn.dummy import DummyClassifier, DummyRegressor
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from threadpoolctl import threadpool_limits

from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.scoring.metrics import target_metrics
from alchemetric_ray.scoring.predictions import split_frame
from alchemetric_ray.storage import Location

MAX_TRAIN_ROWS = 200_000
# Below this many train rows HistGradientBoosting runs on one OpenMP thread: on small tables the
# threads' synchronisation costs more than they compute (2,505 rows on this 2-core machine: 0.7 s on
# one thread, 10 s on all of them while other processes were busy; the same trees either way).
ONE_THREAD_BELOW_ROWS = 50_000

# LightGBM's schedule (lightgbm_model): at most this many rounds, stopped once the validation loss
# has not improved for LIGHTGBM_STOPPING_ROUNDS rounds.
LIGHTGBM_MAX_ROUNDS = 500
LIGHTGBM_STOPPING_ROUNDS = 50
# LightGBM runs on one thread up to this many train rows, all the evaluation fits (MAX_TRAIN_ROWS):
# its threads meet at a barrier every round, so one thread that the OS deschedules stalls the rest.
# 55,000 x 19 rows, 51 rounds, on this 2-core machine while other processes were busy: 0.9 s on one
# thread, 0.8 s to 24.6 s on two (19.5 and 30.7 s on all of them); 200,000 rows on one thread: 5.8 s.
LIGHTGBM_ONE_THREAD_UP_TO_ROWS = MAX_TRAIN_ROWS


def baseline_models(seed: int, regression: bool = False) -> dict[str, BaseEstimator]:
    """The two learned baselines every report compares a deep model with, unfitted."""
    if regression:
        return {
            "ridge_regression": Ridge(alpha=1.0),
            "hist_gradient_boosting": HistGradientBoostingRegressor(max_iter=100, random_state=seed),
        }
    return {
        "logistic_regression": LogisticRegression(max_iter=300),
        "hist_gradient_boosting": HistGradientBoostingClassifier(max_iter=100, random_state=seed),
    }


def lightgbm_model(seed: int, regression: bool, rows: int) -> lgb.LGBMClassifier | lgb.LGBMRegressor:
    """LightGBM, unfitted: a classifier for a class target, a regressor (L2) for a cross-sectional
    one; fitted by :func:`fit_lightgbm` with early stopping on the validation segment.

    Parameters for the tables this evaluates (tens of thousands of rows, a few dozen features, a
    weak signal): 31 leaves (LightGBM's default; deeper trees only fit noise on so few rows), a
    learning rate of 0.05 (half the default: smaller steps, so the stopping round is chosen finely)
    and at most 500 rounds, stopped after 50 rounds without a better validation loss.  On a market
    with little to learn it stops within its first rounds, so its cost stays near HistGradientBoosting's
    (100 fixed iterations); where there is more to learn it uses more rounds, up to the cap.  The
    fit is deterministic (``seed``, ``deterministic=True``, row-wise histograms) and runs on one
    thread up to ``LIGHTGBM_ONE_THREAD_UP_TO_ROWS`` train rows (HistGradientBoosting up to
    ``ONE_THREAD_BELOW_ROWS``; LightGBM's threads cost more on a busy machine, see the constant)."""
    params: dict = dict(n_estimators=LIGHTGBM_MAX_ROUNDS, learning_rate=0.05, num_leaves=31, random_state=seed,
                        deterministic=True, force_row_wise=True, verbose=-1,
                        n_jobs=1 if rows <= LIGHTGBM_ONE_THREAD_UP_TO_ROWS else None)
    return lgb.LGBMRegressor(**params) if regression else lgb.LGBMClassifier(**params)


def fit_lightgbm(model: lgb.LGBMClassifier | lgb.LGBMRegressor, x: np.ndarray, y: np.ndarray,
                 x_val: np.ndarray, y_val: np.ndarray) -> dict:
    """Fit LightGBM on the train rows, stopping early on the validation rows (``x_val``, ``y_val``:
    the validation segment, never the scored one); predictions use its best round.  A class absent
    from the train rows is left out of the validation rows (the classifier cannot score it).
    Returns what the stop chose: ``best_iteration``, ``rounds`` trained, ``max_rounds``, ``val_rows``."""
    if isinstance(model, lgb.LGBMClassifier):
        keep = np.isin(y_val, np.unique(y))
        x_val, y_val = x_val[keep], y_val[keep]
    if not len(y_val):
        raise ValueError("LightGBM needs validation rows to stop early on")
    # LightGBM 4.7 names the validation rows eval_X/eval_y and deprecates eval_set, which 4.3-4.6 take
    val = ({"eval_X": x_val, "eval_y": y_val} if "eval_X" in inspect.signature(model.fit).parameters
           else {"eval_set": [(x_val, y_val)]})
    with threadpool_limits(1 if len(x) <= LIGHTGBM_ONE_THREAD_UP_TO_ROWS else None, user_api="openmp"):
        model.fit(x, y, **val,
                  callbacks=[lgb.early_stopping(LIGHTGBM_STOPPING_ROUNDS, first_metric_only=True, verbose=False)])
    (losses,) = next(iter(model.evals_result_.values())).values()  # the validation loss, one per round run
    return {"best_iteration": int(model.best_iteration_), "rounds": len(losses), "max_rounds": LIGHTGBM_MAX_ROUNDS,
            "val_rows": int(len(y_val))}


def fit_baseline(model: BaseEstimator, x: np.ndarray, y: np.ndarray) -> BaseEstimator:
    with threadpool_limits(1 if len(x) < ONE_THREAD_BELOW_ROWS else None, user_api="openmp"):
        return model.fit(x, y)


def predict_baseline(model: BaseEstimator, x: np.ndarray, n_classes: int) -> np.ndarray:
    """The baseline's outputs as the model's are laid out: class probabilities in the label's class
    order (a class absent from the train rows gets 0), or for a regression target (``n_classes``
    0) its prediction as one column."""
    with threadpool_limits(1 if len(x) < ONE_THREAD_BELOW_ROWS else None, user_api="openmp"):
        if not n_classes:
            return np.asarray(model.predict(x), dtype=np.float64)[:, None]
        full = np.zeros((len(x), n_classes))
        full[:, model.classes_.astype(int)] = model.predict_proba(x)
    return full


def baseline_scores(shards: str | Path | Location, manifest: Manifest, seed: int = 0,
                    splits=("val", "test")) -> dict[str, dict]:
    features, classes = manifest.features, manifest.classes
    train = split_frame(shards, "train", features, manifest)
    if len(train) > MAX_TRAIN_ROWS:
        train = train.sample(MAX_TRAIN_ROWS, random_state=seed)
    x, y = train[features].to_numpy(), train["label"].to_numpy()
    trivial = ({"mean": DummyRegressor()} if manifest.regression
               else {"majority": DummyClassifier(strategy="most_frequent")})
    models = {**trivial, **baseline_models(seed, manifest.regression)}
    frames = {s: split_frame(shards, s, features, manifest) for s in splits}
    val = frames["val"] if "val" in frames else split_frame(shards, "val", features, manifest)
    if len(val):  # LightGBM stops early on the validation segment: without one it is left out
        models["lightgbm"] = lightgbm_model(seed, manifest.regression, len(x))

    def fit_and_score(name: str, model: BaseEstimator) -> dict:
        if name == "lightgbm":
            fit_lightgbm(model, x, y, val[features].to_numpy(), val["label"].to_numpy())
        else:
            fit_baseline(model, x, y)
        return {split: target_metrics(predict_baseline(model, frame[features].to_numpy(), len(classes)),
                                      frame["label"].to_numpy(), frame["fwd_ret"].to_numpy(), frame["date"].to_numpy(),
                                      classes, prefix="")
                for split, frame in frames.items() if len(frame)}

    scores: dict[str, dict] = {}
    aside = models.pop("lightgbm", None)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # LightGBM (one thread up to MAX_TRAIN_ROWS) beside the others, which take the other CPUs (OpenMP's
        # thread count is the calling thread's): the same models, in about the time of the slower side
        later = pool.submit(fit_and_score, "lightgbm", aside) if aside is not None else None
        with threadpool_limits(max(1, (os.cpu_count() or 1) - 1) if later else None, user_api="openmp"):
            for name, model in models.items():
                scores[name] = fit_and_score(name, model)
        if later is not None:
            scores["lightgbm"] = later.result()
    return scores
