"""Batch prediction with Ray Data: a saved model over new OHLCV data -> a signals file.

The model's own manifest decides everything about the inputs: its feature set, its label's
horizon, its window and its training normalization.  Features are computed for batches of tickers
at once (``data.panel.feature_tables``) and staged ticker by ticker into a folder, then
``read_parquet_folder(...).map_batches(ModelPredictor, compute=ActorPoolStrategy(size=N))`` runs a
pool of actors that each load the model once (on a GPU each when the cluster has them).

One row per (date, ticker) with enough history: class probabilities, the predicted class, the
score P(up) - P(down), a position (-1/0/+1) from the thresholds, the date the position takes
effect (the ticker's next bar: never the signal's own bar), the model id, and the device and
precision it was computed on.  The file is written beside its final name and renamed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from alchemetric_ray.config import DataConfig, DuplicatePolicy, RunConfig
from alchemetric_ray.data.cross_section import Op, apply_cross_section
from alchemetric_ray.data.manifest import MANIFEST, Manifest
from alchemetric_ray.data.normalize import Normalizer
from alchemetric_ray.data.panel import feature_tables
from alchemetric_ray.errors import SignalError
from alchemetric_ray.fsutil import is_uri
from alchemetric_ray.outputs import claim_signals_file, signals_metadata
from alchemetric_ray.scoring.metrics import direction_score
from alchemetric_ray.signals.portfolio import quantile_positions
from alchemetric_ray.storage import Location, local_copy, locate

if TYPE_CHECKING:
    from alchemetric_ray.artifacts.export import LoadedModel


class ModelPredictor:
    """A Ray Data actor: loads the model once, then scores numpy batches."""

    def __init__(self, model_dir: str, device_name: str, features: list[str], mode: str, loaded=None):
        import torch

        from alchemetric_ray.artifacts.export import load_model
        from alchemetric_ray.hardware import device_for_worker, resolve_precision

        self.torch = torch
        self.loaded = loaded or load_model(model_dir)  # ``loaded``: scoring in the caller's process, already loaded
        self.device = device_for_worker(device_name, source="the prediction plan").device
        self.precision = resolve_precision("fp32", self.device)  # scoring in fp32: no rounding in the decision
        self.model = self.loaded.model.to(self.device)
        self.features, self.mode = features, mode

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from alchemetric_ray.scoring.predictions import predict_proba

        if self.mode == "sequence":
            x = np.asarray(batch["x"], dtype=np.float32)
        else:
            x = np.stack([np.asarray(batch[f], dtype=np.float32) for f in self.features], axis=1)
        proba = predict_proba(self.model, x, self.device, self.precision, regression=self.loaded.manifest.regression,
                              date=batch["date"])
        columns = {k: batch[k] for k in ("date", "ticker", "fwd_ret", "effective_date")}
        columns["proba"] = proba.astype(np.float32)
        columns["device"] = np.full(len(proba), str(self.device))
        columns["precision"] = np.full(len(proba), self.precision.mode)
        return columns


def model_id(model_dir: str | Path | Location) -> str:
    """What signals and reports call a model: its folder's name and a digest of its weights, or for a
    version downloaded from the MLflow registry, the registered name, version and alias."""
    from alchemetric_ray.tracking.mlflow_runs import REGISTERED

    model_dir = locate(model_dir)
    digest = hashlib.sha256((model_dir / "weights.pt").read_bytes()).hexdigest()[:12]
    registered = model_dir / REGISTERED
    if registered.is_file():
        version = json.loads(registered.read_text())
        alias = f" (alias {version['alias']})" if version.get("alias") else ""
        return f"models:/{version['name']}/{version['version']}{alias} sha256:{digest}"
    return f"{model_dir.name}@{digest}"


def signal_positions(score: np.ndarray, dates: np.ndarray, classes: list[str], cfg: RunConfig) -> np.ndarray:
    """Positions for a model's scores: P(up) - P(down) against the thresholds for a class target;
    per-date quantiles (``signals.quantile``) for a regression target, whose scores live on a
    cross-sectional scale where fixed thresholds mean nothing."""
    if not classes:
        return quantile_positions(score, dates, cfg.signals.quantile)
    return positions(score, cfg.signals.long_threshold, cfg.signals.short_threshold)


def positions(score: np.ndarray, long_threshold: float, short_threshold: float) -> np.ndarray:
    return np.where(score > long_threshold, 1, np.where(score < -short_threshold, -1, 0)).astype(np.int8)


def _check_paths(data: str | None, out: Location) -> None:
    if data and not is_uri(data) and out.is_local:
        src = Path(data).resolve()
        target = out.local
        if target == src or src in target.parents:
            raise SignalError(f"signals output {out} is inside the input folder {data}; write it somewhere else")


def stage_inputs(loaded, data: str | None, staging: Path, *, on_duplicate: DuplicatePolicy | None = None,
                 normalize: bool = True) -> dict:
    """Features for every bar of the data, normalized with the model's training statistics.

    ``data`` is an OHLCV folder/file (local, or on object storage: read from a temporary copy);
    None means the data the model was trained on (its config's data section: the built-in sample,
    the same synthetic market, or the same files).  ``on_duplicate`` is the caller's
    data.on_duplicate (None: the model's own): new data gets a fresh data config, which would
    otherwise drop a ``data.on_duplicate=...`` given to predict or evaluate.  Returns the staged
    tickers and ingest's duplicate counts (None where nothing was read from files).
    ``normalize=False`` leaves the features as computed (:func:`normalized_copy` applies a model's
    normalization later: a walk-forward stages once for every refit)."""
    if data and is_uri(data):
        with local_copy(data) as raw:
            return _stage_inputs(loaded, str(raw), staging, on_duplicate, normalize)
    return _stage_inputs(loaded, data, staging, on_duplicate, normalize)


def normalized_copy(loaded, raw: Path, staging: Path) -> None:
    """What ``stage_inputs(..., normalize=False)`` wrote to ``raw``, through ``loaded``'s
    normalization, into ``staging`` (the same files: a model of the same features and label)."""
    manifest = loaded.manifest
    norm = _normalizer(manifest)
    for path in sorted(raw.glob("*.parquet")):
        frame = _normalized(pq.read_table(path).to_pandas(), norm, manifest.features, manifest.label_spec.regression)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), staging / path.name)


def _normalizer(manifest: Manifest) -> Normalizer:
    norm = Normalizer.from_dict(manifest.normalization)
    if norm.names != manifest.features:
        raise SignalError(f"model manifest: normalization covers {norm.names}, features are {manifest.features}")
    return norm


def inputs_frame(loaded, data: str | None, *, on_duplicate: DuplicatePolicy | None = None) -> pd.DataFrame:
    """Every bar of ``data`` (None: the model's own data) with features normalized by ``loaded``'s
    statistics, its label and forward return, in memory.  ``frame.attrs["duplicates"]`` holds
    ingest's duplicate counts for that data (stage_inputs), for the evaluation to report."""
    with tempfile.TemporaryDirectory(prefix="alchemetric-eval-") as staging:
        staged = stage_inputs(loaded, data, Path(staging), on_duplicate=on_duplicate)
        return staged_frame(Path(staging), staged)


def staged_frame(staging: Path, staged: dict) -> pd.DataFrame:
    """What :func:`stage_inputs` wrote to ``staging`` (and returned: ``staged``) as one frame in memory."""
    frame = pd.read_parquet(staging)
    frame["date"] = np.asarray(pd.to_datetime(frame["date"]).to_numpy(), dtype="datetime64[ns]")
    frame.attrs["duplicates"] = staged["duplicates"]
    return frame


def _stage_inputs(loaded, data: str | None, staging: Path, on_duplicate: DuplicatePolicy | None = None,
                  normalize: bool = True) -> dict:
    from alchemetric_ray.bars.sources import open_source

    manifest = loaded.manifest
    names = manifest.features
    own = loaded.config.data
    on_duplicate = on_duplicate or own.on_duplicate
    source_cfg = (DataConfig(path=data, source="files", on_duplicate=on_duplicate) if data
                  else dataclasses.replace(own, on_duplicate=on_duplicate))
    if source_cfg.path and (Path(source_cfg.path) / MANIFEST).is_file():
        shard_manifest = Manifest.read(source_cfg.path)
        if shard_manifest.features != names:
            raise SignalError(f"{source_cfg.path}: its features {shard_manifest.features} do not match the "
                              f"model's {names}")
        raise SignalError(f"{source_cfg.path}: is a feature-shard folder; pass the raw OHLCV data (--data) so the "
                          "model's own features and normalization are applied")
    spec = manifest.label_spec
    norm = _normalizer(manifest)
    # the model's per-date operations, over the stocks of this data (its own cross-section)
    ops = [Op(**op) for op in (manifest.cross_section or {}).get("ops", [])]
    source = open_source(source_cfg)
    tickers = []
    for ticker, bars, table in feature_tables(source.bars, names, spec):  # a batch of tickers at a time
        table = table[table["has_features"]]
        if table.empty:
            continue
        effective = table["next_date"].to_numpy()
        last = pd.Timestamp(bars["date"].iloc[-1])
        effective = np.where(pd.isna(effective), np.datetime64(last + pd.offsets.BDay(1), "ns"), effective)
        cols = {"date": table["date"].to_numpy(), "ticker": table["ticker"].to_numpy(),
                **{n: table[n].to_numpy() for n in names},
                "label": table["label"].to_numpy(),
                "mom_20": np.log(bars["close"]).diff(20).to_numpy()[table.index.to_numpy()].astype(np.float32),
                "fwd_ret": table["fwd_ret"].to_numpy().astype(np.float32),
                "effective_date": effective.astype("datetime64[ns]")}
        frame = pd.DataFrame(cols)
        if not ops and normalize:  # per-ticker features only: normalized as they come
            frame = _normalized(frame, norm, names, spec.regression)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), staging / f"{ticker}.parquet")
        tickers.append(ticker)
    if not tickers:
        raise SignalError(f"{data or 'the training data'}: no ticker has enough history for the model's features")
    if ops:
        files = [staging / f"{t}.parquet" for t in tickers]
        apply_cross_section(files, ops, min_names=manifest.cross_section["min_names"],
                            what=data or "the training data")
        for path in files if normalize else []:  # then the normalization, ticker by ticker
            frame = _normalized(pq.read_table(path).to_pandas(), norm, names, spec.regression)
            part = path.with_name(path.name + ".tmp")
            pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), part)
            part.replace(path)
    return {"tickers": tickers, "duplicates": source.report.duplicates() if source.report is not None else None}


