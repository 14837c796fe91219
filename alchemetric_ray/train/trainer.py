"""Assemble and run a Ray Train ``TorchTrainer`` for one run config; export the best model.

``run_training(cfg)`` is the whole ``train`` command: Ray (local, or the cluster a job runs in),
feature shards (built from raw OHLCV when needed), the resource plan, ``fit()``, then the best
checkpoint exported with baselines and test metrics.  The same call serves the CLI, the
``ray job submit`` entry point and each Tune trial.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alchemetric_ray import console
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.loaders import build_datasets
from alchemetric_ray.data.shards import MANIFEST, build_shards, load_manifest
from alchemetric_ray.hardware.records import require_doctor_checked_precision
from alchemetric_ray.errors import UserError
from alchemetric_ray.fsutil import safe_child
from alchemetric_ray.models import model_spec
from alchemetric_ray.train.export import check_models_dir, export_model
from alchemetric_ray.train.metrics import selection_mode
from alchemetric_ray.train.plan import ResourcePlan, plan_resources

# Each ray.train.report() waits up to this interval (Ray's default is 2 s): a deliberate,
# small value keeps the per-epoch overhead low without busy-polling the workers.
HEALTH_CHECK_INTERVAL_S = "0.25"
# How often the controller may fail (e.g. a worker group that cannot start) before the run
# fails; Ray's default (-1) retries forever.
CONTROLLER_FAILURE_LIMIT = 2
WORKER_GROUP_START_TIMEOUT_S = "120"


class TrainError(UserError, RuntimeError):
    pass


@dataclass
class TrainOutcome:
    run_name: str
    run_path: str | None
    shards: Path
    plan: ResourcePlan
    summary: dict[str, Any]  # the loop's return value (rank 0)
    best_checkpoint: Any  # ray.train.Checkpoint | None
    best_metrics: dict[str, Any] | None
    latest_checkpoint: Any
    model_dir: Path | None
    seconds: float
    tensorboard: Path | None = None  # the run's TensorBoard event files (local storage)


def worker_env(cfg: RunConfig) -> dict[str, str]:
    """Environment every Ray worker needs before torch loads."""
    env = {
        "PYTORCH_ENABLE_MPS_FALLBACK": "1" if cfg.device.mps_fallback == "warn" else "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", HEALTH_CHECK_INTERVAL_S),
    }
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):  # where the token lives, never the token itself
        env["RAY_AUTH_TOKEN_PATH"] = os.environ["RAY_AUTH_TOKEN_PATH"]
    if console.verbose():
        env[console.VERBOSE_ENV] = "1"
    return env


def ensure_ray(cfg: RunConfig) -> None:
    """Join the cluster this process runs in (``ray job submit`` sets RAY_ADDRESS), else start a local Ray."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", HEALTH_CHECK_INTERVAL_S)
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", WORKER_GROUP_START_TIMEOUT_S)
    env = {**worker_env(cfg), "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"]}
    console.quiet_ray_logger()
    quiet = {"logging_level": logging.INFO if console.verbose() else logging.WARNING, "log_to_driver": True}
    if os.environ.get("RAY_ADDRESS"):
        # Ray's own helpers in our actors (Train's placement-group cleaner) find the cluster through
        # RAY_ADDRESS too; without it they fail wherever several Ray instances share a machine.
        env["RAY_ADDRESS"] = os.environ["RAY_ADDRESS"]
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": env}, **quiet)
    else:
        from alchemetric_ray.hardware.inventory import cpu_count

        # Logical CPUs above the physical count let Train workers and Ray Data readers coexist on a
        # small laptop without waiting on each other (the plan still keeps one free for Ray Data).
        # address="local": always a new Ray of our own, never one a `ray start` on this machine left running
        ray.init(address="local", num_cpus=max(4, cpu_count()), include_dashboard=True, dashboard_host="127.0.0.1",
                 runtime_env={"env_vars": env}, **quiet)
    console.quiet_driver()
    logs = console.session_logs()
    if logs:
        print(f"ray: session logs in {logs}", flush=True)


