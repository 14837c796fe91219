"""``ar.evaluate``'s result: an evaluation report folder read as tables a notebook uses.

An :class:`Evaluation` is built from what the evaluation saved (``evaluation.json``, the record of
:class:`alchemetric_ray.signals.records.Evaluation`, and ``equity.png`` beside it), so the object
``ar.evaluate`` returns and the one ``ar.load_result`` rebuilds from the folder after a kernel
restart are the same.  Where the call still holds the internal record (``live``), :meth:`~Evaluation.figure`
draws the curves themselves; from the folder alone it shows the saved plot.

Nothing here selects a matplotlib backend or imports pyplot: figures are drawn on their own Agg
canvas, and the notebook's display carries the equity curves as a PNG inside the HTML.
"""

from __future__ import annotations

import base64
import copy
import html
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pandas as pd

from alchemetric_ray.errors import EvaluationError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from alchemetric_ray.api.parts import Tracking
    from alchemetric_ray.signals.records import Evaluation as EvaluationRecord
    from alchemetric_ray.storage import Location

EVALUATION_JSON = "evaluation.json"
EQUITY_PNG = "equity.png"
REPORT_MD = "report.md"
SIGNALS_PARQUET = "signals.parquet"

MAX_LINES = 25  # the repr fits on one screen
REPR_CONTENDERS = 14  # contenders listed in the repr; the rest are counted

#: The columns of :attr:`Evaluation.contenders` (and of a walk-forward's pooled table), in order.
CONTENDER_COLUMNS = ("name", "rank_ic", "rank_ic_low", "rank_ic_high", "rank_ic_days", "ic", "ls_sharpe",
                     "ls_annual_return", "balanced_accuracy", "rows", "tickers")
_FLOAT_COLUMNS = ("rank_ic", "rank_ic_low", "rank_ic_high", "ic", "ls_sharpe", "ls_annual_return",
                  "balanced_accuracy")
_FOLD_DATES = ("test_start", "test_end", "train_start", "train_end", "normalized_through")
_PHASES = ("train", "stage", "predict", "baselines")  # a pooled refit's phases, in the order they run


class Segment(NamedTuple):
    """The first and last date (``YYYY-MM-DD``) of the scored segment."""

    start: str
    end: str