def _normalized(frame: pd.DataFrame, norm: Normalizer, names: list[str], regression: bool) -> pd.DataFrame:
    """One ticker's features through the model's normalization, and its label in the shards' type:
    float (NaN: not known yet) for a regression target, else the class id (-1: not known yet)."""
    x = norm.apply(frame[names].to_numpy())
    label = frame["label"].to_numpy()
    return frame.assign(**{name: x[:, j] for j, name in enumerate(names)},
                        label=label.astype(np.float32) if regression else np.nan_to_num(label, nan=-1).astype(np.int64))


def model_location(model: str | Path | Location | LoadedModel) -> Location:
    """Where ``model`` lives: a saved model's folder (a path or a location), or the folder a loaded
    model was loaded from, named as its loader was given it."""
    from alchemetric_ray.artifacts.export import LoadedModel

    if isinstance(model, LoadedModel):
        return model.location or locate(model.path)
    return locate(model)


def loaded_model(model: str | Path | Location | LoadedModel) -> LoadedModel:
    """``model`` loaded: a saved model's folder is loaded here (a command's one load: it passes the
    result on), a model already loaded is passed through."""
    from alchemetric_ray.artifacts.export import LoadedModel, load_model

    return model if isinstance(model, LoadedModel) else load_model(model_location(model))