def check_storage_reaches_every_node(cfg: RunConfig) -> None:
    """Checkpoints must be on storage every node sees: refuse a plain local path on a multi-node
    cluster unless the user says it is a shared mount (storage.shared=true)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and "://" not in cfg.storage.path and not cfg.storage.shared:
        raise TrainError(f"config 'storage.path': {cfg.storage.path} is a local folder but the Ray cluster has "
                         f"{len(nodes)} nodes; use storage every node sees (s3://..., gs://...) or, for an NFS/EFS "
                         "mount at the same path on every node, set storage.shared=true")


def prepare_shards(cfg: RunConfig, *, progress: bool = True) -> Path:
    """The feature shards for ``cfg``: ``data.path`` itself if it holds shards, else built once."""
    if cfg.data.path and (Path(cfg.data.path) / MANIFEST).is_file():
        return Path(cfg.data.path)
    storage = _local_storage(cfg)
    out = safe_child(storage / "features", cfg.storage.name, "storage.name")
    print(f"features: building shards from {cfg.data.path or cfg.data.source} into {out}", flush=True)
    build_shards(cfg, out, progress=progress)
    return out


def _local_storage(cfg: RunConfig) -> Path:
    if "://" in cfg.storage.path:
        raise TrainError(f"config 'storage.path': {cfg.storage.path} is a URI; build the feature shards on shared storage "
                         "first (`alchemetric-ray features --out ...`) and pass that folder as --data")
    return Path(cfg.storage.path).resolve()


def storage_uri(cfg: RunConfig) -> str:
    return cfg.storage.path if "://" in cfg.storage.path else str(Path(cfg.storage.path).resolve())


def run_name(cfg: RunConfig) -> str:
    """The Train run's name: storage.run, the latest run of this name (resume), or a fresh one."""
    if cfg.storage.run:
        return safe_child(".", cfg.storage.run, "storage.run").name
    base = safe_child(".", cfg.storage.name, "storage.name").name
    if cfg.storage.resume and "://" not in cfg.storage.path:
        runs = sorted(p.name for p in Path(cfg.storage.path).glob(f"{base}-*") if p.is_dir())
        if runs:
            return runs[-1]
        raise TrainError(f"storage.resume=true but there is no earlier run named {base}-* in {cfg.storage.path}")
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_compatible(cfg: RunConfig, manifest: dict) -> None:
    spec = model_spec(cfg.model)
    if spec.inputs == "sequence":
        rows = manifest["rows"]["train"]
        per_ticker = rows / max(1, len(manifest["tickers"]))
        if per_ticker < cfg.features.window:
            raise TrainError(f"config 'features.window': {cfg.features.window} bars, but the train split has only "
                             f"{per_ticker:.0f} rows per ticker: no full sequence window")
    for split in ("train", "val"):
        if manifest["rows"][split] == 0:
            raise TrainError(f"the {split} split of the shards is empty")