@dataclass(frozen=True)
class Verdict:
    """The evaluation's answer: ``signal`` (the model's rank-IC interval excludes 0), ``edge`` (it also
    beats the best baseline on the paired daily difference) and the one ``line`` that says so."""

    signal: bool
    edge: bool
    line: str

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Verdict:
        return cls(signal=bool(record["signal"]), edge=bool(record["edge"]), line=str(record["line"]))

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True, repr=False)
class WalkForward:
    """A walk-forward's tables.  ``kind``: ``"pooled"`` (``ar.evaluate(..., walk_forward=True)``: every
    out-of-sample block pooled and scored once) or ``"folds"`` (``signals.folds``: each fold scored on
    its own).  ``folds``: one row per fold or refit (dates as timestamps; a pooled refit's seconds per
    phase as ``seconds_<phase>`` columns).  Where pooled: ``pooled`` (the contenders on the pool, the
    columns of :attr:`Evaluation.contenders`), its ``verdict``, ``segment``, ``years`` (the per-year
    table) and the refits' schedule and time; where per fold: the mean and spread of the model's rank
    IC and Sharpe ratio over the folds."""

    kind: str
    folds: pd.DataFrame
    pooled: pd.DataFrame | None = None
    verdict: Verdict | None = None
    segment: Segment | None = None
    years: pd.DataFrame | None = None
    refits: int | None = None
    refit_every: int | None = None
    window: str | None = None
    seconds: float | None = None
    rank_ic_mean: float | None = None
    rank_ic_std: float | None = None
    sharpe_mean: float | None = None
    sharpe_std: float | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> WalkForward:
        """From ``evaluation.json``'s ``walk_forward`` section: a ``PooledWalkForward``'s (it has
        ``pooled``) or a ``FoldsWalkForward``'s (``as_dict`` of either, ``signals/walk_forward.py``)."""
        folds = _folds_frame(record.get("folds") or [])
        if "pooled" in record:
            pooled = record["pooled"]
            return cls(kind="pooled", folds=folds, pooled=contenders_frame(pooled.get("rows") or []),
                       verdict=Verdict.from_record(pooled["verdict"]),
                       segment=Segment(pooled["segment"]["start"], pooled["segment"]["end"]),
                       years=pd.DataFrame(record.get("years") or [],
                                          columns=["year", "days", "rank_ic", "ci_low", "ci_high",
                                                   "best_baseline_rank_ic"]).astype(
                           {"rank_ic": float, "ci_low": float, "ci_high": float, "best_baseline_rank_ic": float}),
                       refits=record.get("refits"), refit_every=record.get("refit_every"),
                       window=record.get("window"), seconds=record.get("seconds"))
        return cls(kind="folds", folds=folds, rank_ic_mean=_float(record.get("rank_ic_mean")),
                   rank_ic_std=_float(record.get("rank_ic_std")), sharpe_mean=_float(record.get("sharpe_mean")),
                   sharpe_std=_float(record.get("sharpe_std")))

    def line(self) -> str:
        """One line: what the command prints after a walk-forward."""
        if self.kind == "pooled":
            seg = self.segment or Segment("?", "?")
            days = _int_or_none(self.pooled["rank_ic_days"].iloc[0]) if self.pooled is not None and len(
                self.pooled) else None
            verdict = self.verdict.line if self.verdict else ""
            return (f"walk-forward, pooled out of sample {seg.start}..{seg.end} ({days} days, {self.refits} refits "
                    f"every {self.refit_every} days, {_fmt(self.seconds, '{:.0f}')} s): {verdict}")
        return (f"walk-forward, {len(self.folds)} folds retrained: rank IC {_fmt(self.rank_ic_mean)} "
                f"± {_fmt(self.rank_ic_std)}; long-short Sharpe {_fmt(self.sharpe_mean, '{:.2f}')} "
                f"± {_fmt(self.sharpe_std, '{:.2f}')}")

    def __repr__(self) -> str:
        return f"WalkForward({self.kind}: {self.line()})"


