"""Assemble and run a Ray Train ``TorchTrainer`` for one run config; export the best model.

``run_training(cfg)`` is the whole ``train`` command: Ray (local, or the cluster a job runs in),
feature shards (built from raw OHLCV when needed), the resource plan, ``fit()``, then the best
checkpoint exported with baselines and test metrics.  The same call serves the CLI and the
``ray job submit`` entry point.  ``prepare_run`` is the setup it shares with ``tune`` (the sweep's
trials build their ``TorchTrainer`` with ``build_trainer`` too); the Ray session itself is in
``placement/session.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, cast

from alchemetric_ray import console
from alchemetric_ray.artifacts.export import check_models_dir, claim_model_folder, estimated_export_bytes, export_model
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.loaders import ShardReader, build_datasets, check_shard_files
from alchemetric_ray.data.manifest import MANIFEST, Manifest, reconcile_features
from alchemetric_ray.data.shards import build_shards
from alchemetric_ray.errors import ConfigError, Interrupted, StorageError, TrainError, UserError
from alchemetric_ray.fsutil import is_uri, safe_child
from alchemetric_ray.hardware.records import require_doctor_checked_precision
from alchemetric_ray.interrupts import seen_during
from alchemetric_ray.models import is_cross_sectional, model_spec
from alchemetric_ray.placement.autoscale import CONTROLLER_FAILURE_LIMIT, run_bundles, scale_up
from alchemetric_ray.placement.capacity import discover_capacity
from alchemetric_ray.placement.plan import ResourcePlan, plan_resources, runs_in_trial
from alchemetric_ray.placement.session import (
    check_storage_access,
    check_storage_reaches_every_node,
    ensure_ray,
    machine_resources,
    run_name,
    storage_location,
    train_storage,
    worker_env,
)
from alchemetric_ray.scoring.objective import loss_of, selection_metric, selection_mode
from alchemetric_ray.storage import Location, local_copy, locate
from alchemetric_ray.tracking.logger import RunLog
from alchemetric_ray.training.summary import LoopSummary


@dataclass
class TrainOutcome:
    run_name: str
    run_path: str | None
    shards: Location
    plan: ResourcePlan
    summary: LoopSummary  # the loop's return value (rank 0)
    best_checkpoint: Any  # ray.train.Checkpoint | None
    best_metrics: dict[str, Any] | None
    latest_checkpoint: Any
    model_dir: Location | None
    seconds: float
    tensorboard: Location | None = None  # the run's TensorBoard event files
    config: RunConfig | None = None  # the run's config, with the shards' target (adopt_target)
    log: RunLog = field(default_factory=RunLog)  # the run's log (MLflow's, or none), open for an evaluation
    seeds: list[TrainOutcome] = field(default_factory=list)  # train.seeds > 1: each seed's run, in seed order


def prepare_shards(cfg: RunConfig, *, progress: bool = True) -> Location:
    """The feature shards for ``cfg``: ``data.path`` itself if it holds shards (a local folder or
    object storage), else built from the raw bars into ``<storage.path>/features/<storage.name>``."""
    given = given_shards(cfg)
    if given is not None:
        return given
    out = storage_location(cfg) / "features" / safe_child(".", cfg.storage.name, "storage.name").name
    print(f"features: building shards from {cfg.data.path or cfg.data.source} into {out}", flush=True)
    if cfg.data.path and is_uri(cfg.data.path):  # raw bars on object storage: read from a temporary local copy
        with local_copy(cfg.data.path) as raw:
            built = build_shards(cfg.replace(f"data.path={raw}"), out, source_description=cfg.data.path,
                                 progress=progress)
    else:
        built = build_shards(cfg, out, progress=progress)
    for line in built.manifest.notes():
        print(f"features: {line}", flush=True)
    return out


def given_shards(cfg: RunConfig) -> Location | None:
    """``data.path`` where it is a feature-shard folder already built (it holds a manifest), else None."""
    if cfg.data.path and (locate(cfg.data.path) / MANIFEST).is_file():
        return locate(cfg.data.path)
    return None


def adopt_target(cfg: RunConfig, manifest: Manifest) -> RunConfig:
    """The shards decide the target: trained from a shard folder built with another
    ``features.label``, the config takes the shards' (what the saved model's config then says),
    and a ``train.metric`` that cannot score that target is refused in one line."""
    scheme = manifest.label["scheme"]
    if cfg.features.label == scheme:
        return cfg
    try:
        return cfg.replace(f"features.label={scheme}")
    except ConfigError as exc:
        raise TrainError(f"the shards' label is {scheme}: {exc}") from None


def check_compatible(cfg: RunConfig, manifest: Manifest) -> None:
    spec = model_spec(cfg.model)
    if spec.inputs == "sequence":
        rows = manifest.rows["train"]
        per_ticker = rows / max(1, len(manifest.tickers))
        if per_ticker < cfg.features.window:
            raise TrainError(f"config 'features.window': {cfg.features.window} bars, but the train split has only "
                             f"{per_ticker:.0f} rows per ticker: no full sequence window")
    for split in ("train", "val"):
        if manifest.rows[split] == 0:
            raise TrainError(f"the {split} split of the shards is empty")
    if is_cross_sectional(spec):
        _check_cross_sectional(cfg, manifest)
    widest = (manifest.cross_section or {}).get("max_names", 0)
    if loss_of(cfg) == "ic" and cfg.train.batch_size < widest:
        raise TrainError(f"config 'train.batch_size': {cfg.train.batch_size} rows is smaller than a date's "
                         f"cross-section ({widest} stocks on a date in the shards), and the IC loss needs whole "
                         f"dates in a batch; set train.batch_size to {widest} or more")


def _check_cross_sectional(cfg: RunConfig, manifest: Manifest) -> None:
    """A cross-sectional model learns a date's ranking: a regression target, the IC loss, whole dates
    (the cached data path)."""
    name = cfg.model.name
    if not manifest.regression:
        raise TrainError(f"config 'model.name': {name} scores a date's stocks together and trains with the IC loss, "
                         f"which needs a regression target, not features.label={manifest.label['scheme']}; "
                         "use features.label=cs_rank or cs_zscore")
    if loss_of(cfg) != "ic":
        raise TrainError(f"config 'train.loss': {name} trains with the IC loss on whole dates, not "
                         f"{cfg.train.loss}; set train.loss=ic (or auto)")
    if not cfg.train.cache_data:
        raise TrainError(f"config 'train.cache_data': {name} needs whole dates in every batch, which only the cached "
                         "data path gives; set train.cache_data=true")


def loop_config(cfg: RunConfig, manifest: Manifest, plan: ResourcePlan, *, epoch_lines: bool = True) -> dict:
    """What the per-worker loop is given (``train_loop_config``), in a Train worker or a trial's process."""
    return {"run": cfg.to_dict(), "manifest": manifest, "plan": plan, "epoch_lines": epoch_lines}


