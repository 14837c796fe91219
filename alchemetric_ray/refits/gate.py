"""The promotion gate: is the challenger not worse than the champion on the same out-of-sample days?

Both models score the same days (the days after the champion's test segment, which neither trained
on).  The gate passes when

* the lower bound of the paired daily (challenger - champion) rank-IC difference is at least
  ``-refit.margin`` (pairing by date removes the market's day-to-day noise both share;
  :func:`~alchemetric_ray.signals.metrics.ic_difference`, Newey-West at the label's lags), on those
  days and, with ``refit.walk_forward``, on the pooled walk-forward as well; and
* the challenger's deflated Sharpe ratio of the long-short book (its probabilistic Sharpe ratio where
  one trial stands behind the model) is at most ``refit.max_dsr_drop`` below the champion's.

"Not worse", not "better": a nightly refit replaces a model with one trained on newer data unless the
evidence says it ranks worse, so a tie promotes.  A challenger without a finite figure fails the check
that needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from alchemetric_ray.config import RefitConfig
from alchemetric_ray.signals import metrics as sm


def _dsr(row: Any) -> float:
    """The book's deflated Sharpe ratio where trials stand behind the model, else its PSR (one trial)."""
    value = row.dsr if row.dsr is not None else row.psr
    return float(value) if value is not None else float("nan")


@dataclass(frozen=True)
class Comparison:
    """Champion and challenger on one set of days: each one's mean rank IC, the paired difference."""

    what: str  # "the appended days", "the pooled walk-forward"
    start: str
    end: str
    champion_ic: float
    challenger_ic: float
    difference: sm.ICDifference

    @classmethod
    def of(cls, what: str, start: str, end: str, champion: sm.ICStats, challenger: sm.ICStats) -> Comparison:
        return cls(what, start, end, champion.mean, challenger.mean,
                   sm.ICDifference(*sm.ic_difference(challenger, champion)))

    def passes(self, margin: float) -> bool:
        return math.isfinite(self.difference.ci_low) and self.difference.ci_low >= -margin

    def text(self) -> str:
        d = self.difference
        return (f"on {self.what} {self.start}..{self.end} ({d.n_days} days) rank IC {self.challenger_ic:+.4f} vs "
                f"{self.champion_ic:+.4f}, paired difference {d.mean:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}]")

    def as_dict(self) -> dict[str, Any]:
        return {"what": self.what, "start": self.start, "end": self.end, "champion_rank_ic": self.champion_ic,
                "challenger_rank_ic": self.challenger_ic, "difference": self.difference.as_dict()}


@dataclass(frozen=True)
class GateResult:
    """The gate's answer, its figures and the reasons it gives (the failed checks, or what passed)."""

    passed: bool
    comparisons: list[Comparison]
    champion_dsr: float
    challenger_dsr: float
    margin: float
    max_dsr_drop: float
    reasons: list[str] = field(default_factory=list)

    def reason(self) -> str:
        return "; ".join(self.reasons)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "comparisons": [c.as_dict() for c in self.comparisons],
                "champion_dsr": _json_number(self.champion_dsr), "challenger_dsr": _json_number(self.challenger_dsr),
                "margin": self.margin, "max_dsr_drop": self.max_dsr_drop, "reasons": self.reasons}


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def gate(comparisons: list[Comparison], champion_row: Any, challenger_row: Any, refit: RefitConfig) -> GateResult:
    """The gate on ``comparisons`` (the appended days first) and the two models' rows on those days
    (``signals.contenders.ContenderRow``: their deflated or probabilistic Sharpe ratios)."""
    reasons, passed = [], True
    for c in comparisons:
        ok = c.passes(refit.margin)
        passed &= ok
        bound = f"lower bound {c.difference.ci_low:+.4f} {'>=' if ok else '<'} -{refit.margin:g} (refit.margin)"
        reasons.append(f"{c.text()}: {bound}")
    champion, challenger = _dsr(champion_row), _dsr(challenger_row)
    drop = champion - challenger
    if math.isnan(challenger) and not math.isnan(champion):
        passed = False
        reasons.append(f"deflated Sharpe: the challenger's is undefined (no long-short book), the champion's "
                       f"{champion:.3f}")
    elif math.isfinite(drop):
        ok = drop <= refit.max_dsr_drop
        passed &= ok
        reasons.append(f"deflated Sharpe {challenger:.3f} vs {champion:.3f}: a drop of {max(drop, 0.0):.3f} "
                       f"{'<=' if ok else '>'} {refit.max_dsr_drop:g} (refit.max_dsr_drop)")
    else:
        reasons.append("deflated Sharpe: the champion's is undefined (no long-short book): not compared")
    return GateResult(passed, comparisons, champion, challenger, refit.margin, refit.max_dsr_drop, reasons)
