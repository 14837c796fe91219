"""Baselines on the same split and features: majority class, logistic regression, HistGradientBoosting.

A deep model is only worth its cost if it beats these; the export reports them side by side.
They use each row's own features (no windows) and at most ``MAX_TRAIN_ROWS`` train rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.dummy import DummyClassifier
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

from alchemetric_ray.train.evaluate import split_frame
from alchemetric_ray.train.metrics import classification_metrics

MAX_TRAIN_ROWS = 200_000


def _proba(model, x: np.ndarray, n_classes: int) -> np.ndarray:
    p = model.predict_proba(x)
    full = np.zeros((len(x), n_classes))
    full[:, model.classes_.astype(int)] = p
    return full


def baseline_scores(shards: str | Path, manifest: dict, seed: int = 0, splits=("val", "test")) -> dict[str, dict]:
    features = manifest["features"]
    n_classes = len(manifest["label"]["classes"])
    train = split_frame(shards, "train", features)
    if len(train) > MAX_TRAIN_ROWS:
        train = train.sample(MAX_TRAIN_ROWS, random_state=seed)
    x, y = train[features].to_numpy(), train["label"].to_numpy()
    models = {
        "majority": DummyClassifier(strategy="most_frequent"),
        "logistic_regression": LogisticRegression(max_iter=300),
        "hist_gradient_boosting": HistGradientBoostingClassifier(max_iter=100, random_state=seed),
    }
    frames = {s: split_frame(shards, s, features) for s in splits}
    scores: dict[str, dict] = {}
    for name, model in models.items():
        model.fit(x, y)
        scores[name] = {}
        for split, frame in frames.items():
            if len(frame):
                proba = _proba(model, frame[features].to_numpy(), n_classes)
                scores[name][split] = classification_metrics(frame["label"].to_numpy(), proba, prefix="")
    return scores