def data_config(cfg: RunConfig):
    """How the datasets reach the loop: val every row, once; train split by date for the IC loss."""
    from ray.train import DataConfig

    from alchemetric_ray.training.data_config import CompleteValidationConfig

    options = DataConfig.default_ingest_options()
    if cfg.train.deterministic:
        options.preserve_order = True
    return CompleteValidationConfig(execution_options=options, by_date=loss_of(cfg) == "ic",
                                    val_by_date=is_cross_sectional(model_spec(cfg.model)))


@dataclass(frozen=True)
class Execution:
    """How a ``TorchTrainer`` runs its loop: in a worker group, or with ``local_mode`` in this process
    (``runtime``: a ``LocalRun`` that persists its reports; without one, Ray's local mode as it is);
    Ray Train's ``callbacks`` (worker mode); ``epoch_lines``: the loop prints a line per epoch (a sweep's
    trials print one line each instead); ``reader``: the shards a one-worker group reads with pyarrow."""

    local_mode: bool = False
    runtime: Any = None
    callbacks: list | None = None
    epoch_lines: bool = True
    reader: ShardReader | None = None  # a worker group of one: its worker reads its cached shards with pyarrow


def build_trainer(cfg: RunConfig, datasets: dict | None, manifest: Manifest, plan: ResourcePlan, *, name: str,
                  execution: Execution = Execution()):
    """The run's ``TorchTrainer``, run as ``execution`` says."""
    from ray.train import CheckpointConfig, FailureConfig, ScalingConfig
    from ray.train import RunConfig as TrainRunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from alchemetric_ray.training.loop import local_loop, train_loop_per_worker

    local_mode, runtime = execution.local_mode, execution.runtime
    config = loop_config(cfg, manifest, plan, epoch_lines=execution.epoch_lines)
    if local_mode and runtime is not None:
        config["runtime"] = runtime
    elif not local_mode:
        config["run_dir"] = str(storage_location(cfg) / name)  # a newer checkpoint there wins (train/runtime.py)
        if execution.reader is not None:
            config["reader"] = execution.reader
    return TorchTrainer(
        # a local run's LoopSummary comes back as result.return_value
        local_loop if local_mode and runtime is not None else train_loop_per_worker,  # type: ignore[arg-type]  # Ray: -> None
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=0 if local_mode else plan.num_workers, use_gpu=plan.use_gpu,
                                     resources_per_worker=None if local_mode else plan.worker_bundle(),
                                     placement_strategy=cfg.scaling.placement),
        torch_config=TorchConfig(backend=plan.backend),
        datasets=datasets,
        dataset_config=data_config(cfg) if datasets else None,
        run_config=TrainRunConfig(  # type: ignore[call-arg]  # ray.train exports V2's at runtime, mypy reads V1's
            name=name,
            **train_storage(cfg),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.storage.num_to_keep,
                                               checkpoint_score_attribute=selection_metric(cfg),
                                               checkpoint_score_order=selection_mode(cfg)),
            failure_config=FailureConfig(  # type: ignore[call-arg]  # V2's at runtime, as above
                max_failures=cfg.scaling.max_failures, controller_failure_limit=CONTROLLER_FAILURE_LIMIT),
            worker_runtime_env={"env_vars": worker_env(cfg)},
            callbacks=execution.callbacks,
            logging_config=console.train_logging_config(),
        ),
    )


