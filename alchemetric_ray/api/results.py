"""What the API's calls return: typed results a notebook reads, each saved as ``result.json``.

Every result is built from plain data (its *record*, what ``result.json`` holds under ``"result"``),
so the object a call returns and the one :func:`~alchemetric_ray.api.history.load_result` rebuilds
after a kernel restart are the same.  Live extras (the loaded model, the internal records) are kept
where the call had them and loaded on first use where it did not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alchemetric_ray.api.display import Showable, Shown, listed
from alchemetric_ray.api.parts import BestEpoch, Plan, Tracking

if TYPE_CHECKING:
    import pandas as pd

    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.api.model import Model
    from alchemetric_ray.config import RunConfig

def _config(raw: dict | None) -> RunConfig | None:
    from alchemetric_ray.config import RunConfig

    return RunConfig.from_dict(raw) if raw else None


def _frame(rows: list[dict], columns: list[str] | None = None) -> pd.DataFrame:
    import pandas as pd

    return _numeric(pd.DataFrame(rows, columns=columns))


def _numeric(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns of numbers and missing values (None) as floats, as they read back from result.json."""
    import pandas as pd

    for column in frame.columns:
        values = frame[column]
        if values.dtype == object and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                                          for v in values):
            frame[column] = pd.to_numeric(values, errors="coerce").astype(float)
    return frame


def _table(frame: pd.DataFrame) -> dict[str, Any]:
    """A DataFrame as result.json keeps it: its columns in order (the file's keys are sorted), then rows."""
    return {"columns": [str(c) for c in frame.columns], "rows": frame.astype(object).where(frame.notna(), None)
            .values.tolist()}


def _untable(table: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame(table.get("rows") or [], columns=table.get("columns") or [])
    return _numeric(frame.infer_objects())


class _Saved(Showable):
    """A result with a record: ``kind`` names it in ``result.json``."""

    kind = ""

    def record(self) -> dict[str, Any]:  # pragma: no cover - every result defines it
        raise NotImplementedError


class _Plain(_Saved):
    """A result whose record is its own fields (a dataclass of plain data)."""

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_record(cls, record: dict[str, Any]):
        return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})  # type: ignore[arg-type]


@dataclass(repr=False)
class Shards(_Plain):
    """``ar.features``: the shard folder, its tickers, dates, features, split dates and rows."""

    where: str
    tickers: list[str]
    first_date: str | None
    last_date: str | None
    features: list[str]
    splits: dict[str, Any]
    rows: dict[str, int]
    label: dict[str, Any]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    kind = "features"

    @classmethod
    def of(cls, summary) -> Shards:
        manifest = summary.manifest
        splits = dict(manifest.splits)
        return cls(where=str(summary.out), tickers=list(manifest.tickers), first_date=splits.get("train_start"),
                   last_date=splits.get("test_end"), features=list(manifest.features), splits=splits,
                   rows=dict(manifest.rows), label=dict(manifest.label), seconds=round(summary.seconds, 3),
                   notes=list(manifest.notes()))

    def line(self) -> str:
        rows = self.rows
        return (f"wrote {self.where}: {len(self.tickers)} tickers, {len(self.features)} features, "
                f"rows train/val/test = {rows.get('train')}/{rows.get('val')}/{rows.get('test')} "
                f"in {self.seconds:.1f}s")

    def shown(self) -> Shown:
        return Shown(f"Shards {self.where}", [
            ("tickers", listed(self.tickers)),
            ("dates", f"{self.first_date}..{self.last_date}"),
            ("features", listed(self.features)),
            ("label", self.label.get("scheme")),
            ("rows", ", ".join(f"{k} {v}" for k, v in self.rows.items())),
            ("splits", ", ".join(f"{k} {v}" for k, v in self.splits.items() if k.endswith(("_start", "_end")))),
            ("seconds", self.seconds)])


