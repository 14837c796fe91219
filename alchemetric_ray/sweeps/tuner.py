"""The sweep's Tuner: built for a new sweep (scheduler, searcher, concurrency, the trials' checkpoints)
or restored from the sweep's saved state, and run.

Tune's status table is off (it ranks trials by their last value, not ours); the driver prints one
line per finished trial instead (``trial.trial_lines``), and the summary names the best trial by its
best epoch.  Tune's other lines (its start-of-sweep box and hints, the snapshot-frequency warning)
are off through Tune's own switches while it runs (``console.tune_switches``); --verbose keeps them.
"""

from __future__ import annotations

from alchemetric_ray import console
from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import SweepError
from alchemetric_ray.placement.plan import ResourcePlan
from alchemetric_ray.placement.session import train_storage, worker_env
from alchemetric_ray.scoring.objective import selection_metric, selection_mode
from alchemetric_ray.sweeps.job import SweepJob
from alchemetric_ray.sweeps.resources import runs_in_trial, trial_resources
from alchemetric_ray.sweeps.trial import _trial, trial_lines


def fit_sweep(job: SweepJob, space: dict, limit: int, start_timeout_s: float):
    """Build (or restore) the Tuner and run it, at most ``limit`` trials at once; each trial's ``fit()``
    gets ``start_timeout_s`` per worker-group start attempt (what the sweep's own wait left of
    scaling.start_timeout_s).  Returns Tune's result grid."""
    from ray import tune

    cfg, name = job.cfg, job.name
    trainable = tune.with_resources(
        tune.with_parameters(_trial, base=job.trial_cfg.to_dict(), targets=job.targets,
                             plan=job.plan, sweep=name, start_timeout=f"{start_timeout_s:g}",
                             env=worker_env(job.trial_cfg)),
        trial_resources(job.trial_cfg, job.plan))
    storage = train_storage(cfg)
    path, filesystem = job.where.path, storage["storage_filesystem"]  # filesystem None: a local folder
    if cfg.storage.resume or (cfg.storage.run and tune.Tuner.can_restore(path, storage_filesystem=filesystem)):
        if not tune.Tuner.can_restore(path, storage_filesystem=filesystem):
            raise SweepError(f"--resume: {job.where} holds no sweep state to restore")
        print(f"resuming sweep {name}: finished trials are kept, unfinished ones continue", flush=True)
        try:
            tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                       storage_filesystem=filesystem)
        except ModuleNotFoundError as exc:  # its saved state names a module of ours that is gone (renamed)
            if not (exc.name or "").startswith("alchemetric_ray."):
                raise
            raise SweepError(f"--resume: {job.where} was saved by an older alchemetric-ray (its state names the "
                             f"module {exc.name}, since renamed) and cannot be resumed; run the sweep again under "
                             "another storage.run (or remove that folder)") from None
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric=selection_metric(cfg), mode=selection_mode(cfg), scheduler=_scheduler(cfg),
                search_alg=_searcher(cfg),
                num_samples=1 if cfg.tune.search == "grid" else cfg.tune.num_samples,
                max_concurrent_trials=limit,
                time_budget_s=cfg.tune.time_budget_s or None,
                # the next trial runs in the finished trial's process (every trial asks for the same resources):
                # no fresh Python, Ray, torch and package import per trial; each trial builds its own model,
                # optimizer, seed and shard reader (tests/test_sweep.py: a trial trains there as it would first)
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(name=name, **storage,
                                      verbose=0 if not console.verbose() else 1, **_reporter(),
                                      callbacks=[trial_lines(selection_metric(cfg), selection_mode(cfg))],
                                      **_trial_checkpoints(job.trial_cfg, job.plan)),
        )
    with console.environment(console.tune_switches(local_storage=filesystem is None)):
        return tuner.fit()


def _reporter() -> dict:
    """In a Jupyter kernel Tune picks its notebook reporter, which shows an empty HTML output at once and
    clears the cell's earlier output (ours) on its first table; its plain reporter prints nothing at
    verbose=0.  With --verbose, Tune's own choice."""
    if console.verbose() or not console.in_notebook():
        return {}
    from ray.tune import CLIReporter

    return {"progress_reporter": CLIReporter()}


def _scheduler(cfg: RunConfig):
    """ASHA on the epochs (tune.scheduler=asha), or no scheduler: every trial runs its epochs."""
    if cfg.tune.scheduler != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="training_iteration", max_t=cfg.train.epochs,
                         grace_period=min(cfg.tune.grace_period, cfg.train.epochs), reduction_factor=2)


def _trial_checkpoints(cfg: RunConfig, plan: ResourcePlan) -> dict:
    """A trial that runs the loop itself gives Tune its checkpoints: Tune keeps them as a Train run
    would (storage.num_to_keep, ranked by the selection metric) and retries a failed trial from the
    latest (scaling.max_failures).  A TorchTrainer's trial leaves both to Ray Train."""
    if not runs_in_trial(cfg, plan):
        return {}
    from ray import tune

    return {"checkpoint_config": tune.CheckpointConfig(num_to_keep=cfg.storage.num_to_keep,
                                                       checkpoint_score_attribute=selection_metric(cfg),
                                                       checkpoint_score_order=selection_mode(cfg)),
            "failure_config": tune.FailureConfig(max_failures=cfg.scaling.max_failures)}


def _searcher(cfg: RunConfig):
    if cfg.tune.search != "optuna":
        return None
    try:
        from ray.tune.search.optuna import OptunaSearch
    except ImportError as exc:
        raise SweepError(f"tune.search=optuna needs the optuna package ({exc}); pip install optuna") from None
    return OptunaSearch(seed=cfg.train.seed)
