"""Feature normalization fitted on the train segment only, in bounded memory.

``zscore``: mean and std (float64) from each ticker's count, mean and sum of squared deviations
(:func:`run_moments`, computed where the ticker's rows are: a build's Ray task per group), merged in
ticker order (:func:`merge_moments`, Chan et al.'s pairwise update), so the statistics do not depend on
how the tickers were grouped or where.  ``robust``: median and IQR/1.349 from a seeded uniform reservoir
sample of at most ``RESERVOIR`` train rows (:class:`NormalizerFit`, streaming, in row order).  The fitted
statistics are plain lists in the manifest and are reused for val, test and inference.
Normalized values are clipped to +-``CLIP`` so one broken bar cannot dominate a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

RESERVOIR = 200_000
CLIP = 10.0


@dataclass
class Normalizer:
    method: str
    names: list[str]
    center: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    clip: float = CLIP

    def apply(self, x: np.ndarray) -> np.ndarray:
        out = (x - np.asarray(self.center, dtype=np.float64)) / np.asarray(self.scale, dtype=np.float64)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def apply_column(self, x: np.ndarray, j: int) -> np.ndarray:
        """Feature ``j``'s column alone, as :meth:`apply` gives it (the same arithmetic, value for value),
        without a (rows, features) matrix to build and slice."""
        out = (x - np.float64(self.center[j])) / np.float64(self.scale[j])
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def as_dict(self) -> dict:
        return {"method": self.method, "names": self.names, "center": self.center, "scale": self.scale,
                "clip": self.clip}

    @classmethod
    def from_dict(cls, d: dict) -> "Normalizer":
        return cls(d["method"], list(d["names"]), list(d["center"]), list(d["scale"]), d.get("clip", CLIP))


@dataclass
class Moments:
    """Runs of rows (a ticker's train rows each): their counts, means and sums of squared deviations."""

    n: np.ndarray  # (runs,)
    mean: np.ndarray  # (runs, features)
    m2: np.ndarray  # (runs, features)


def run_moments(columns: list[np.ndarray], starts: np.ndarray) -> Moments:
    """The moments of each run of rows of ``columns`` (one array per feature, of the same rows), runs
    starting at ``starts`` (sorted, the first 0; none for no row).  A column at a time: no rows x features
    matrix."""
    rows = len(columns[0]) if columns else 0
    n = np.diff(np.append(starts, rows)).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
    mean, m2 = np.empty((len(n), len(columns))), np.empty((len(n), len(columns)))
    for j, column in enumerate(columns):
        if not rows:
            break
        c = np.asarray(column, dtype=np.float64)
        mean[:, j] = np.add.reduceat(c, starts) / n
        dev = c - np.repeat(mean[:, j], n)
        m2[:, j] = np.add.reduceat(dev * dev, starts)
    return Moments(n, mean, m2)


def merge_moments(parts: list[Moments], k: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Every run of ``parts``, in order, merged into one count, mean and sum of squared deviations
    (``k`` features)."""
    total, mean, m2 = 0, np.zeros(k), np.zeros(k)
    for part in parts:
        for n_b, mean_b, m2_b in zip(part.n.tolist(), part.mean, part.m2):
            both = total + n_b
            delta = mean_b - mean
            mean = mean + delta * (n_b / both)
            m2 = m2 + m2_b + delta * delta * (total * n_b / both)
            total = both
    return total, mean, m2


def zscore_from_moments(names: list[str], parts: list[Moments]) -> Normalizer:
    """The ``zscore`` normalizer of the rows of ``parts`` (ValueError for none)."""
    n, mean, m2 = merge_moments(parts, len(names))
    if n == 0:
        raise ValueError("no train rows to fit the normalization on")
    scale = np.sqrt(m2 / max(n - 1, 1))
    return _normalizer("zscore", names, mean, scale)


def _normalizer(method: str, names: list[str], center: np.ndarray, scale: np.ndarray) -> Normalizer:
    scale = np.where(np.isfinite(scale) & (scale > 1e-12), scale, 1.0)
    return Normalizer(method, list(names), [float(v) for v in center], [float(v) for v in scale])


class NormalizerFit:
    """The ``robust`` fit: train rows chunk by chunk into a seeded reservoir, then ``finish()`` into a
    :class:`Normalizer` (``zscore`` comes from per-ticker moments: :func:`zscore_from_moments`)."""

    def __init__(self, method: str, names: list[str], seed: int = 0):
        if method != "robust":
            raise ValueError(f"NormalizerFit fits 'robust' only, not {method!r} (zscore: zscore_from_moments)")
        self.method, self.names = method, names
        self.rng = np.random.default_rng(seed)
        self.sample = np.empty((0, len(names)))
        self.seen = 0

    def add(self, x: np.ndarray) -> None:
        if len(x):
            self._reservoir(np.asarray(x, dtype=np.float64))

    def _reservoir(self, x: np.ndarray) -> None:
        room = RESERVOIR - len(self.sample)
        if room > 0:
            self.sample = np.vstack([self.sample, x[:room]])
            self.seen += min(room, len(x))
            x = x[room:]
        if len(x):
            # Algorithm R, vectorised: row j of the stream (1-based index seen + j) replaces a
            # random slot with probability RESERVOIR / index.
            idx = self.seen + np.arange(1, len(x) + 1)
            slots = (self.rng.random(len(x)) * idx).astype(np.int64)
            keep = slots < RESERVOIR
            self.sample[slots[keep]] = x[keep]
            self.seen += len(x)

    def finish(self) -> Normalizer:
        if len(self.sample) == 0:
            raise ValueError("no train rows to fit the normalization on")
        center = np.median(self.sample, axis=0)
        q75, q25 = np.percentile(self.sample, [75, 25], axis=0)
        return _normalizer(self.method, self.names, center, (q75 - q25) / 1.349)