@dataclass
class Prepared:
    """What :func:`prepare_run` hands to ``run_training`` and ``run_sweep``."""

    name: str  # the Train run's (or the sweep's) name
    cfg: RunConfig  # the config given, with the shards' target (adopt_target)
    plan: ResourcePlan
    shards: Location
    manifest: Manifest
    datasets: dict[str, Any] | None  # Ray Datasets; None for a sweep (each trial builds its own) or with a reader
    local: bool = False  # the loop runs in this process (runs_locally), and why
    local_why: str = ""
    reader: ShardReader | None = None  # the one worker reads the cached shards with pyarrow (reads_with_pyarrow)


def prepare_run(cfg: RunConfig, *, sweep: bool = False, export: bool = True, name: str | None = None,  # noqa: PLR0913
                progress: bool = True, local_mode: bool | None = None, show_plan: bool = True) -> Prepared:
    """The steps before ``fit()`` that ``train`` and ``tune`` share, in one order: the cheap checks
    first, then the plan (with Ray, where the run needs it: :func:`plan_run`; before any shard is
    written), the shards and what they must hold.

    A sweep passes its trial config (its plan is per trial) and gets no datasets: each trial builds
    its own, without checking the shard files again.  ``local_mode``: as :func:`run_training`'s."""
    model_spec(cfg.model)  # an unknown model (or model.module) fails before anything starts
    if cfg.tracking.mlflow_uri:  # MLflow installed and its store answering: before anything starts
        from alchemetric_ray.tracking.mlflow_runs import preflight

        preflight(cfg.tracking.mlflow_uri)
    if export:
        check_models_dir(cfg.storage.models_dir)  # refused now, not after the training
        claim_model_folder(cfg)
    check_storage_access(cfg, export=export)  # credentials, endpoint, buckets: before Ray starts
    given = given_shards(cfg)
    if given is not None:  # features.* overrides the shards were not built with: refused before Ray starts
        reconcile_features(cfg, Manifest.read(given), given)
    plan, local, local_why = plan_run(cfg, sweep=sweep, local_mode=local_mode)  # before any shard
    _check_storage_for_new_nodes(cfg, plan)
    require_doctor_checked_precision(cfg, plan.accelerator)
    shards = prepare_shards(cfg, progress=progress)
    manifest = Manifest.read(shards)
    check_shard_files(shards, manifest)  # once, here: a sweep's trials skip it
    cfg = adopt_target(reconcile_features(cfg, manifest, shards), manifest)
    check_compatible(cfg, manifest)
    if export:  # the model's real size, now that its inputs are known
        check_models_dir(cfg.storage.models_dir, estimated_export_bytes(cfg, manifest))
    name = name or run_name(cfg, sweep=sweep)
    if show_plan:  # a seed ensemble's later seeds run the first one's plan: said once
        print(("resource plan per trial:\n" if sweep else "resource plan:\n") + plan.describe(), flush=True)
    if sweep:
        return Prepared(name, cfg, plan, shards, manifest, None)
    inputs = model_spec(cfg.model.name).inputs
    pyarrow = reads_with_pyarrow(cfg, plan, local)
    if not (local and pyarrow):  # Ray Data reads the shards, or (a worker group's run) predicts the test segment
        console.quiet_ray_data()
    if pyarrow:
        return Prepared(name, cfg, plan, shards, manifest, None, local, local_why,
                        ShardReader(shards, manifest, inputs, cfg.features.window))
    datasets, _ = build_datasets(shards, inputs, cfg.features.window, check=False)
    return Prepared(name, cfg, plan, shards, manifest, datasets, local, local_why)