def predict(model: str | Path | Location | LoadedModel, data: str | None, out: str | Path | Location,
            cfg: RunConfig | None = None, *, staged: Path | None = None) -> pd.DataFrame:
    """Score ``data`` (OHLCV folder/file; None = the model's training data) with a saved model into
    ``out``.  ``model``: the model's folder, or the model already loaded from it (:func:`loaded_model`;
    scored in this process it is not loaded again).  ``staged``: a folder :func:`stage_inputs` already
    filled for this model and data (a caller that also needs the inputs in memory stages them once)."""
    import ray

    from alchemetric_ray.data.loaders import read_parquet_folder
    from alchemetric_ray.placement.autoscale import gpu_preflight
    from alchemetric_ray.placement.capacity import discover_capacity
    from alchemetric_ray.placement.session import ensure_ray

    model_dir, out = model_location(model), locate(out)
    loaded = loaded_model(model)
    cfg = cfg or loaded.config
    _check_paths(data, out)
    claim_signals_file(out, what="signals output")  # before any work: a folder or a foreign file is refused
    from alchemetric_ray.models import is_cross_sectional

    here = scored_here(cfg)
    if here is None and is_cross_sectional(loaded.model):
        here = "cpu"  # a cross-sectional model scores whole dates: every ticker's rows together, in this process
    if here is None:
        ensure_ray(cfg)
    with tempfile.TemporaryDirectory(prefix="alchemetric-predict-") as tmp:
        staging = staged or Path(tmp)
        if staged is None:
            stage_inputs(loaded, data, staging, on_duplicate=cfg.data.on_duplicate)
        names = loaded.manifest.features
        # a file per ticker: a sequence model's windows are built as each file is read
        windows = (names, loaded.config.features.window) if loaded.mode == "sequence" else None
        if here is not None:
            return _write_signals(_score_here(staging, windows, loaded, model_dir, here), loaded, model_dir, out, cfg)
        ds = read_parquet_folder(staging, windows=windows)
        gpus = ray.cluster_resources().get("GPU", 0)
        actors, per_actor_gpu, device_kind = _actor_plan(cfg, gpus, discover_capacity(cfg))
        if per_actor_gpu:  # GPU actors: check torch can use the GPUs there first (and scale a cold cluster up)
            gpu_preflight(actors, per_actor_gpu, cfg, autoscaling=gpus < actors * per_actor_gpu)
        scored = ds.map_batches(
            ModelPredictor,
            fn_constructor_kwargs={"model_dir": model_dir.path if model_dir.is_local else model_dir.uri,
                                   "device_name": device_kind,
                                   "features": names, "mode": loaded.mode},
            batch_size=4096, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=actors),
            num_gpus=per_actor_gpu or None,
            # One pass that writes nothing until it ends: a lost actor fails the run (rerun it) rather
            # than being restarted from constructor arguments Ray keeps in its object store.
            max_restarts=0,
        ).to_pandas()
    return _write_signals(scored, loaded, model_dir, out, cfg)