@dataclass(repr=False)
class RefitResult(_Plain):
    """``ar.refit``: promoted or kept and why, the champion before and after, the challenger, the days
    judged, the gate's figures (``gate``: comparisons, deflated Sharpe ratios, reasons), the signals file."""

    model: str
    decision: str
    reason: str
    line: str
    champion: str | None = None
    challenger: str | None = None
    now_champion: str | None = None
    appended: str | None = None
    window: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    folder: str | None = None
    signals: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    kind = "refit"

    @classmethod
    def of(cls, outcome) -> RefitResult:
        return cls.from_record(outcome.as_dict())

    @property
    def promoted(self) -> bool:
        return self.decision == "promoted"

    def shown(self) -> Shown:
        rows: list[tuple[str, Any]] = [("decision", self.decision), ("champion", self.now_champion),
                                       ("was", self.champion), ("challenger", self.challenger)]
        if self.window:
            rows.append(("days judged", f"{self.window.get('start')}..{self.window.get('end')} "
                                        f"({self.window.get('days')})"))
        for reason in (self.gate or {}).get("reasons", []):
            rows.append(("gate", reason))
        rows += [("signals", self.signals), ("folder", self.folder), ("seconds", self.seconds)]
        return Shown(f"Refit of {self.model}: {self.line}", rows)


class _WithModel(_Saved):
    """A result with an exported model: ``.model`` is the loaded model, loaded once."""

    model_dir: str | None
    config: RunConfig | None
    mlflow: Tracking | None
    evaluation: Evaluation | None
    _model: Model | None = None

    def _shared_record(self) -> dict[str, Any]:
        """The record's parts every run result has: its config, its MLflow run, its evaluation's folder."""
        return {"config": self.config.to_dict() if self.config else None,
                "mlflow": dataclasses.asdict(self.mlflow) if self.mlflow else None,
                "evaluation": str(self.evaluation.folder) if self.evaluation is not None else None}

    @staticmethod
    def _shared_fields(record: dict[str, Any]) -> dict[str, Any]:
        """Those parts read back (:meth:`_shared_record`)."""
        return {"config": _config(record.get("config")),
                "mlflow": Tracking(**record["mlflow"]) if record.get("mlflow") else None,
                "evaluation": _evaluation(record.get("evaluation"))}

    @property
    def model(self) -> Model | None:
        """The exported model, loaded on first use (or already loaded by the call that made this)."""
        if self._model is None and self.model_dir:
            from alchemetric_ray.api.model import Model

            self._model = Model.load(self.model_dir)
        return self._model


