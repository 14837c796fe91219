"""One trial, as Tune runs it: the trial function, and the line the sweep's driver prints when a trial ends.

A one-worker trial (``tune.trial_loop=auto``) runs the loop in the trial's own process
(``train/runtime.py``: ``TrialProcess``), and where it caches its shard (``train.cache_data``, the default) reads it
there with pyarrow (``data/loaders.py``: ``ShardReader``), the same rows in the same order as Ray Data's, with no
Ray Data to start; any other builds a ``TorchTrainer`` named after the trial
and fits it, with Tune's ``TuneReportCallback`` forwarding each epoch's report.
"""

from __future__ import annotations

import os
from typing import Any

from alchemetric_ray import console
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.loaders import ShardReader, build_datasets
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.models import model_spec
from alchemetric_ray.placement.plan import ResourcePlan
from alchemetric_ray.storage import Location
from alchemetric_ray.sweeps.resources import runs_in_trial
from alchemetric_ray.sweeps.summary import plain
from alchemetric_ray.training.trainer import (
    Execution,
    build_trainer,
    check_compatible,
    data_config,
    loop_config,
    reads_with_pyarrow,
)


# The function's name is the trainable's, which Tune puts in the name of every trial's folder.
def _trial(config: dict[str, Any], *, base: dict,  # noqa: PLR0913  (Tune's with_parameters passes each by name)
           targets: dict[str, tuple[Location, Manifest]], plan: ResourcePlan, sweep: str,
           start_timeout: str | None = None, env: dict[str, str] | None = None) -> None:
    """Train one trial's config (``base`` with the trial's ``config`` on top) on its label's shards.
    ``env``: this sweep's worker environment (``session.worker_env``), set in the trial's process: Tune
    gives its trial actors no runtime environment of ours, e.g. under a notebook's own ``ray.init()``."""
    import ray.tune

    os.environ.update(env or {})

    console.quiet_ray_data()  # this trial builds its own datasets
    console.quiet_stop_in_finalizer()
    cfg = RunConfig.from_dict(base).with_values(config)
    shards, manifest = targets[cfg.features.label]  # the shards built for this trial's label
    check_compatible(cfg, manifest)
    inputs = model_spec(cfg.model.name).inputs
    if runs_in_trial(cfg, plan):
        from alchemetric_ray.training.loop import run_loop
        from alchemetric_ray.training.runtime import TrialProcess

        if reads_with_pyarrow(cfg, plan, False, sweep=True):  # once, here: no Ray Data (actors, read tasks) to start
            runtime = TrialProcess(None, data_config(cfg),
                                   reader=ShardReader(shards, manifest, inputs, cfg.features.window))
        else:
            runtime = TrialProcess(build_datasets(shards, inputs, cfg.features.window, check=False)[0],
                                   data_config(cfg))
        run_loop(loop_config(cfg, manifest, plan, epoch_lines=False), runtime)
        return
    datasets, _ = build_datasets(shards, inputs, cfg.features.window, check=False)
    from ray.tune.integration.ray_train import TuneReportCallback

    from alchemetric_ray.placement.session import set_worker_group_start_timeout

    trial_id = ray.tune.get_context().get_trial_id()
    trainer = build_trainer(cfg, datasets, manifest, plan, name=f"{sweep}-{trial_id}",
                            execution=Execution(callbacks=[TuneReportCallback()], epoch_lines=False))
    if start_timeout:  # the sweep's per-attempt worker-group start timeout (placement/autoscale.py)
        set_worker_group_start_timeout(start_timeout)
    trainer.fit()


def trial_lines(metric: str, mode: str):
    """A Tune callback (it runs in the sweep's driver) that prints one line per finished trial."""
    from ray import tune

    class TrialLines(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            self._line(trial, "finished")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._line(trial, "failed")

        def _line(self, trial, what: str) -> None:
            result = trial.last_result or {}
            best = (trial.metric_analysis.get(metric) or {}).get(mode)
            shown = "n/a" if best is None else f"{best:.4f}"
            config = ", ".join(f"{k}={plain(v)}" for k, v in (trial.config or {}).items())
            print(f"trial {trial.trial_id} {what}: {result.get('training_iteration', 0)} epoch(s), "
                  f"best {metric} {shown}; {config}", flush=True)

    return TrialLines()