def scored_here(cfg: RunConfig) -> str | None:
    """The device kind to score with in this process, where the plan is one actor on this machine
    (no cluster joined: ``capacity.joined_cluster``): Ray Data's actor pool would start a process to do
    the same, so no Ray starts (an actor per GPU, ``signals.actors`` > 1 and a cluster's nodes use it)."""
    from alchemetric_ray.placement.capacity import joined_cluster, now

    if joined_cluster():
        return None
    from alchemetric_ray.placement.session import machine_resources

    actors, _, kind = _actor_plan(cfg, machine_resources()["GPU"], now())
    return kind if actors == 1 else None


def _score_here(staging: Path, windows, loaded, model_dir: Location, kind: str) -> pd.DataFrame:
    """The staged inputs scored in this process, batch by batch, as one actor of the pool would."""
    from alchemetric_ray.data.loaders import folder_batches
    from alchemetric_ray.models import is_cross_sectional

    predictor = ModelPredictor(model_dir.path if model_dir.is_local else model_dir.uri, kind, loaded.manifest.features,
                               loaded.mode, loaded=loaded)
    batches = list(folder_batches(staging, windows=windows))
    if batches and is_cross_sectional(loaded.model):  # whole dates: the files' rows scored together
        batches = [{k: np.concatenate([b[k] for b in batches]) for k in batches[0]}]
    parts = [predictor(batch) for batch in batches]
    columns = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]} if parts else {}
    proba = columns.pop("proba", np.zeros((0, 0), np.float32))
    return pd.DataFrame({**columns, "proba": list(proba)})


