"""Validation and test metrics: classification metrics (scikit-learn's definitions) from probabilities
and labels, the mean squared error of a regression target, and for every target the signal metrics of
the score against the realised forward return across the stocks of each date (IC, rank IC and their
IRs).  Which of them selects a run's best, and which way it improves, is ``scoring.objective``'s."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["classification_metrics", "regression_metrics", "signal_metrics", "target_metrics", "direction_score"]


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, prefix: str = "val_") -> dict:
    """accuracy, balanced accuracy, macro F1, log loss, ROC-AUC (one-vs-rest), MCC, confusion matrix.

    Memory stays near the size of the inputs: the label metrics come from one confusion matrix
    (one ``np.bincount``, with scikit-learn's formulas), the log loss from the picked column and the
    ROC-AUC from one sort per class (:func:`_roc_auc`), instead of one scikit-learn call each, which
    together held ~175 bytes per row at their peak (260 MiB for a 1.5M-row validation split;
    bench/scaling.py).  Nor does a Train worker import scikit-learn for them (0.8 s of every run's
    first validation).  ``tests/test_signal_metrics.py`` checks every figure against the
    scikit-learn function it replaces."""
    y_true = np.asarray(y_true, dtype=np.int64)
    proba = np.asarray(proba)
    if proba.dtype not in (np.float32, np.float64):
        proba = proba.astype(np.float64)
    n_classes = proba.shape[1]
    cm = np.bincount(y_true * n_classes + proba.argmax(axis=1), minlength=n_classes * n_classes)
    cm = cm.reshape(n_classes, n_classes)  # rows: true class, columns: predicted
    out = _from_confusion(cm.astype(np.float64))
    out["log_loss"] = _log_loss(y_true, proba)
    out["roc_auc"] = _roc_auc(y_true, proba)
    result: dict[str, Any] = {f"{prefix}{k}": float(v) for k, v in out.items()}
    result[f"{prefix}confusion"] = cm.tolist()
    return result


def _from_confusion(cm: np.ndarray) -> dict:
    """accuracy_score, balanced_accuracy_score, f1_score(average="macro", zero_division=0) and
    matthews_corrcoef of scikit-learn, from the confusion matrix (rows: true, columns: predicted)."""
    n = cm.sum()
    tp, true, pred = np.diag(cm), cm.sum(axis=1), cm.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        recall = tp / true
        f1_denominator = true + pred  # 2tp + fp + fn
        f1 = np.where(f1_denominator > 0, 2 * tp / f1_denominator, 0.0)  # zero_division=0
    recall = recall[~np.isnan(recall)]  # classes absent from y_true are left out, as scikit-learn does
    cov_true_pred = tp.sum() * n - true @ pred
    cov_pred = n * n - pred @ pred
    cov_true = n * n - true @ true
    return {
        "accuracy": tp.sum() / n if n else float("nan"),
        "balanced_accuracy": recall.mean() if recall.size else 0.0,
        "macro_f1": f1.mean(),
        "mcc": cov_true_pred / np.sqrt(cov_true * cov_pred) if cov_true * cov_pred else 0.0,
    }


def _log_loss(y_true: np.ndarray, proba: np.ndarray) -> float:
    """scikit-learn's log_loss of the probabilities clipped to [1e-7, 1] (rows renormalised, as it does)."""
    clipped = np.clip(proba, 1e-7, 1)
    picked = clipped[np.arange(len(y_true)), y_true].astype(np.float64)
    return float(-np.mean(np.log(picked / clipped.sum(axis=1, dtype=np.float64))))


def _roc_auc(y_true: np.ndarray, proba: np.ndarray) -> float:
    """scikit-learn's roc_auc_score: of the second column for two classes, else one-vs-rest, macro.

    One sort per class: a class's area is the share of (positive, negative) pairs its score orders
    right, a tie counting half (Mann-Whitney's U), which is what the ROC curve's trapezoids add up
    to.  About 30 bytes a row at the peak, where scikit-learn's one-vs-rest held ~88 (126 MiB for a
    1.5M-row validation split).  NaN where a class has no positive or no negative row, or where a
    probability is not finite (scikit-learn raises there)."""
    n_classes = proba.shape[1]
    if not np.isfinite(proba).all():
        return float("nan")
    areas = []
    for c in ([1] if n_classes == 2 else range(n_classes)):
        order = np.argsort(proba[:, c], kind="stable")
        score = proba[order, c]
        positive = y_true[order] == c
        del order
        n_pos = int(positive.sum())
        n_neg = len(positive) - n_pos
        if not n_pos or not n_neg:
            return float("nan")
        last = np.flatnonzero(np.append(score[1:] != score[:-1], True))  # each run of equal scores' last row
        del score
        pos_in = np.diff(np.cumsum(positive)[last], prepend=0).astype(np.float64)
        neg_in = np.diff(last, prepend=-1) - pos_in
        neg_below = np.cumsum(neg_in) - neg_in
        areas.append(float((pos_in * neg_below).sum() + 0.5 * (pos_in * neg_in).sum()) / (n_pos * n_neg))
    return float(np.mean(areas))


def direction_score(outputs: np.ndarray, classes: list[str]) -> np.ndarray:
    """The score a signal is taken on: P(up) - P(down) from class probabilities, or the model's
    own output for a regression target (no classes)."""
    outputs = np.asarray(outputs)
    if not classes:
        return outputs[:, 0]
    return outputs[:, classes.index("up")] - outputs[:, classes.index("down")]


def target_metrics(outputs: np.ndarray, labels: np.ndarray, fwd_ret: np.ndarray, date: np.ndarray,  # noqa: PLR0913
                   classes: list[str], prefix: str = "val_", quantile: float = 0.2) -> dict:
    """Every metric of one split: the target's own (classification metrics from the class
    probabilities, or the MSE of a regression target), and the signal metrics of its score."""
    if classes:
        out = classification_metrics(labels, outputs, prefix=prefix)
    else:
        out = regression_metrics(labels, np.asarray(outputs)[:, 0], prefix=prefix)
    out.update(signal_metrics(direction_score(outputs, classes), fwd_ret, date, prefix=prefix, quantile=quantile))
    return out


def regression_metrics(y_true: np.ndarray, pred: np.ndarray, prefix: str = "val_") -> dict:
    """Mean squared error of a regression target (float64 accumulation)."""
    err = np.asarray(pred, dtype=np.float64) - np.asarray(y_true, dtype=np.float64)
    return {f"{prefix}mse": float(np.mean(err * err)) if len(err) else float("nan")}


SIGNAL_BLOCK_ROWS = 65_536  # signal_metrics takes whole dates a block of about this many rows at a time


def signal_metrics(score: np.ndarray, fwd_ret: np.ndarray, date: np.ndarray, prefix: str = "val_",
                   quantile: float = 0.2) -> dict:
    """The score against the realised forward return, across the stocks of each date: the mean
    daily Pearson IC and rank IC (Spearman: Pearson of the per-date ranks), each one's IR (mean /
    std of the daily values, not annualised) and the number of dates.  A date with fewer than 2
    stocks, or no spread in the score or the return, has no IC and is left out; with no date left
    the metrics are NaN.  The daily values are ``signals.metrics.daily_ic``'s with ``min_names=2``.

    And the top-minus-bottom ``quantile`` book's daily gross returns (``ls_``): their per-period
    Sharpe ratio, skewness, kurtosis and count, the moments a sweep's deflated Sharpe ratio needs
    (``signals.portfolio.long_short``'s gross returns at horizon 1: every date is a period).

    Every figure is per date, so the rows are taken in date order, whole dates a block of about
    SIGNAL_BLOCK_ROWS rows at a time: the ranks, sums and book of a block are its size, not the
    split's (in one piece they peaked at 210 MiB over the inputs for 1.5M rows; bench/scaling.py).
    A date's rows keep their order, so each date's sums, and every figure, are the same to the bit."""
    score, fwd_ret, date = np.asarray(score), np.asarray(fwd_ret), np.asarray(date)
    rows = np.flatnonzero(np.isfinite(score) & np.isfinite(fwd_ret))
    rows = rows[np.argsort(date[rows], kind="stable")]  # date order; a date's own rows in their order
    sorted_dates = date[rows]
    bounds = np.concatenate([[0], np.flatnonzero(sorted_dates[1:] != sorted_dates[:-1]) + 1, [len(rows)]])
    del sorted_dates
    daily: dict[str, list[np.ndarray]] = {"ic": [], "rank_ic": []}
    book: list[np.ndarray] = []
    first = 0  # the block's first date (an index into bounds)
    while first < len(bounds) - 1:
        last = max(first + 1, int(np.searchsorted(bounds, bounds[first] + SIGNAL_BLOCK_ROWS, side="right")) - 1)
        sizes = np.diff(bounds[first:last + 1])
        block = rows[bounds[first]:bounds[last]]
        x, y = score[block].astype(np.float64), fwd_ret[block].astype(np.float64)
        code = np.repeat(np.arange(len(sizes)), sizes)
        _block_signal(x, y, code, len(sizes), quantile, daily, book)
        first = last
    out = {}
    for name, parts in daily.items():
        values = np.concatenate(parts) if parts else np.zeros(0)
        mean = float(values.mean()) if len(values) else float("nan")
        std = float(values.std(ddof=1)) if len(values) > 1 else float("nan")
        out[f"{prefix}{name}"] = mean
        out[f"{prefix}{name}ir"] = mean / std if std > 0 else float("nan")
        out[f"{prefix}ic_days"] = float(len(values))
    sr, skew, kurt, n = sr_moments(np.concatenate(book) if book else np.zeros(0))
    out.update({f"{prefix}ls_sr": sr, f"{prefix}ls_skew": skew, f"{prefix}ls_kurt": kurt, f"{prefix}ls_days": float(n)})
    return out


def _block_signal(x: np.ndarray, y: np.ndarray, code: np.ndarray, n_dates: int, quantile: float,  # noqa: PLR0913 (a kernel)
                  daily: dict[str, list[np.ndarray]], book: list[np.ndarray]) -> None:
    """One block of whole dates (``code``: 0..n_dates-1): its daily IC and rank IC, and its book's returns."""
    from alchemetric_ray.data.cross_section import group_rank, grouped_corr

    for name, (a, b) in {"ic": (x, y), "rank_ic": (group_rank(x, code), group_rank(y, code))}.items():
        corr, count = grouped_corr(a, b, code, n_dates)
        daily[name].append(corr[(count >= 2) & np.isfinite(corr)])
    book.append(long_short_returns(x, y, code, n_dates, quantile))


def long_short_returns(score: np.ndarray, fwd_ret: np.ndarray, code: np.ndarray, n_dates: int,
                       quantile: float) -> np.ndarray:
    """Per date (``code``) that holds a book, the gross return of the project's long-short book
    (``data.cross_section.long_short_weights``: +0.5 on the longs' mean simple return, -0.5 on the
    shorts'); dates with too few stocks or an empty leg have none."""
    from alchemetric_ray.data.cross_section import book_trades, long_short_weights

    weight = long_short_weights(score, code, n_dates, quantile)
    return np.bincount(code, weight * np.expm1(fwd_ret), n_dates)[book_trades(weight, code, n_dates)]


def sr_moments(returns) -> tuple[float, float, float, int]:
    """Per-period SR (mean / std, ddof=1), skewness, (non-excess) kurtosis, n of finite returns."""
    r = np.asarray(returns, dtype=np.float64).ravel()
    r = r[np.isfinite(r)]
    n = int(r.size)
    if n < 2:
        return float("nan"), float("nan"), float("nan"), n
    sd = float(r.std(ddof=1))
    d = r - r.mean()
    m2 = float(np.mean(d * d))
    if sd == 0 or m2 == 0:
        return float("nan"), float("nan"), float("nan"), n
    sr = float(r.mean()) / sd
    skew = float(np.mean(d**3)) / m2**1.5
    kurt = float(np.mean(d**4)) / m2**2  # Pearson kurtosis: 3 for a normal
    return sr, skew, kurt, n
