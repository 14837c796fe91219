"""``ar.load_model``'s result: an exported model, loaded once, that predicts and evaluates itself."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alchemetric_ray.api.display import Showable, Shown, listed
from alchemetric_ray.api.guard import api_call
from alchemetric_ray.api.inputs import Overrides, data_path, override_strings
from alchemetric_ray.api.parts import Tracking
from alchemetric_ray.api.saving import save_result
from alchemetric_ray.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.config import RunConfig


class Model(Showable):
    """A saved model: ``.name`` (its registered name), ``.config`` (how it was trained), ``.card`` (its
    model card), ``.features`` (the inputs, in order), ``.module`` (the torch module); ``.predict`` and
    ``.evaluate`` score with these weights (no second load)."""

    def __init__(self, loaded, *, source: str | None = None, scratch: tempfile.TemporaryDirectory | None = None):
        self.loaded = loaded  # artifacts.export.LoadedModel
        self.source = source or str(loaded.path)  # what it was loaded from: a folder, s3://..., models:/...
        self._scratch = scratch  # a registry download's folder: removed with this object (or at exit)

    @classmethod
    def load(cls, where: str | Path, cfg: RunConfig | None = None) -> Model:
        """A model folder, ``s3://...``, ``models:/NAME/VERSION`` or ``models:/NAME@alias`` (the registry
        at ``cfg.tracking.mlflow_uri``)."""
        from alchemetric_ray.artifacts.export import load_model

        where = str(where)
        if where.startswith("models:/"):
            from alchemetric_ray.config import load_config
            from alchemetric_ray.tracking.mlflow_runs import download_model

            scratch = tempfile.TemporaryDirectory(prefix="alchemetric-registry-")
            folder = download_model(where, cfg or load_config(), scratch.name)
            return cls(load_model(folder), source=where, scratch=scratch)
        return cls(load_model(where), source=where)

    def close(self) -> None:
        """Remove a registry download's folder now (it is removed with this object anyway)."""
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def name(self) -> str:
        return self.loaded.config.storage.name

    @property
    def config(self) -> RunConfig:
        return self.loaded.config

    @property
    def features(self) -> list[str]:
        return list(self.loaded.manifest.features)

    @property
    def module(self):
        return self.loaded.model

    @property
    def path(self) -> str:
        """Where its files are (a registry model's: a download removed with this object)."""
        return str(self.loaded.path)

    @property
    def registered(self) -> str | None:
        """The ``models:/...`` URI it was loaded from, or None."""
        return self.source if self.source.startswith("models:/") else None

    @property
    def card(self) -> str:
        from alchemetric_ray.storage import locate

        card = locate(self.loaded.location or self.loaded.path) / "model_card.md"
        return card.read_text() if card.exists() else ""

    def predict(self, data: Any = None, *, out: str | Path | None = None, overrides: Overrides = ()) -> pd.DataFrame:
        """:func:`alchemetric_ray.predict` with this model."""
        with api_call("predict"):
            return predict_with(self, data, out=out, overrides=overrides)

    def evaluate(self, data: Any = None, *, out: str | Path | None = None, walk_forward: bool = False,
                 overrides: Overrides = (), cfg: RunConfig | None = None) -> Evaluation:
        """:func:`alchemetric_ray.evaluate` with this model."""
        with api_call("evaluate"):
            return evaluate_with(self, data, out=out, walk_forward=walk_forward, overrides=overrides, cfg=cfg)

    def shown(self) -> Shown:
        meta = self.loaded.meta
        device = (meta.device or {}).get("device") if isinstance(meta.device, dict) else meta.device
        return Shown(f"Model {self.name}", [
            ("model", self.config.model.name), ("source", self.source),
            ("features", listed(self.features)),
            ("label", self.loaded.manifest.label.get("scheme")), ("trained on", device),
            ("parameters", sum(p.numel() for p in self.module.parameters()))])


def as_model(model: Any, cfg: RunConfig | None = None) -> Model:
    """A :class:`Model`, or what :meth:`Model.load` takes."""
    return model if isinstance(model, Model) else Model.load(model, cfg)


def scoring_config(model: Model, overrides: Overrides = ()) -> RunConfig:
    """The saved model's own config, with this call's overrides (signals, device) on top.  The device
    is this call's (``device.name`` among the overrides, else auto), never the training run's request: a
    model trained with ``device.name=cpu`` on a laptop scores on the GPUs of the cluster it is sent to."""
    from alchemetric_ray.data.manifest import reconcile_features, with_shard_features

    loaded = model.loaded
    saved = with_shard_features(loaded.config, loaded.manifest)
    # a features.* override the model was not trained with is refused, naming both values
    return reconcile_features(saved.replace("device.name=auto", *override_strings(overrides)),
                              loaded.manifest, model.source, model=True)


def predict_with(model: Model, data: Any = None, *, out: str | Path | None = None,
                 overrides: Overrides = ()) -> pd.DataFrame:
    """:func:`alchemetric_ray.predict` with a loaded model (the caller holds the API's guard)."""
    from alchemetric_ray.signals.predict import predict as run_prediction

    with contextlib.ExitStack() as scratch:
        scored_by = model
        target = out or Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="alchemetric-signals-"))) / \
            "signals.parquet"
        return run_prediction(scored_by.loaded, data_path(data, scratch), target,
                              scoring_config(scored_by, overrides))


def evaluate_with(model: Model, data: Any = None, *, out: str | Path | None = None, walk_forward: bool = False,
             overrides: Overrides = (), cfg: RunConfig | None = None) -> Evaluation:
    """:func:`alchemetric_ray.evaluate` with a loaded model (the caller holds the API's guard)."""
    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.config import load_config
    from alchemetric_ray.signals.evaluate import evaluate as run_evaluation

    with contextlib.ExitStack() as scratch:
        scored_by = model
        if out is None and scored_by.registered:
            raise UserError(f"evaluate: a registered model ({scored_by.source}) needs out= (a report folder)")
        report = out or Path(scored_by.path) / "evaluation"
        record = run_evaluation(scored_by.loaded, data_path(data, scratch), report,
                                scoring_config(scored_by, overrides), pooled=walk_forward)
        result = Evaluation.from_record(record.as_dict(), report, live=record)
        if scored_by.registered:
            object.__setattr__(result, "mlflow", _log_registered(scored_by, report, record, cfg or load_config()))
        save_result(report, result)
        return result


def _log_registered(model: Model, report, record, cfg: RunConfig) -> Tracking | None:
    """An evaluation of ``models:/...``: logged into the version's run, and this look at the test segment
    put back beside the version's model (the next download counts it)."""
    from alchemetric_ray.storage import locate
    from alchemetric_ray.tracking.mlflow_runs import registered_version

    tracker = registered_version(str(model.registered), cfg)
    tracker.log_evaluation(locate(report), record)
    tracker.log_artifacts(Path(model.path) / "looks", "model/looks")
    if tracker.finalize() is not None:  # not logged: the tracker has said why
        return None
    return Tracking(uri=tracker.uri, experiment=tracker.experiment, run_id=tracker.run_id,
                    model_name=tracker.model_name, version=tracker.version)