def _actor_plan(cfg: RunConfig, gpus: float, capacity=None) -> tuple[int, float, str]:
    """(actors, GPUs per actor, the decided device kind: never "auto").  On an autoscaling cluster
    whose node types are known (placement/capacity.py) the GPUs are those of its GPU node type, so a
    cold GPU cluster predicts on CUDA (one actor per GPU of one node) instead of silently on CPU;
    where they are unknown, auto with no GPU up is refused as ``train`` refuses it."""
    from alchemetric_ray.hardware.device import train_accelerator

    if capacity is not None and capacity.node_types_known:
        gpus = max([gpus] + [t.resources.get("GPU", 0.0) for t in capacity.workers if capacity.limit(t) > 0])
        acc = train_accelerator(cfg.device.name, gpus, 1, node_types=capacity.describe_types())
    else:
        unknown = capacity is not None and capacity.node_types_unknown
        acc = train_accelerator(cfg.device.name, gpus, 1, gpus_unknown=capacity.unknown_hint() if unknown else None)
    if acc.use_gpu:
        return cfg.signals.actors or max(1, int(gpus)), 1.0, acc.kind
    return cfg.signals.actors or 1, 0.0, acc.kind


def _datetimes(column) -> np.ndarray:
    """Plain numpy datetime64[ns] (Ray Data hands back Arrow-backed timestamps)."""
    return np.asarray(pd.to_datetime(column).to_numpy(), dtype="datetime64[ns]")


def warn_if_uncertified(model_dir: str | Path | Location, device_type: str, mode: str) -> str | None:
    """The warning ``predict`` prints when serving on a backend the doctor never certified."""
    from alchemetric_ray.artifacts.export import (
        backend_key,
        certified_backends,
        trained_backend,
    )

    model_dir = locate(model_dir)
    certified = certified_backends(model_dir)
    key = backend_key(device_type, mode)
    trained = trained_backend(model_dir)
    if key == trained or (certified is not None and key in certified):
        return None
    message = (f"warning: serving {model_dir.name} on {key}, which was never certified for this model "
               f"(trained on {trained}); run `alchemetric-ray doctor --model {model_dir}` first")
    print(message, file=sys.stderr)
    return message


def _write_signals(scored: pd.DataFrame, loaded, model_dir: Location, out: Location, cfg: RunConfig) -> pd.DataFrame:
    classes = loaded.manifest.classes
    proba = np.stack(scored["proba"].to_numpy()) if len(scored) else np.zeros((0, len(classes)))
    frame = pd.DataFrame({"date": _datetimes(scored["date"]), "ticker": scored["ticker"].astype(str).to_numpy()})
    for j, name in enumerate(classes):
        frame[f"p_{name}"] = proba[:, j]
    if classes:
        frame["pred_class"] = np.asarray(classes, dtype=object)[proba.argmax(axis=1)] if len(frame) else []
    frame["score"] = direction_score(proba, classes) if len(frame) else np.zeros(0)
    frame["position"] = signal_positions(frame["score"].to_numpy(), frame["date"].to_numpy(), classes, cfg)
    frame["effective_date"] = _datetimes(scored["effective_date"])
    frame["fwd_ret"] = scored["fwd_ret"].astype("float32")
    frame["model_id"] = model_id(model_dir)
    frame["device"] = scored["device"].astype(str)
    frame["precision"] = scored["precision"].astype(str)
    frame = frame.sort_values(["date", "ticker"]).reset_index(drop=True)
    if len(frame):
        warn_if_uncertified(model_dir, frame["device"].iloc[0].split(":")[0], frame["precision"].iloc[0])
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata(signals_metadata(table.schema.metadata))  # marked as our signals file
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    out.write_bytes(sink.getvalue().to_pybytes())  # whole or not at all: renamed locally, one PUT on a bucket
    return frame