def plan_run(cfg: RunConfig, *, sweep: bool = False, local_mode: bool | None = None
             ) -> tuple[ResourcePlan, bool, str]:
    """The resource plan, whether the loop runs in this process and why, with Ray started only where
    the run needs it (:func:`uses_ray`).  A run on this machine (no Ray joined or up) is planned with
    what a local Ray would advertise (``session.machine_resources``); where it needs no Ray, none
    starts.  Otherwise Ray is joined or started, and the plan made with what it advertises."""
    import ray

    if not (sweep or ray.is_initialized() or os.environ.get("RAY_ADDRESS")):
        plan = plan_resources(cfg, machine_resources())
        local, why = _where(cfg, plan, 1, local_mode)
        if not _say_ray_use(cfg, plan, local, sweep=False, up=False):
            console.quiet_without_ray()
            return plan, local, why
    up = ray.is_initialized()
    ensure_ray(cfg)
    check_storage_reaches_every_node(cfg)
    plan = plan_resources(cfg, ray.cluster_resources(), discover_capacity(cfg), trial=sweep)
    local, why = (False, "a sweep's trials") if sweep else \
        _where(cfg, plan, sum(1 for node in ray.nodes() if node.get("Alive")), local_mode)
    _say_ray_use(cfg, plan, local, sweep=sweep, up=up)
    return plan, local, why


def _say_ray_use(cfg: RunConfig, plan: ResourcePlan, local: bool, *, sweep: bool, up: bool) -> bool:
    """The plan's ``ray`` line (and, where no Ray Data reads, its data line); whether Ray is needed."""
    needed, plan.reasons.ray = uses_ray(cfg, local, sweep=sweep, up=up)
    if not needed:
        plan.cpus_for_data, plan.reasons.data = 0, "pyarrow reads the shards once, in this process"
    elif reads_with_pyarrow(cfg, plan, local, sweep=sweep):
        plan.reasons.data = ("each trial reads its cached shards once with pyarrow, in its own process: no Ray Data"
                             if sweep else "the worker reads its cached shards once with pyarrow: no Ray Data")
    return needed


def reads_with_pyarrow(cfg: RunConfig, plan: ResourcePlan, local: bool, *, sweep: bool = False) -> bool:
    """Whether the loop reads its cached shards (``train.cache_data``) itself with pyarrow
    (``data/loaders.py:ShardReader``) instead of through Ray Data: one worker (a local run, a worker group of
    one, a sweep's one-worker trial), which reads every row of them anyway; its read task, Ray Data's actors
    and their processes are not started.  Several workers split the rows through Ray Data; a streamed run
    (``train.cache_data=false``) reads them every epoch through it."""
    if not cfg.train.cache_data:
        return False
    return runs_in_trial(cfg, plan) if sweep else (local or plan.num_workers == 1)