def contenders_frame(rows: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per contender (in the record's order: the deep model first), from ``evaluation.json``'s
    ``rows`` (each ``ContenderRow.as_dict()``): the mean rank IC with its interval and days, the mean
    IC, the long-short book's Sharpe ratio and annual return (NaN where the contender's book never
    traded), the balanced accuracy (NaN for a contender without class probabilities), its rows and
    tickers."""
    table = []
    for row in rows:
        rank_ic, ic = row.get("rank_ic") or {}, row.get("ic") or {}
        long_short = row.get("long_short") or {}
        table.append({"name": row["name"], "rank_ic": _float(rank_ic.get("mean")),
                      "rank_ic_low": _float(rank_ic.get("ci_low")), "rank_ic_high": _float(rank_ic.get("ci_high")),
                      "rank_ic_days": int(rank_ic.get("n_days") or 0), "ic": _float(ic.get("mean")),
                      "ls_sharpe": _float(long_short.get("sharpe")),
                      "ls_annual_return": _float(long_short.get("annual_return")),
                      "balanced_accuracy": _float((row.get("classification") or {}).get("balanced_accuracy")),
                      "rows": int(row.get("rows") or 0), "tickers": int(row.get("tickers") or 0)})
    frame = pd.DataFrame(table, columns=list(CONTENDER_COLUMNS))
    return frame.astype({**dict.fromkeys(_FLOAT_COLUMNS, "float64"), "rank_ic_days": "int64", "rows": "int64",
                         "tickers": "int64"})


class Evaluation:
    """An evaluation: the model against the baselines on one segment.

    ``contenders`` (a DataFrame, one row per contender, the deep model first), ``verdict`` (``signal``
    and ``edge`` as booleans, and the line), ``walk_forward`` (:class:`WalkForward`, or None),
    ``segment`` (start, end), ``tickers``, ``best_baseline``; the report folder (``folder``), its
    ``report`` (``report.md``), ``equity_png`` and ``signals_file``; :meth:`figure` (the equity curves
    as a matplotlib Figure) and :meth:`as_dict` (``evaluation.json``); ``mlflow`` where the call
    logged it into a registered model's run.  Build one with :meth:`from_folder` or :meth:`from_record`."""

    kind = "evaluation"  # its name in result.json

    def __init__(self, record: Mapping[str, Any], folder: str | Path | Location | None = None, *,
                 live: EvaluationRecord | None = None, mlflow: Tracking | None = None):
        from alchemetric_ray.storage import locate

        self._where = locate(folder) if folder is not None else None
        try:
            self._record = copy.deepcopy(dict(record))
            self._contenders = contenders_frame(record["rows"])
            self._verdict = Verdict.from_record(record["verdict"])
            segment = record["segment"]
            self._segment = Segment(str(segment["start"]), str(segment["end"]))
            wf = record.get("walk_forward")
            self._walk_forward = WalkForward.from_record(wf) if wf else None
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            where = f" in {self._where / EVALUATION_JSON}" if self._where is not None else ""
            raise EvaluationError(f"not an evaluation record{where}: {type(err).__name__} {err}") from None
        self._live = live
        self.mlflow = mlflow

    # ----------------------------------------------------------------------------------------------
    # building

    @classmethod
    def from_folder(cls, path: str | Path | Location, *, live: EvaluationRecord | None = None) -> Evaluation:
        """Read an evaluation report folder (a local path, or object storage's URI): its
        ``evaluation.json``, with ``equity.png`` and ``report.md`` beside it.  FileNotFoundError where
        the folder holds no ``evaluation.json``; :class:`~alchemetric_ray.errors.EvaluationError` where
        it does not read as one."""
        from alchemetric_ray.storage import locate

        where = locate(path)
        file = where / EVALUATION_JSON
        if not file.is_file():
            raise FileNotFoundError(f"{where} is not an evaluation report folder: it holds no {EVALUATION_JSON}")
        try:
            record = json.loads(file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise EvaluationError(f"{file} does not read as JSON: {err}") from None
        if not isinstance(record, dict):
            raise EvaluationError(f"{file} holds no evaluation record (a JSON {type(record).__name__})")
        return cls(record, where, live=live)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], folder: str | Path | Location | None = None, *,
                    live: EvaluationRecord | None = None) -> Evaluation:
        """From ``evaluation.json``'s dict (or :meth:`record`'s, which adds ``mlflow``), and the report
        folder it came from (for the plot and the report); ``live``: the internal record it was
        written from, for :meth:`figure`."""
        record = dict(record)
        tracked = record.pop("mlflow", None)
        mlflow = None
        if tracked:
            from alchemetric_ray.api.parts import Tracking

            mlflow = Tracking(**tracked)
        return cls(record, folder, live=live, mlflow=mlflow)

    @classmethod
    def from_live(cls, live: EvaluationRecord, folder: str | Path | Location | None = None) -> Evaluation:
        """From the internal record :func:`alchemetric_ray.signals.evaluate.evaluate` returns, read as
        ``evaluation.json`` holds it (the same JSON round trip), and the folder it wrote."""
        from alchemetric_ray.fsutil import json_bytes

        return cls(json.loads(json_bytes(live.as_dict())), folder, live=live)

    def record(self) -> dict[str, Any]:
        """What ``result.json`` keeps of it: ``evaluation.json``'s record, with ``mlflow`` where set."""
        import dataclasses

        record = self.as_dict()
        if self.mlflow is not None:
            record["mlflow"] = dataclasses.asdict(self.mlflow)
        return record

    # ----------------------------------------------------------------------------------------------
    # what it holds

    @property
    def contenders(self) -> pd.DataFrame:
        """One row per contender, the deep model first (columns: :data:`CONTENDER_COLUMNS`)."""
        return self._contenders

    @property
    def verdict(self) -> Verdict:
        return self._verdict

    @property
    def walk_forward(self) -> WalkForward | None:
        return self._walk_forward

    @property
    def segment(self) -> Segment:
        return self._segment

    @property
    def tickers(self) -> int:
        return int(self._record.get("tickers") or 0)

    @property
    def best_baseline(self) -> str | None:
        return self._record.get("best_baseline")

    @property
    def new_data(self) -> bool:
        """Whether it scored new data (``data=``) rather than the model's test segment."""
        return bool(self._record.get("data"))

    @property
    def folder(self) -> Path | str | None:
        """The report folder: a local Path, object storage's URI, or None for a record read without one."""
        return _shown(self._where)

    def _location(self, name: str) -> Location | None:
        return self._where / name if self._where is not None else None

    @property
    def report(self) -> Path | str | None:
        """``report.md``: the Markdown report."""
        return _shown(self._location(REPORT_MD))

    @property
    def equity_png(self) -> Path | str | None:
        """``equity.png``: the equity curves as saved."""
        return _shown(self._location(EQUITY_PNG))

    @property
    def signals_file(self) -> Path | str | None:
        """``signals.parquet``: the model's signals on the scored rows."""
        return _shown(self._location(SIGNALS_PARQUET))

    @property
    def tear_sheet(self) -> dict[str, Any] | None:
        """The tear sheet of the model's signal on the scored segment (``evaluation.json``'s
        ``tear_sheet``; ``signals/tearsheet.py`` defines each figure): ``quantile_returns``,
        ``ic_decay`` and ``ic_by_month`` as DataFrames, ``spread`` and ``turnover`` as dicts, ``horizon``,
        ``quantiles``, and ``pngs``, its plots (paths beside the report where the folder is known).
        None for a record written before the tear sheet."""
        sheet = self._record.get("tear_sheet")
        if not sheet:
            return None
        tables = {key: pd.DataFrame(sheet.get(key) or [], columns=columns) for key, columns in
                  (("quantile_returns", ["quantile", "mean", "days"]), ("ic_decay", ["horizon", "mean", "days"]),
                   ("ic_by_month", ["month", "mean", "days"]))}
        for table in tables.values():
            table["mean"] = table["mean"].astype("float64")  # None (undefined) as NaN
        pngs = [_shown(self._location(name)) or name for name in sheet.get("pngs") or []]
        return {**copy.deepcopy(sheet), **tables, "pngs": pngs}

    @property
    def seeds(self) -> pd.DataFrame | None:
        """A seed ensemble's members (``train.seeds``), each scored alone on the segment: one row per
        seed with its rank IC (``evaluation.json``'s ``seeds``); None for a model of one seed."""
        spread = self._record.get("seeds")
        if not spread:
            return None
        return pd.DataFrame({"seed": spread["seeds"], "rank_ic": pd.Series(spread["rank_ic"], dtype="float64")})

    def as_dict(self) -> dict[str, Any]:
        """``evaluation.json``'s record (a copy)."""
        return copy.deepcopy(self._record)

    # ----------------------------------------------------------------------------------------------
    # the equity curves

    def figure(self) -> Figure:
        """The equity curves as a matplotlib Figure (on its own Agg canvas; no backend is selected):
        drawn from the contenders' curves where this object holds the internal record, else the
        saved ``equity.png`` shown in one axes.  In a notebook, a Figure displays once pyplot is
        imported; ``fig.savefig(...)`` works without it."""
        if self._live is not None:
            from alchemetric_ray.signals.report import plot_equity

            return plot_equity(self._live)
        png = self._saved_png()
        if png is None:
            where = self._location(EQUITY_PNG)
            raise FileNotFoundError(f"no equity curves to show: {where} does not exist" if where is not None else
                                    "no equity curves to show: this evaluation was read without its folder")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.image import imread

        image = imread(io.BytesIO(png), format="png")
        dpi = 100
        fig = Figure(figsize=(image.shape[1] / dpi, image.shape[0] / dpi), dpi=dpi)
        FigureCanvasAgg(fig)  # its own canvas: no backend is selected, pyplot is not imported
        ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
        ax.imshow(image)
        ax.set_axis_off()
        return fig

    def _saved_png(self) -> bytes | None:
        where = self._location(EQUITY_PNG)
        return where.read_bytes() if where is not None and where.is_file() else None

    def _png(self) -> bytes | None:
        """The equity curves as PNG bytes: the saved file, else drawn from the internal record."""
        png = self._saved_png()
        if png is not None or self._live is None:
            return png
        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="png")
        return buffer.getvalue()

    # ----------------------------------------------------------------------------------------------
    # display

    def _title(self) -> str:
        model = self._record.get("model") or {}
        what = "new data" if self.new_data else "test segment"
        name = f" of {model.get('name')}" + (f" ({model['id']})" if model.get("id") else "") if model else ""
        return f"Evaluation{name}: {what} {self.segment.start}..{self.segment.end}, {self.tickers} tickers"

    def __repr__(self) -> str:
        lines = [self._title()]
        table = _compact(self.contenders)
        shown = table.head(REPR_CONTENDERS)
        lines += ["  " + line for line in shown.to_string(index=False).splitlines()]
        if len(shown) < len(table):
            lines.append(f"  ... {len(table) - len(shown)} more contenders")
        lines.append(f"verdict: {self.verdict.line}")
        if self.walk_forward is not None:
            lines.append(self.walk_forward.line())
        if self.report is not None:
            lines.append(f"report: {self.report}")
        return "\n".join(lines[:MAX_LINES])

    def _repr_html_(self) -> str:
        parts = [f"<div><strong>{html.escape(self._title())}</strong>",
                 _compact(self.contenders).to_html(index=False, border=0),
                 f"<p><strong>verdict:</strong> {html.escape(self.verdict.line)}</p>"]
        if self.walk_forward is not None:
            parts.append(f"<p>{html.escape(self.walk_forward.line())}</p>")
        png = self._png()
        if png is not None:
            parts.append(f'<img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" '
                         'alt="equity curves" style="max-width:100%"/>')
        if self.report is not None:
            parts.append(f"<p>report: <code>{html.escape(str(self.report))}</code></p>")
        parts.append("</div>")
        return "".join(parts)


