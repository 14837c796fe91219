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
from typing import Any

import torch

from alchemetric_ray.artifacts.checkpoint import CheckpointError, load_state, read_meta
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import UserError
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

WEIGHTS, CONFIG, MANIFEST, METRICS, META, CARD, CERTIFICATE = (
    "weights.pt", "config.json", "manifest.json", "metrics.json", "meta.json", "model_card.md", "certificate.json")
FEW_TICKERS = 10
# What check_models_dir asks of the disk where the model's size is not known yet (before training,
# ahead of the manifest): a floor that catches a full disk early; the export checks the real size.
MIN_EXPORT_BYTES = 1 << 20
# The export's files besides the weights (config, manifest, metrics with the history, meta, card)
# as estimated_export_bytes counts them before they exist.
EXPORT_METADATA_BYTES = 256 * 1024


class ModelDirError(UserError, ValueError):
    pass


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: RunConfig
    manifest: Manifest
    meta: dict[str, Any]
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
    from alchemetric_ray.artifacts import ledger
    from alchemetric_ray.scoring.baselines import baseline_scores

    if hasattr(checkpoint, "as_directory"):
        with checkpoint.as_directory() as d:
            state, meta = load_state(d), read_meta(d)
    else:
        state, meta = load_state(checkpoint), read_meta(checkpoint)
    manifest = Manifest.from_dict(meta["manifest"])
    model = _build(cfg, manifest)
    model.load_state_dict(state["model"])

    device = resolve_device("cpu", source="the export (scores on the CPU)").device
    precision = resolve_precision("fp32", device)
    features = manifest.features
    mode = model_spec(cfg.model.name).inputs
    val = {k.removeprefix("val_"): v for k, v in meta["metrics"].items()}
    metrics = {"best_epoch": meta["epoch"] + 1, "selection_metric": selection_metric(cfg), "val": val}
    look = None
    if cfg.train.score_test:  # a look at the test segment, asked for
        test = split_frame(shards, "test", features, manifest)
        x, rows = model_inputs(test, features, mode, cfg.features.window)
        outputs = predict_proba(model, x, device, precision, regression=manifest.regression)
        metrics["test"] = target_metrics(outputs, rows["label"].to_numpy(), rows["fwd_ret"].to_numpy(),
                                         rows["date"].to_numpy(), manifest.classes, prefix="")
        look = ledger.look_entry(f"{command} (train.score_test)", manifest.splits["test_start"],
                                 manifest.splits["test_end"], "the exported model's and the baselines' test metrics")
    metrics["baselines"] = baseline_scores(shards, manifest, seed=cfg.train.seed,
                                           splits=("val", "test") if look else ("val",))
    metrics["history"] = meta["loop"]["history"]
    metrics.update(extra or {})
    target = model_folder(cfg)
    chosen = {k: val.get(f"ls_{k}") for k in ("sr", "skew", "kurt", "days")}
    selection = selection or {"sweep": None, "srs": [chosen["sr"]], "chosen": chosen}
    ledger_files = ledger.carried(target, ledger.trial_entry(command, manifest.splits, **selection))
    info = {k: meta[k] for k in ("device", "precision", "plan", "world_size", "environment")}
    info["epoch"] = meta["epoch"] + 1  # the exported epoch's number, from 1 (its checkpoint: epoch-NNNN, from 0)
    info["known_bugs"] = meta.get("known_bugs") or {}
    # every file in memory first (the manifest's own writer is manifest.write): the space they need
    # is known before the stage is made, and each write is checked again (fsutil.atomic_write_bytes)
    files = {WEIGHTS: torch_bytes({"model": state["model"]}), CONFIG: json_bytes(cfg.to_dict()),
             METRICS: json_bytes(metrics),
             META: json_bytes({**info, "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z")}),
             CARD: model_card(cfg, manifest, metrics, info).encode("utf-8")}
    check_models_dir(cfg.storage.models_dir, sum(len(data) for data in files.values())
                     + sum(len(data) for data in ledger_files.values()) + len(json_bytes(manifest.to_dict())))
    with staged_output(target, "model", last=(META,)) as tmp:  # meta.json last: a reader that sees it sees the rest
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
    return target


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
    return build_model(cfg.model, len(manifest.features), manifest.outputs, window=cfg.features.window)


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
        meta = json.loads((path / META).read_text())
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
    meta = json.loads((locate(model_dir) / META).read_text())
    return backend_key(meta["device"]["device"].split(":")[0], meta["precision"]["mode"])


def certified_backends(model_dir: str | Path | Location) -> list[str] | None:
    """The backends the doctor certified the saved model on; None where it never ran for it."""
    path = locate(model_dir) / CERTIFICATE
    if not path.is_file():
        return None
    return list(json.loads(path.read_text()).get("certified", []))


