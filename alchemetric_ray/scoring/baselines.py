"""Baselines on the same split, features and target.

Class targets: the majority class, logistic regression and HistGradientBoosting (classifier).
Regression (cross-sectional) targets: the mean, ridge regression and HistGradientBoosting
(regressor; the LightGBM-like family, Qlib's strongest baselines).  A deep model is only worth its
cost if it beats these; the export reports them side by side, with the same metrics as the model
(the target's own and the signal metrics).  They use each row's own features (no windows) and at
most ``MAX_TRAIN_ROWS`` train rows.
"""

from __future__ import annotations

from pathlib import Path

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
    scores: dict[str, dict] = {}
    for name, model in models.items():
        fit_baseline(model, x, y)
        scores[name] = {}
        for split, frame in frames.items():
            if len(frame):
                outputs = predict_baseline(model, frame[features].to_numpy(), len(classes))
                scores[name][split] = target_metrics(outputs, frame["label"].to_numpy(), frame["fwd_ret"].to_numpy(),
                                                     frame["date"].to_numpy(), classes, prefix="")
    return scores