def build_trainer(cfg: RunConfig, datasets: dict, manifest: dict, plan: ResourcePlan, *, name: str,
                  callbacks: list | None = None, local_mode: bool = False, epoch_lines: bool = True):
    from ray.data import ExecutionOptions  # noqa: F401 (type of the options object)
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from alchemetric_ray.train.data_config import CompleteValidationConfig
    from alchemetric_ray.train.loop import train_loop_per_worker

    resources = {"CPU": plan.cpus_per_worker}
    if plan.use_gpu:
        resources["GPU"] = plan.gpus_per_worker
    options = DataConfig.default_ingest_options()
    if cfg.train.deterministic:
        options.preserve_order = True
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"run": cfg.to_dict(), "manifest": manifest, "plan": plan, "epoch_lines": epoch_lines},
        scaling_config=ScalingConfig(num_workers=0 if local_mode else plan.num_workers, use_gpu=plan.use_gpu,
                                     resources_per_worker=None if local_mode else resources,
                                     placement_strategy=cfg.scaling.placement),
        torch_config=TorchConfig(backend=plan.backend),
        datasets=datasets,
        dataset_config=CompleteValidationConfig(execution_options=options),  # val: every row, once
        run_config=TrainRunConfig(
            name=name,
            storage_path=storage_uri(cfg),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.storage.num_to_keep,
                                               checkpoint_score_attribute=cfg.train.metric,
                                               checkpoint_score_order=selection_mode(cfg.train)),
            failure_config=FailureConfig(max_failures=cfg.scaling.max_failures,
                                         controller_failure_limit=CONTROLLER_FAILURE_LIMIT),
            worker_runtime_env={"env_vars": worker_env(cfg)},
            callbacks=callbacks,
            logging_config=console.train_logging_config(),
        ),
    )


def run_training(cfg: RunConfig, *, export: bool = True, callbacks: list | None = None, local_mode: bool = False,
                 progress: bool = True, name: str | None = None) -> TrainOutcome:
    import ray

    started = time.monotonic()
    model_spec(cfg.model)  # an unknown model (or model.module) fails before anything starts
    if export:
        check_models_dir(cfg.storage.models_dir)  # refused now, not after the training
    ensure_ray(cfg)
    check_storage_reaches_every_node(cfg)
    plan = plan_resources(cfg, ray.cluster_resources())  # before any shard is written
    require_doctor_checked_precision(cfg, plan.accelerator)
    shards = prepare_shards(cfg, progress=progress)
    manifest = load_manifest(shards)
    check_compatible(cfg, manifest)
    print("resource plan:\n" + plan.describe(), flush=True)
    console.quiet_ray_data()
    datasets, _ = build_datasets(shards, model_spec(cfg.model.name).inputs, cfg.features.window,
                                 deterministic=cfg.train.deterministic)
    name = name or run_name(cfg)
    tensorboard = None
    if "://" not in cfg.storage.path:  # event files beside the run's checkpoints
        from alchemetric_ray.train.tensorboard import SUBDIR, TensorBoardScalars

        tensorboard = Path(storage_uri(cfg)) / name / SUBDIR
        callbacks = [*(callbacks or []), TensorBoardScalars(tensorboard)]
    trainer = build_trainer(cfg, datasets, manifest, plan, name=name, callbacks=callbacks, local_mode=local_mode)
    try:
        result = trainer.fit()
    except Exception as exc:  # ray.train.TrainingFailedError: the worker's whole traceback
        user = _worker_user_error(exc)
        if user is None:
            raise
        raise TrainError(str(user).splitlines()[0]) from None
    best_ckpt, best_metrics = _best(result, cfg)
    outcome = TrainOutcome(name, getattr(result, "path", None), shards, plan, result.return_value or {},
                           best_ckpt, best_metrics, result.checkpoint, None, 0.0, tensorboard)
    if export and best_ckpt is not None:
        outcome.model_dir = export_model(best_ckpt, cfg, shards)
    outcome.seconds = time.monotonic() - started
    return outcome


def _worker_user_error(exc: BaseException) -> UserError | None:
    """A worker's own one-line error (NaN loss, skipped steps, bad data) inside Ray Train's wrapper."""
    failures = getattr(exc, "worker_failures", None) or {}
    return next((failures[rank] for rank in sorted(failures) if isinstance(failures[rank], UserError)), None)


def _best(result, cfg: RunConfig):
    ranked = [(c, m) for c, m in (getattr(result, "best_checkpoints", None) or []) if cfg.train.metric in m]
    if not ranked:
        return result.checkpoint, result.metrics
    sign = 1 if selection_mode(cfg.train) == "max" else -1
    return max(ranked, key=lambda cm: sign * cm[1][cfg.train.metric])