def uses_ray(cfg: RunConfig, local: bool, *, sweep: bool, up: bool) -> tuple[bool, str]:
    """Whether a run needs Ray, and what for (the plan's ``ray`` line): a sweep's trials (Tune), a
    worker group (Train), or shards streamed every epoch (Ray Data).  A one-worker run in this process
    that caches its shards reads them with pyarrow and needs none (``up``: a Ray that was up before
    this run, such as a notebook's ``ray.init()``, is left unused)."""
    if sweep:
        return True, "Ray Tune runs the sweep's trials"
    if not local:
        return True, "a Ray Train worker group runs the loop"
    if not cfg.train.cache_data:
        return True, "Ray Data streams the shards every epoch (train.cache_data=false)"
    return False, (("up, unused" if up else "not started") + ": one worker in this process reads its cached "
                   "shards with pyarrow (a worker group, train.cache_data=false or a sweep would use Ray)")


def _where(cfg: RunConfig, plan: ResourcePlan, nodes: int, local_mode: bool | None) -> tuple[bool, str]:
    return runs_locally(cfg, plan, nodes) if local_mode is None else (local_mode, "asked by the caller")


def _check_storage_for_new_nodes(cfg: RunConfig, plan: ResourcePlan) -> None:
    """The nodes an autoscaling plan asks for are not up yet, so the node count cannot tell: the
    workers will run elsewhere than this driver, and a plain local folder does not reach them."""
    if plan.autoscale and not is_uri(cfg.storage.path) and not cfg.storage.shared:
        raise StorageError(f"config 'storage.path': {cfg.storage.path} is a local folder but the workers will run on "
                           f"nodes the autoscaler adds ({plan.capacity}); use storage every node sees (s3://..., "
                           "gs://...) or, for an NFS/EFS mount at the same path on every node, set storage.shared=true")


def run_training(cfg: RunConfig, *, export: bool = True, local_mode: bool | None = None, progress: bool = True,
                 name: str | None = None, show_plan: bool = True) -> TrainOutcome:
    """The ``train`` command: prepare, ask for the workers and wait (placement/autoscale.py), ``fit()``,
    export.  The autoscaler's resource request is cleared however the fit ends.

    ``local_mode`` (None: ``train.local_mode``, decided by :func:`runs_locally`) runs the loop in
    this process.  A Ctrl-C raises :class:`Interrupted` once the run has stopped: every checkpoint
    finished before it stays in the run folder, and ``--resume`` continues after the latest."""
    from alchemetric_ray.artifacts.run_folder import Kept, RunFolder
    from alchemetric_ray.tracking.mlflow_runs import run_log
    from alchemetric_ray.tracking.tensorboard import SUBDIR, write_hparams

    if cfg.train.seeds > 1:
        return _run_seeds(cfg, export=export, local_mode=local_mode, progress=progress, name=name)
    started = time.monotonic()
    run = prepare_run(cfg, export=export, name=name, progress=progress, local_mode=local_mode, show_plan=show_plan)
    cfg = run.cfg
    if show_plan:
        loop = "in this process (Ray Train local mode)" if run.local else "a Ray Train worker group"
        print(f"train loop       {loop} ({run.local_why})", flush=True)
    where = storage_location(cfg)
    folder = RunFolder(where / run.name, keep=cfg.storage.num_to_keep, metric=selection_metric(cfg),
                       mode=selection_mode(cfg))
    tensorboard = where / run.name / SUBDIR  # event files beside the run's checkpoints
    log = run_log(cfg, where / run.name, run.name, tags={"command": "train"})
    result = _fit_logged(cfg, run, folder, tensorboard, log)
    best, latest = folder.best(), folder.latest(warn=False)
    outcome = TrainOutcome(run.name, str(folder.where) if where.is_local else str(where / run.name), run.shards,
                           run.plan, result.return_value or LoopSummary(), best and best.checkpoint(),
                           best.metrics if best else None, latest and latest.checkpoint(), None, 0.0, tensorboard, cfg,
                           log)
    # the HParams tab: the run's settings beside its best epoch's figures (as a sweep's trials show them)
    write_hparams(tensorboard, cfg.flat(), {**(outcome.best_metrics or {}),
                                            "epochs_run": outcome.summary.epochs_run})
    log.log_outcome(outcome)
    if export and best is not None:
        done = f"after epoch {cast(Kept, latest).epoch + 1} of {cfg.train.epochs}"  # a best one, so a latest
        outcome.model_dir = _export_logged(cfg, outcome, log, done)
    log.finalize()  # an evaluation after this still logs into the run (cli.py)
    outcome.seconds = time.monotonic() - started
    return outcome


