"""Feature normalization fitted on the train segment only, in bounded memory.

``zscore``: exact mean and std from running sums (float64).  ``robust``: median and IQR/1.349
from a seeded uniform reservoir sample of at most ``RESERVOIR`` train rows.  The fitted
statistics are plain lists in the manifest and are reused for val, test and inference.
Normalized values are clipped to +-``CLIP`` so one broken bar cannot dominate a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

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


class NormalizerFit:
    """Accumulate train rows chunk by chunk, then ``finish()`` into a :class:`Normalizer`."""

    def __init__(self, method: str, names: list[str], seed: int = 0):
        self.method, self.names = method, names
        k = len(names)
        self.n = 0
        self.sum = np.zeros(k)
        self.sumsq = np.zeros(k)
        self.shift: np.ndarray | None = None  # first chunk's mean, for a stable variance
        self.rng = np.random.default_rng(seed)
        self.sample = np.empty((0, k))
        self.seen = 0

    def add(self, x: np.ndarray) -> None:
        if len(x) == 0:
            return
        x = np.asarray(x, dtype=np.float64)
        if self.method == "zscore":
            if self.shift is None:
                self.shift = x.mean(axis=0)
            xs = x - self.shift
            self.n += len(x)
            self.sum += xs.sum(axis=0)
            self.sumsq += (xs * xs).sum(axis=0)
        else:
            self._reservoir(x)

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
        if self.method == "zscore":
            if self.n == 0:
                raise ValueError("no train rows to fit the normalization on")
            mean = self.sum / self.n
            var = np.maximum(self.sumsq / self.n - mean**2, 0.0) * self.n / max(self.n - 1, 1)
            center = mean + cast(np.ndarray, self.shift)  # the first chunk's mean: n > 0
            scale = np.sqrt(var)
        else:
            if len(self.sample) == 0:
                raise ValueError("no train rows to fit the normalization on")
            center = np.median(self.sample, axis=0)
            q75, q25 = np.percentile(self.sample, [75, 25], axis=0)
            scale = (q75 - q25) / 1.349
        scale = np.where(np.isfinite(scale) & (scale > 1e-12), scale, 1.0)
        return Normalizer(self.method, list(self.names), [float(v) for v in center], [float(v) for v in scale])