def _compact(contenders: pd.DataFrame) -> pd.DataFrame:
    """The contenders as the terminal's verdict table shows them: text cells, n/a where undefined."""
    return pd.DataFrame({
        "contender": contenders["name"],
        "rank IC [95% CI]": [f"{_fmt(m, '{:+.4f}')} [{_fmt(lo, '{:+.4f}')}, {_fmt(hi, '{:+.4f}')}]"
                             for m, lo, hi in zip(contenders["rank_ic"], contenders["rank_ic_low"],
                                                  contenders["rank_ic_high"])],
        "IC": [_fmt(v, "{:+.4f}") for v in contenders["ic"]],
        "L/S Sharpe": [_fmt(v, "{:.2f}") for v in contenders["ls_sharpe"]],
        "L/S return": [_fmt(v, "{:.1%}") for v in contenders["ls_annual_return"]],
        "bal. acc": [_fmt(v) for v in contenders["balanced_accuracy"]]})


def _folds_frame(folds: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per fold (``FoldRow.as_dict()``): its dates as timestamps, its seconds per phase as
    ``seconds_<phase>`` columns where it has them."""
    rows = []
    for fold in folds:
        row = {k: v for k, v in fold.items() if k != "seconds"}
        seconds = fold.get("seconds") or {}
        ordered = [*(phase for phase in _PHASES if phase in seconds), *(p for p in seconds if p not in _PHASES)]
        row.update({f"seconds_{phase}": seconds[phase] for phase in ordered})
        rows.append(row)
    columns = ["fold", *_FOLD_DATES, "days", "rank_ic", "sharpe", "best_baseline_rank_ic"]
    extra = [c for c in dict.fromkeys(k for row in rows for k in row) if c not in columns]
    frame = pd.DataFrame(rows, columns=columns + extra)
    for column in _FOLD_DATES:
        frame[column] = pd.to_datetime(frame[column])
    return frame.astype({"rank_ic": "float64", "sharpe": "float64", "best_baseline_rank_ic": "float64"})


def _shown(where: Location | None) -> Path | str | None:
    """A location as a person uses it: a local Path, or object storage's URI."""
    if where is None:
        return None
    return where.local if where.is_local else where.uri


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def _fmt(value: Any, fmt: str = "{:.4f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return fmt.format(value)