def _run_seeds(cfg: RunConfig, *, export: bool, local_mode: bool | None, progress: bool,
               name: str | None) -> TrainOutcome:
    """``train.seeds`` > 1: one whole run per seed (``train.seed``, +1, ...), named ``<run>-seed<i>``
    (``--resume`` continues the latest such set: finished seeds train nothing again), then the seed
    ensemble of their best checkpoints exported as the model, logged and registered in the last seed's
    run.  The outcome is the last seed's, with the ensemble's model and config and every seed's run."""
    from alchemetric_ray.artifacts.export import export_ensemble

    started = time.monotonic()
    if export:  # refused now, not after the first seed's training
        check_models_dir(cfg.storage.models_dir)
        claim_model_folder(cfg)
    base = re.sub(r"-seed\d+$", "", name or run_name(cfg))
    outcomes: list[TrainOutcome] = []
    for i in range(cfg.train.seeds):
        seed = cfg.train.seed + i
        print(f"seed {i + 1} of {cfg.train.seeds}: train.seed={seed}, run {base}-seed{i}", flush=True)
        # the first seed's run builds the shards (where data.path holds bars); the others read them
        data = [f"data.path={outcomes[0].shards.uri}"] if outcomes else []
        outcomes.append(run_training(cfg.replace(f"train.seed={seed}", "train.seeds=1", *data), export=False,
                                     local_mode=local_mode, progress=progress, name=f"{base}-seed{i}",
                                     show_plan=not outcomes))
    # the model's config: the first seed's (its data section names the bars, not the shards), all seeds
    first = cast(RunConfig, outcomes[0].config)
    outcome = dataclasses.replace(outcomes[-1], run_name=base, config=first.replace(f"train.seeds={cfg.train.seeds}"),
                                  seeds=outcomes)
    if export:
        missing = [o.run_name for o in outcomes if o.best_checkpoint is None]
        if missing:
            raise TrainError(f"run {missing[0]} has no checkpoint to export: the seed ensemble needs every seed's")
        try:
            outcome.model_dir = export_ensemble([o.best_checkpoint for o in outcomes], cast(RunConfig, outcome.config),
                                                outcome.shards)
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted after the {cfg.train.seeds} seeds' training, while exporting their "
                              "ensemble (nothing of it written)") from None
        outcome.log.log_artifacts(outcome.model_dir / "model_card.md")
        outcome.log.register(outcome.model_dir)
    outcome.seconds = time.monotonic() - started
    return outcome


def _fit_logged(cfg: RunConfig, run: Prepared, folder, tensorboard: Location, log) -> Any:
    """``fit()`` inside the scale-up window, its epochs logged live; a Ctrl-C becomes :class:`Interrupted`
    (the finished epochs logged, the logged run KILLED), any other end of it FAILED."""
    from alchemetric_ray.tracking.tensorboard import ScalarWriter, TensorBoardScalars

    scalars: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if run.local:
        from alchemetric_ray.training.runtime import LocalRun

        runtime = LocalRun(run.datasets, run.datasets and data_config(cfg), folder, ScalarWriter(tensorboard),
                           reader=run.reader)
        scalars = contextlib.closing(cast(ScalarWriter, runtime.scalars))  # the ScalarWriter given just above
        trainer = build_trainer(cfg, run.datasets, run.manifest, run.plan, name=run.name,
                                execution=Execution(local_mode=True, runtime=runtime))
    else:
        trainer = build_trainer(cfg, run.datasets, run.manifest, run.plan, name=run.name,
                                execution=Execution(callbacks=[TensorBoardScalars(tensorboard)], reader=run.reader))
    try:
        with scalars, scale_up(cfg, run.plan, run_bundles(run.plan), local_mode=run.local) as window, \
                log.live(folder.where, cfg.tracking.live_every_s):
            window.apply()  # what our wait left of scaling.start_timeout_s, per worker-group start attempt
            result = _fit(trainer, run.local)
    except (KeyboardInterrupt, _SigintExit):
        latest = folder.latest(warn=False)
        done = f"after epoch {latest.epoch + 1} of {cfg.train.epochs}" if latest else \
            f"before its first epoch finished ({cfg.train.epochs} planned)"
        if latest is not None:  # the finished epochs are logged too; --resume logs only the ones after them
            log.log_epochs(latest.history)
        log.finalize("KILLED")
        raise Interrupted(f"interrupted {done}", resumable=latest is not None) from None
    except BaseException:
        log.finalize("FAILED")
        raise
    if not run.local:
        folder.prune()  # folders Ray Train's snapshot missed (an earlier Ctrl-C) are ranked like the others
    return result