def _backend_lines(known: dict, history: list[dict]) -> list[str]:
    """The card's lines on trusting the backend: the known-bug table's findings for the run
    (``train/backend_check.py``) and the shadow check's figures (``train/shadow.py``), where there are any."""
    lines = []
    if known:
        matched = [f"{m['id']} ({m['source']})" for m in known.get("matched", [])]
        unknown = sorted({f"{u['id']} ({u['source']})" for u in known.get("unknown", [])})
        micro = known.get("micro_batch_rows") or 0
        if matched:
            lines.append(f"- known backend bugs met: {', '.join(matched)}; worked around with micro-batches of "
                         f"{micro:,} rows (the same gradient)")
        elif micro:
            lines.append(f"- micro-batches of {micro:,} rows (train.micro_batch_rows)")
        if unknown:
            lines.append(f"- known backend bugs the trace could not decide (unknown: probe): {', '.join(unknown)}")
        if not matched and not unknown:
            lines.append(f"- known backend bugs: none of the table's entries matches this run on {known['backend']}")
    checked = [row for row in history if "shadow_checks" in row]
    if checked:
        largest = max(row["shadow_max_error"] for row in checked)
        lines.append(f"- shadow check against a float32 CPU copy: {checked[-1]['shadow_checks']} checks up to "
                     f"epoch {checked[-1]['epoch']} (the exported one), largest whole-gradient error {largest:.2e}")
    return lines


def model_card(cfg: RunConfig, manifest: Manifest, metrics: dict, info: dict) -> str:
    n_tickers = len(manifest.tickers)
    splits = manifest.splits
    label = manifest.label
    lines = [
        f"# Model card: {cfg.storage.name}",
        "",
        f"- model: `{cfg.model.name}` (hidden {cfg.model.hidden}, layers {cfg.model.layers}, "
        f"dropout {cfg.model.dropout})",
        f"- data: {manifest.source}; {n_tickers} tickers; input hash `{manifest.input_hash[:16]}`",
        f"- features ({len(manifest.features)}): {', '.join(manifest.features)}",
        f"- label: {label['scheme']}, horizon {label['horizon']} bar(s), "
        + (f"classes {', '.join(label['classes'])}; " if label["classes"] else
           "regression on the forward return's place among the date's stocks; ")
        + "a signal at the close of t trades from the open of t+1",
        f"- splits: train {splits['train_start']}..{splits['train_end']}, "
        f"val {splits['val_start']}..{splits['val_end']}, "
        f"test {splits['test_start']}..{splits['test_end']} (embargo {splits['embargo']} bars)",
        f"- trained on: {info['device']['device']} ({info['device']['reason']}); precision {info['precision']['mode']} "
        f"({info['precision']['reason']})",
        f"- best epoch: {metrics['best_epoch']} by {metrics['selection_metric']}",
        *_backend_lines(info.get("known_bugs") or {}, metrics["history"]),
        f"- torch {info['environment']['torch']}, ray {info['environment']['ray']}, "
        f"git {info['environment']['git_commit']}",
        "",
    ]
    if n_tickers < FEW_TICKERS:
        lines += [f"> Only {n_tickers} tickers: cross-sectional statistics (IC, long-short) are not meaningful.", ""]
    cross = manifest.cross_section
    if cross:
        lines += [f"> Cross-sectional: {', '.join(sorted({op['kind'] for op in cross['ops']}))} across the stocks of "
                  f"each date; {cross['dates_dropped']} date(s) with fewer than {cross['min_names']} stocks dropped. "
                  "Survivorship: the tickers are those in the data, i.e. listed at its end date; stocks that were "
                  "delisted earlier are missing from every cross-section.", ""]
    nan = float("nan")
    if "test" not in metrics:  # sealed: no test figure was computed
        lines += [f"Test segment {splits['test_start']}..{splits['test_end']}: sealed, not scored at export. "
                  "`alchemetric-ray evaluate` scores it against the baselines; every look is recorded in "
                  "this folder's `looks/` and counted in the evaluation report.", "",
                  "| model | val " + ("rank IC" if manifest.regression else "balanced acc") + " |", "|---|---|"]
        key = "rank_ic" if manifest.regression else "balanced_accuracy"
        rows = [("deep model", metrics["val"]), *((n, b.get("val", {})) for n, b in metrics["baselines"].items())]
        lines += [f"| {name} | {val.get(key, nan):.4f} |" for name, val in rows]
        return "\n".join(lines) + "\n"
    if manifest.regression:
        header = ("| model | val rank IC | test rank IC | test IC | test MSE |",
                  lambda v, t: (v.get("rank_ic", nan), t.get("rank_ic", nan), t.get("ic", nan), t.get("mse", nan)))
    else:
        header = ("| model | val balanced acc | test balanced acc | test log loss | test macro F1 |",
                  lambda v, t: (v.get("balanced_accuracy", nan), t.get("balanced_accuracy", nan),
                                t.get("log_loss", nan), t.get("macro_f1", nan)))
    lines += [header[0], "|---|---|---|---|---|"]
    rows = [("deep model", metrics["val"], metrics["test"])]
    rows += [(name, b.get("val", {}), b.get("test", {})) for name, b in metrics["baselines"].items()]
    for name, val, test in rows:
        lines.append(f"| {name} | " + " | ".join(f"{value:.4f}" for value in header[1](val, test)) + " |")
    return "\n".join(lines) + "\n"
