"""The Python API: one function per command, returning typed results (see ``alchemetric_ray/__init__.py``)."""

from alchemetric_ray.api.calls import (
    doctor,
    env,
    evaluate,
    features,
    load_config,
    load_model,
    predict,
    promote,
    refit,
    train,
    tune,
)
from alchemetric_ray.api.history import load_result, runs


def submit(command: str, cfg=None, *, address: str, data=None, **options):
    """Submit a command to a Ray cluster's job server (``http://HEAD:8265``): a ``Job`` to follow, wait
    for, stop and read the result of (``alchemetric_ray/api/jobs.py``)."""
    from alchemetric_ray.api.jobs import submit as submit_job

    return submit_job(command, cfg, address=address, data=data, **options)


__all__ = ["doctor", "env", "evaluate", "features", "load_config", "load_model", "load_result", "predict", "promote",
           "refit", "runs", "submit", "train", "tune"]