@dataclass(repr=False, eq=False)
class TrainResult(_WithModel):
    """``ar.train``: the run's history (a DataFrame, one row per epoch, ``epoch`` from 1), its best epoch,
    the exported model, the plan with its reasons, the evaluation (``evaluate=True``) and MLflow's run."""

    name: str
    run_dir: str
    model_dir: str | None
    history: pd.DataFrame
    best: BestEpoch
    epochs_run: int
    stopped_early: bool
    seconds: float
    plan: Plan
    device: str | None
    precision: dict[str, Any] | None
    tensorboard: str | None
    config: RunConfig | None
    mlflow: Tracking | None = None
    evaluation: Evaluation | None = None
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase of the loop (rank 0), summed
    seeds: list[dict[str, Any]] = field(default_factory=list)  # train.seeds > 1: each seed's run, in seed order
    kind = "train"

    @classmethod
    def of(cls, outcome, cfg: RunConfig) -> TrainResult:
        from alchemetric_ray.scoring.objective import selection_metric

        config = outcome.config or cfg
        summary = outcome.summary
        best_metrics = dict(outcome.best_metrics or {})
        best_epoch = best_metrics.get("epoch")
        fields = dict(name=outcome.run_name, run_dir=str(outcome.run_path), model_dir=_str(outcome.model_dir),
                      history=_frame(list(summary.history)),
                      best=BestEpoch(epoch=int(best_epoch) if best_epoch is not None else None,
                                     metric=selection_metric(config), value=summary.best,
                                     metrics={k: v for k, v in best_metrics.items() if _plain(v)}),
                      epochs_run=summary.epochs_run, stopped_early=summary.stopped_early,
                      seconds=round(outcome.seconds, 3),
                      plan=Plan(outcome.plan.as_dict(), outcome.plan.describe()), device=summary.device,
                      precision=summary.precision, tensorboard=_str(outcome.tensorboard), config=config,
                      mlflow=Tracking.of(outcome.log, cfg.tracking.mlflow_uri), phases=_phases(summary.phases))
        return cls(**{**fields, **_seed_fields(outcome)})

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "run_dir": self.run_dir, "phases": self.phases, "model_dir": self.model_dir,
                "history": _table(self.history), "best": dataclasses.asdict(self.best),
                "epochs_run": self.epochs_run, "stopped_early": self.stopped_early, "seconds": self.seconds,
                "plan": {"fields": self.plan.fields, "text": self.plan.text}, "device": self.device,
                "precision": self.precision, "tensorboard": self.tensorboard, "seeds": self.seeds,
                **self._shared_record()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrainResult:
        return cls(name=record["name"], run_dir=record["run_dir"], model_dir=record.get("model_dir"),
                   history=_untable(record.get("history") or {}), best=BestEpoch(**record["best"]),
                   epochs_run=record["epochs_run"], stopped_early=record["stopped_early"],
                   seconds=record["seconds"], plan=Plan(**record["plan"]), device=record.get("device"),
                   precision=record.get("precision"), tensorboard=record.get("tensorboard"),
                   phases=record.get("phases") or {}, seeds=record.get("seeds") or [], **cls._shared_fields(record))

    def lines(self) -> list[str]:
        """What the command prints after the run: the run, the saved model, TensorBoard and MLflow."""
        stopped = ", stopped early" if self.stopped_early else ""
        value = self.best.value if self.best.value is None else round(self.best.value, 4)
        lines = [f"run {self.name}: {self.epochs_run} epoch(s), best {self.best.metric} {value}{stopped} "
                 f"in {self.seconds:.0f}s"]
        if self.seeds:  # a seed ensemble: every seed's run, not only the last one's
            runs = ", ".join(f"{s['name']} {s['epochs_run']} epoch(s) {_num(s['best'])}" for s in self.seeds)
            lines = [f"runs of the {len(self.seeds)} seeds, best {self.best.metric} of each: {runs}; "
                     f"{self.seconds:.0f}s in all"]
        if self.model_dir:
            lines.append(f"saved model: {self.model_dir} (model card: {Path(self.model_dir) / 'model_card.md'})")
        return lines

    def tensorboard_command(self) -> str | None:
        """The command that shows the run's TensorBoard (a seed ensemble's: every seed's run, named)."""
        boards = [(s["name"], s["tensorboard"]) for s in self.seeds if s.get("tensorboard")]
        if boards:
            return "tensorboard --logdir_spec " + ",".join(f"{name}:{board}" for name, board in boards)
        return f"tensorboard --logdir {self.tensorboard}" if self.tensorboard else None

    def shown(self) -> Shown:
        facts: list[tuple[str, Any]] = [
            ("best", f"epoch {self.best.epoch}: {self.best.metric} {_num(self.best.value)}"),
            ("epochs", f"{self.epochs_run}{' (stopped early)' if self.stopped_early else ''} in {self.seconds:.0f}s"),
            ("device", f"{self.device} {(self.precision or {}).get('mode', '')}".strip()),
            ("plan", f"{self.plan.workers} worker(s), use_gpu {self.plan.use_gpu}"),
            ("model_dir", self.model_dir), ("run_dir", self.run_dir)]
        if self.evaluation is not None:
            facts.append(("verdict", self.evaluation.verdict.line))
        if self.mlflow:
            facts.append(("mlflow", self.mlflow.line()))
        return Shown(f"TrainResult {self.name}", facts, _compact(self.history), "history")