def _export_logged(cfg: RunConfig, outcome: TrainOutcome, log, done: str) -> Location:
    """The best checkpoint exported, its model card logged and registered; a Ctrl-C during the export
    keeps the epochs (``--resume`` trains none again and exports)."""
    try:
        model_dir = export_model(outcome.best_checkpoint, cfg, outcome.shards)
    except KeyboardInterrupt:
        log.finalize("KILLED")
        raise Interrupted(f"interrupted {done}, while exporting the model (nothing of it written)") from None
    log.log_artifacts(model_dir / "model_card.md")
    log.register(model_dir)
    return model_dir


def runs_locally(cfg: RunConfig, plan: ResourcePlan, nodes: int = 1) -> tuple[bool, str]:
    """Whether the loop runs in this process, and why: ``train.local_mode=auto`` does for one worker
    on this machine (no Ray, or a Ray of one node that this process did not join through
    RAY_ADDRESS: the worker would run on this machine anyway), and not under torchrun (whose
    variables make Ray's local mode join a process group); ``true`` where that does not hold is
    refused in one line."""
    mode = cfg.train.local_mode
    if mode == "false":
        return False, "train.local_mode=false"
    problems = []
    if plan.num_workers != 1:
        problems.append(f"{plan.num_workers} workers (local mode runs one)")
    if os.environ.get("RAY_ADDRESS"):
        problems.append("a cluster this process joined (RAY_ADDRESS): its workers run on its nodes")
    elif nodes > 1:
        problems.append(f"a Ray cluster of {nodes} nodes: the worker may run on another one")
    if {"RANK", "WORLD_SIZE", "MASTER_ADDR"} <= os.environ.keys():
        problems.append("torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR) are set")
    if problems and mode == "true":
        raise ConfigError(f"config 'train.local_mode': true is refused here: {'; '.join(problems)}; "
                          "use train.local_mode=auto or false")
    if problems:
        return False, "; ".join(problems)
    return True, "one worker on this machine; train.local_mode=false for a worker process"


class _SigintExit(Exception):
    """Ray Train's own SIGINT handler ended ``fit()`` (it aborts the controller, then exits the process)."""


def _fit(trainer, local: bool):
    """``trainer.fit()``, with a worker's own one-line error (NaN loss, bad data) raised as such.

    In worker mode Ray Train's ``fit()`` installs its own SIGINT handler (the first Ctrl-C aborts the
    controller gracefully, then raises ``SystemExit``; the third exits at once).  We work with it:
    ``interrupts.seen_during`` chains a recorder in front of whatever handler ``fit()`` installs, so that
    the ``SystemExit`` it ends with is known to be a Ctrl-C and becomes :class:`Interrupted`.  In
    local mode no handler is installed: Python's ``KeyboardInterrupt`` ends the loop where it is."""
    if local:
        with _driver_state():
            return _worker_errors(trainer.fit)
    with seen_during() as seen:
        try:
            return _worker_errors(trainer.fit)
        except SystemExit:
            if seen():
                raise _SigintExit() from None
            raise


def _worker_errors(fit):
    try:
        return fit()
    except Exception as exc:  # ray.train.TrainingFailedError: the worker's whole traceback
        user = _worker_user_error(exc)
        if user is None:
            raise
        raise TrainError(str(user).splitlines()[0]) from None


@contextlib.contextmanager
def _driver_state():
    """The loop in the driver sets torch's threads, seeds its generators and quiets our loggers, as a
    worker process would for itself: put the CLI process back as it was afterwards."""
    import logging

    import torch

    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    ours = logging.getLogger("alchemetric_ray")
    level = ours.level
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
        ours.setLevel(level)


def _worker_user_error(exc: BaseException) -> UserError | None:
    """A worker's own one-line error (NaN loss, skipped steps, bad data) inside Ray Train's wrapper."""
    failures = getattr(exc, "worker_failures", None) or {}
    return next((failures[rank] for rank in sorted(failures) if isinstance(failures[rank], UserError)), None)
