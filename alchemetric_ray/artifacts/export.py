"""The saved model: a self-describing folder, written atomically, loadable without Ray.

    MODELS_DIR/<name>/weights.pt     tensors only (loaded with weights_only=True)
                      config.json    the whole run config
                      manifest.json  the feature manifest: features, label, splits, normalization
                      metrics.json   best validation metrics (test metrics only with train.score_test), baselines
                      trials.json    the selections behind the model (ledger: what its deflated Sharpe counts)
                      looks/         one record per look at the test segment (ledger)
                      meta.json      device and precision with reasons, versions, machine, git commit
                      model_card.md  the same for people
                      certificate.json  the backends the doctor certified it on (written later, by the doctor)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from alchemetric_ray.artifacts.checkpoint import CheckpointMeta, load_state, read_meta
from alchemetric_ray.artifacts.model_card import model_card
from alchemetric_ray.artifacts.model_meta import ModelMeta
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import CheckpointError, ModelDirError
from alchemetric_ray.fsutil import (
    atomic_write_bytes,
    check_free_space,
    is_uri,
    json_bytes,
    recover_dir,
    safe_child,
    torch_bytes,
    unwritable_ancestor,
)
from alchemetric_ray.hardware import resolve_device, resolve_precision
from alchemetric_ray.models import build_model, model_spec
from alchemetric_ray.outputs import claim, staged_output
from alchemetric_ray.scoring.metrics import target_metrics
from alchemetric_ray.scoring.objective import selection_metric
from alchemetric_ray.scoring.predictions import model_inputs, predict_proba, split_frame
from alchemetric_ray.storage import Location, locate

if TYPE_CHECKING:
    from alchemetric_ray.artifacts import ledger

WEIGHTS, CONFIG, MANIFEST, METRICS, META, CARD, CERTIFICATE = (
    "weights.pt", "config.json", "manifest.json", "metrics.json", "meta.json", "model_card.md", "certificate.json")
# What check_models_dir asks of the disk where the model's size is not known yet (before training,
# ahead of the manifest): a floor that catches a full disk early; the export checks the real size.
MIN_EXPORT_BYTES = 1 << 20
# The export's files besides the weights (config, manifest, metrics with the history, meta, card)
# as estimated_export_bytes counts them before they exist.
EXPORT_METADATA_BYTES = 256 * 1024


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: RunConfig
    manifest: Manifest
    meta: ModelMeta  # its meta.json
    path: Path | str  # a local folder, or the URI of a model on object storage
    location: Location | None = None  # where load_model found it, named as its caller named it

    @property
    def mode(self) -> str:
        return model_spec(self.config.model.name).inputs


def export_model(checkpoint, cfg: RunConfig, shards: str | Path | Location, *,
                 extra: dict | None = None, command: str = "train",
                 selection: dict | None = None) -> Location:
    """Export a Train checkpoint (``ray.train.Checkpoint`` or a folder) as the model ``storage.name``
    in ``storage.models_dir`` (a local folder or object storage); return where it went.

    The test segment stays sealed: it is scored here (model and baselines, in ``metrics.json`` and
    the card) only with ``train.score_test``, and that look is recorded (``ledger``).  ``selection``
    is what chose this model (a sweep's trials, from ``tune``); without it, this one run is the one
    trial.  The looks and trials of a model this one replaces are carried over (``ledger.carried``)."""
    return _export(_read_checkpoint(checkpoint), cfg, shards, extra=extra, command=command, selection=selection)


def export_ensemble(checkpoints: list, cfg: RunConfig, shards: str | Path | Location, *,
                    command: str = "train") -> Location:
    """Export the best checkpoints of one run per seed (``train.seeds`` of them, in seed order) as one
    model: a :class:`~alchemetric_ray.models.ensemble.SeedEnsemble` of them, its validation metrics
    (what ``metrics.json``'s ``val`` and the card show) those of the average, each seed's own best
    epoch and validation metrics under ``seeds``."""
    from dataclasses import replace

    read = [_read_checkpoint(checkpoint) for checkpoint in checkpoints]
    meta = read[0][1]
    model = _build(cfg, meta.manifest)
    for member, (state, _) in zip(cast(torch.nn.ModuleList, model.members), read):
        member.load_state_dict(state["model"])
    val = split_metrics(model, cfg, meta.manifest, shards, "val", prefix="val_")
    seeds = [{"seed": cfg.train.seed + i, "best_epoch": m.epoch + 1,
              "val": {k.removeprefix("val_"): v for k, v in m.metrics.items()}} for i, (_, m) in enumerate(read)]
    return _export(({"model": model.state_dict()}, replace(meta, metrics=val)), cfg, shards, extra={"seeds": seeds},
                   command=command)


def _export(read: tuple[dict[str, Any], CheckpointMeta], cfg: RunConfig, shards: str | Path | Location, *,
            extra: dict | None = None, command: str = "train", selection: dict | None = None) -> Location:
    """Export (tensors, their meta) as the model ``storage.name`` (:func:`export_model`'s folder)."""
    from alchemetric_ray.artifacts import ledger

    state, meta = read
    model = _build(cfg, meta.manifest)
    model.load_state_dict(state["model"])
    metrics, look = _scores(model, meta, cfg, shards, command)
    metrics["history"] = meta.loop["history"]
    metrics.update(extra or {})
    target = model_folder(cfg)
    ledger_files = ledger.carried(target, _trial(command, meta.manifest, metrics["val"], selection))
    files = _model_files(cfg, meta.manifest, state, metrics, _model_meta(meta))
    check_models_dir(cfg.storage.models_dir, sum(len(data) for data in files.values())
                     + sum(len(data) for data in ledger_files.values()) + len(json_bytes(meta.manifest.to_dict())))
    _write_model(target, files, ledger_files, look, meta.manifest)
    return target


def _read_checkpoint(checkpoint) -> tuple[dict[str, Any], CheckpointMeta]:
    """A checkpoint's tensors (``state.pt``) and its ``meta.json``, from a folder or a ``ray.train.Checkpoint``."""
    if hasattr(checkpoint, "as_directory"):
        with checkpoint.as_directory() as d:
            state, data = load_state(d), read_meta(d)
    else:
        state, data = load_state(checkpoint), read_meta(checkpoint)
    return state, CheckpointMeta.from_dict(data)


def _scores(model: torch.nn.Module, meta: CheckpointMeta, cfg: RunConfig, shards: str | Path | Location,
            command: str) -> tuple[dict[str, Any], ledger.Look | None]:
    """``metrics.json``'s figures but the history: the checkpoint's epoch and validation metrics, the
    test segment's where ``train.score_test`` asks for them (with the look that is), and the baselines'
    on the same segments."""
    from alchemetric_ray.artifacts import ledger
    from alchemetric_ray.scoring.baselines import baseline_scores

    manifest = meta.manifest
    val = {k.removeprefix("val_"): v for k, v in meta.metrics.items()}
    metrics = {"best_epoch": meta.epoch + 1, "selection_metric": selection_metric(cfg), "val": val}
    look = None
    if cfg.train.score_test:  # a look at the test segment, asked for
        metrics["test"] = split_metrics(model, cfg, manifest, shards, "test")
        look = ledger.look_entry(f"{command} (train.score_test)", manifest.splits["test_start"],
                                 manifest.splits["test_end"], "the exported model's and the baselines' test metrics")
    metrics["baselines"] = baseline_scores(shards, manifest, seed=cfg.train.seed,
                                           splits=("val", "test") if look else ("val",))
    return metrics, look


def split_metrics(model: torch.nn.Module, cfg: RunConfig, manifest: Manifest, shards: str | Path | Location,
                  split: str, *, prefix: str = "") -> dict[str, Any]:
    """The model's target and signal metrics on one split of the shards, scored on the CPU in float32."""
    device = resolve_device("cpu", source="the export (scores on the CPU)").device
    frame = split_frame(shards, split, manifest.features, manifest)
    x, rows = model_inputs(frame, manifest.features, model_spec(cfg.model.name).inputs, cfg.features.window)
    dates = rows["date"].to_numpy()
    outputs = predict_proba(model, x, device, resolve_precision("fp32", device), regression=manifest.regression,
                            date=dates)
    return target_metrics(outputs, rows["label"].to_numpy(), rows["fwd_ret"].to_numpy(), dates, manifest.classes,
                          prefix=prefix)


def _trial(command: str, manifest: Manifest, val: dict[str, Any], selection: dict | None) -> ledger.Trial:
    """The trials ledger's entry for this export: ``selection`` (a sweep's), or this one run as the one trial."""
    from alchemetric_ray.artifacts import ledger

    chosen = {k: val.get(f"ls_{k}") for k in ("sr", "skew", "kurt", "days")}
    selection = selection or {"sweep": None, "srs": [chosen["sr"]], "chosen": chosen}
    return ledger.trial_entry(command, manifest.splits, **selection)


def _model_meta(meta: CheckpointMeta) -> ModelMeta:
    """The model folder's ``meta.json`` from its checkpoint's, stamped with the time of the export."""
    return ModelMeta(device=meta.device, precision=meta.precision, plan=meta.plan, world_size=meta.world_size,
                     environment=meta.environment,
                     epoch=meta.epoch + 1,  # the exported epoch's number, from 1 (its checkpoint: epoch-NNNN, from 0)
                     known_bugs=meta.known_bugs or {}, exported=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _model_files(cfg: RunConfig, manifest: Manifest, state: dict[str, Any], metrics: dict[str, Any],
                 meta: ModelMeta) -> dict[str, bytes | memoryview]:
    """Every file of the model folder but the manifest and the ledgers, in memory (the manifest's own
    writer is ``manifest.write``): the space they need is known before the stage is made, and each
    write is checked again (``fsutil.atomic_write_bytes``)."""
    return {WEIGHTS: torch_bytes({"model": state["model"]}), CONFIG: json_bytes(cfg.to_dict()),
            METRICS: json_bytes(metrics), META: json_bytes(meta.as_dict()),
            CARD: model_card(cfg, manifest, metrics, meta).encode("utf-8")}


def _write_model(target: Location, files: dict[str, bytes | memoryview], ledger_files: dict[str, bytes],
                 look: ledger.Look | None, manifest: Manifest) -> None:
    """The model folder written whole into a stage and swapped in at ``target``; ``meta.json`` last:
    a reader that sees it sees the rest."""
    from alchemetric_ray.artifacts import ledger

    with staged_output(target, "model", last=(META,)) as tmp:
        for name in (WEIGHTS, CONFIG, METRICS):
            atomic_write_bytes(tmp / name, files[name])
        for name, data in ledger_files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(tmp / name, data)
        if look:
            ledger.write_look(tmp, look)
        manifest.write(tmp)
        for name in (META, CARD):
            atomic_write_bytes(tmp / name, files[name])


def model_folder(cfg: RunConfig) -> Location:
    """Where this run's model is exported: ``storage.models_dir/storage.name``."""
    return locate(cfg.storage.models_dir) / safe_child(".", cfg.storage.name, "storage.name").name


def claim_model_folder(cfg: RunConfig) -> None:
    """Before any work: the model folder is absent, empty or a model of ours, else refused in one line."""
    claim(model_folder(cfg), "model", what="model folder (storage.models_dir/storage.name)")


def check_models_dir(folder: str | Path, need: int | None = None) -> None:
    """Refuse a local models directory we cannot write, or whose disk has no room for ``need`` bytes
    (the model's files; :data:`MIN_EXPORT_BYTES` where the size is not known yet, as before training:
    :func:`estimated_export_bytes` gives it once the manifest is read), before any work is done for
    it.  Object storage is checked by ``storage.preflight`` and has no free space to check."""
    if is_uri(folder):
        return
    folder = Path(folder)
    blocked = unwritable_ancestor(folder)
    if blocked is not None:
        raise ModelDirError(f"models directory {folder}: {blocked} is not a writable folder")
    # the stage is made beside the model's folder, i.e. in ``folder`` (fsutil.staged_dir)
    check_free_space(folder / ".export", MIN_EXPORT_BYTES if need is None else need,
                     what=f"the model in models directory {folder}")


def estimated_export_bytes(cfg: RunConfig, manifest: Manifest) -> int:
    """About what the export of this run's model will write: its weights (every tensor of the model
    built for ``manifest``'s features, at its dtype) and :data:`EXPORT_METADATA_BYTES` for the rest."""
    model = _build(cfg, manifest)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return weights + EXPORT_METADATA_BYTES


def _build(cfg: RunConfig, manifest: Manifest) -> torch.nn.Module:
    """The run's model for ``manifest``'s features; with ``train.seeds`` > 1, a seed ensemble of that many."""
    from alchemetric_ray.models.ensemble import SeedEnsemble

    def one() -> torch.nn.Module:
        return build_model(cfg.model, len(manifest.features), manifest.outputs, window=cfg.features.window)

    return one() if cfg.train.seeds == 1 else SeedEnsemble([one() for _ in range(cfg.train.seeds)])


def load_model(path: str | Path | Location) -> LoadedModel:
    """Load an exported model on the CPU (move it with ``.to(device)``); refuses incomplete folders.

    A model on object storage is copied to a temporary folder, loaded, and the copy removed."""
    where = locate(path)
    if not where.is_local:
        import tempfile

        if not (where / META).is_file():  # written last: without it the model is absent or incomplete
            raise ModelDirError(f"{where}: not a saved model (missing {META})")
        with tempfile.TemporaryDirectory(prefix="alchemetric-model-") as tmp:
            loaded = _load_local(where.download(Path(tmp) / where.name))
        loaded.path = where.uri
    else:
        loaded = _load_local(Path(path) if not isinstance(path, Location) else where.local)
    loaded.location = where
    return loaded


def _load_local(path: Path) -> LoadedModel:
    recover_dir(path)  # a save interrupted between its renames: the previous model is put back
    for name in (WEIGHTS, CONFIG, MANIFEST, META):
        if not (path / name).is_file():
            raise ModelDirError(f"{path}: not a saved model (missing {name})")
    try:
        cfg = RunConfig.from_dict(json.loads((path / CONFIG).read_text()))
        manifest = Manifest.from_dict(json.loads((path / MANIFEST).read_text()), str(path / MANIFEST))
        meta = ModelMeta.from_dict(json.loads((path / META).read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"{path}: unreadable model metadata ({exc.__class__.__name__})") from None
    try:
        state = torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path / WEIGHTS}: refused to load ({type(exc).__name__})") from None
    model = _build(cfg, manifest)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as exc:
        # torch's first line only names the class; the second names the tensor and both shapes
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        raise ModelDirError(f"{path / WEIGHTS}: weights do not fit model '{cfg.model.name}' "
                            f"with {len(manifest.features)} features ({lines[min(1, len(lines) - 1)][:200]})") from None
    model.eval()
    return LoadedModel(model, cfg, manifest, meta, path)


def backend_key(device_type: str, mode: str) -> str:
    """How a backend is named in a saved model's certificate: ``cuda/bf16``, ``cpu/fp32``."""
    return f"{device_type}/{mode}"


def trained_backend(model_dir: str | Path | Location) -> str:
    """The backend a saved model was trained on, from its meta.json."""
    meta = ModelMeta.from_dict(json.loads((locate(model_dir) / META).read_text()))
    return backend_key((meta.device or {})["device"].split(":")[0], (meta.precision or {})["mode"])


def certified_backends(model_dir: str | Path | Location) -> list[str] | None:
    """The backends the doctor certified the saved model on; None where it never ran for it."""
    path = locate(model_dir) / CERTIFICATE
    if not path.is_file():
        return None
    return list(json.loads(path.read_text()).get("certified", []))