def _seed_fields(outcome) -> dict[str, Any]:
    """A seed ensemble's ``seeds`` (each run: name, folder, epochs, best value, seconds, TensorBoard), its
    ``history`` (every seed's epochs, a ``seed`` column first) and its ``seconds`` (all the runs')."""
    runs = list(getattr(outcome, "seeds", None) or [])
    if not runs:
        return {}
    seeds = [{"seed": i, "name": run.run_name, "run_dir": str(run.run_path), "epochs_run": run.summary.epochs_run,
              "best": run.summary.best, "seconds": round(run.seconds, 3), "tensorboard": _str(run.tensorboard)}
             for i, run in enumerate(runs)]
    import pandas as pd

    history = pd.concat([_frame(list(run.summary.history)).assign(seed=i) for i, run in enumerate(runs)],
                        ignore_index=True)
    history = history[["seed", *[c for c in history.columns if c != "seed"]]]
    return {"seeds": seeds, "history": history, "seconds": round(sum(s["seconds"] for s in seeds), 3)}


@dataclass(repr=False, eq=False)
class SweepResult(_WithModel):
    """``ar.tune``: one row per trial (its config, best metric, epochs, whether stopped early), the best
    trial, the exported model, the sweep report and MLflow's version of the exported trial."""

    name: str
    path: str
    metric: str
    mode: str
    trials: pd.DataFrame
    best: dict[str, Any]
    model_dir: str | None
    report: str | None
    test_metrics: dict[str, Any] | None
    config: RunConfig | None
    mlflow: Tracking | None = None
    evaluation: Evaluation | None = None
    kind = "sweep"

    @classmethod
    def of(cls, outcome, cfg: RunConfig) -> SweepResult:
        summary = outcome.summary
        rows = [{"trial_id": t.trial_id, **{f"config.{k}": v for k, v in (t.config or {}).items()},
                 "status": t.status, "best_value": t.best_value, "epochs_run": t.epochs_run,
                 "stopped_early": t.stopped_early, "error": t.error} for t in summary.trials]
        return cls(name=outcome.name, path=str(outcome.path), metric=summary.metric, mode=summary.mode,
                   trials=_frame(rows), best={"trial_id": summary.best_trial_id, "value": summary.best_value,
                                              "config": summary.best_config},
                   model_dir=_str(outcome.model_dir), report=_str(outcome.report),
                   test_metrics=summary.test_metrics, config=cfg,
                   mlflow=Tracking.of(outcome.log, cfg.tracking.mlflow_uri))

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "metric": self.metric, "mode": self.mode,
                "trials": _table(self.trials), "best": self.best, "model_dir": self.model_dir,
                "report": self.report, "test_metrics": self.test_metrics,
                **self._shared_record()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SweepResult:
        return cls(name=record["name"], path=record["path"], metric=record["metric"], mode=record["mode"],
                   trials=_untable(record.get("trials") or {}), best=record["best"], model_dir=record.get("model_dir"),
                   report=record.get("report"), test_metrics=record.get("test_metrics"),
                   **cls._shared_fields(record))

    def shown(self) -> Shown:
        facts: list[tuple[str, Any]] = [
            ("best", f"trial {self.best.get('trial_id')}: {self.metric} {_num(self.best.get('value'))} ({self.mode})"),
            ("best config", self.best.get("config")), ("trials", len(self.trials)),
            ("model_dir", self.model_dir), ("report", self.report), ("path", self.path)]
        if self.evaluation is not None:
            facts.append(("verdict", self.evaluation.verdict.line))
        if self.mlflow:
            facts.append(("mlflow", self.mlflow.line()))
        return Shown(f"SweepResult {self.name}", facts, self.trials.drop(columns=["error"], errors="ignore"), "trials")


def _evaluation(folder: str | None) -> Evaluation | None:
    if not folder:
        return None
    from alchemetric_ray.api.evaluation import Evaluation

    try:
        return Evaluation.from_folder(folder)
    except FileNotFoundError:  # the report was removed since: the run's result still reads
        return None


def _phases(records) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for record in records:
        seconds[record.phase] = round(seconds.get(record.phase, 0.0) + record.seconds, 3)
    return seconds


def _compact(history: pd.DataFrame) -> pd.DataFrame:
    """The history's columns a person reads first: the epoch, the losses and the validation metrics."""
    if history.empty:
        return history
    keep = [c for c in history.columns if c == "epoch" or c.endswith("loss") or c.startswith("val_")]
    return history[keep[:8]] if keep else history


def _num(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool, type(None)))
