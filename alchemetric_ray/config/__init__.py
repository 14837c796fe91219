"""One typed run config (the package; its one module for now is ``schema``, which the next commit splits)."""

from alchemetric_ray.config.schema import *  # noqa: F403
