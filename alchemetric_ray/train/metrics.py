"""Classification metrics (scikit-learn) for validation and test, from probabilities and labels."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn import metrics as skm

# Metrics where larger is better; the rest (log loss) are minimised.
HIGHER_IS_BETTER = {"accuracy", "balanced_accuracy", "macro_f1", "roc_auc", "mcc"}


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, prefix: str = "val_") -> dict:
    """accuracy, balanced accuracy, macro F1, log loss, ROC-AUC (one-vs-rest), MCC, confusion matrix."""
    y_true = np.asarray(y_true, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    n_classes = proba.shape[1]
    labels = list(range(n_classes))
    pred = proba.argmax(axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a class missing from a small split is reported as nan, not a warning flood
        out = {
            "accuracy": skm.accuracy_score(y_true, pred),
            "balanced_accuracy": skm.balanced_accuracy_score(y_true, pred),
            "macro_f1": skm.f1_score(y_true, pred, labels=labels, average="macro", zero_division=0),
            "log_loss": skm.log_loss(y_true, np.clip(proba, 1e-7, 1), labels=labels),
            "mcc": skm.matthews_corrcoef(y_true, pred),
        }
        try:
            if n_classes == 2:
                out["roc_auc"] = skm.roc_auc_score(y_true, proba[:, 1])
            else:
                out["roc_auc"] = skm.roc_auc_score(y_true, proba, multi_class="ovr", labels=labels)
        except ValueError:
            out["roc_auc"] = float("nan")  # a class absent from y_true
    result = {f"{prefix}{k}": float(v) for k, v in out.items()}
    result[f"{prefix}confusion"] = skm.confusion_matrix(y_true, pred, labels=labels).tolist()
    return result


def is_better(value: float, best: float | None, mode: str) -> bool:
    if value != value:  # nan never improves
        return False
    if best is None:
        return True
    return value > best if mode == "max" else value < best
