"""Baselines on the same split and features: majority class, logistic regression, HistGradientBoosting.

A deep model is only worth its cost if it beats these; the export reports them side by side.
They use each row's own features (no windows) and at most ``MAX_TRAIN_ROWS`` train rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.dummy import DummyClassifier
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.train.evaluate import split_frame
from alchemetric_ray.train.metrics import classification_metrics

MAX_TRAIN_ROWS = 200_000
# Below this many train rows HistGradientBoosting runs on one OpenMP thread: on small tables the
# threads' synchronisation costs more than they compute (2,505 rows on this 2-core machine: 0.7 s on
# one thread, 10 s on all of them while other processes were busy; the same trees either way).
ONE_THREAD_BELOW_ROWS = 50_000


def baseline_models(seed: int) -> dict[str, ClassifierMixin]:
    """The two learned baselines every report compares a deep model with, unfitted."""
    return {
        "logistic_regression": LogisticRegression(max_iter=300),
        "hist_gradient_boosting": HistGradientBoostingClassifier(max_iter=100, random_state=seed),
    }


def fit_baseline(model: ClassifierMixin, x: np.ndarray, y: np.ndarray) -> ClassifierMixin:
    with threadpool_limits(1 if len(x) < ONE_THREAD_BELOW_ROWS else None, user_api="openmp"):
        return model.fit(x, y)


def predict_baseline(model: ClassifierMixin, x: np.ndarray, n_classes: int) -> np.ndarray:
    """Class probabilities in the label's class order (a class absent from the train rows gets 0)."""
    full = np.zeros((len(x), n_classes))
    with threadpool_limits(1 if len(x) < ONE_THREAD_BELOW_ROWS else None, user_api="openmp"):
        full[:, model.classes_.astype(int)] = model.predict_proba(x)
    return full


def baseline_scores(shards: str | Path, manifest: Manifest, seed: int = 0, splits=("val", "test")) -> dict[str, dict]:
    features = manifest.features
    n_classes = len(manifest.classes)
    train = split_frame(shards, "train", features, manifest)
    if len(train) > MAX_TRAIN_ROWS:
        train = train.sample(MAX_TRAIN_ROWS, random_state=seed)
    x, y = train[features].to_numpy(), train["label"].to_numpy()
    models = {"majority": DummyClassifier(strategy="most_frequent"), **baseline_models(seed)}
    frames = {s: split_frame(shards, s, features, manifest) for s in splits}
    scores: dict[str, dict] = {}
    for name, model in models.items():
        fit_baseline(model, x, y)
        scores[name] = {}
        for split, frame in frames.items():
            if len(frame):
                proba = predict_baseline(model, frame[features].to_numpy(), n_classes)
                scores[name][split] = classification_metrics(frame["label"].to_numpy(), proba, prefix="")
    return scores
