"""Which registered version is in production: the MLflow aliases ``champion`` and ``previous``.

:func:`promote` moves ``champion`` to a version of a registered model and gives ``previous`` to the
version it replaces; ``predict --model models:/NAME@champion`` then scores with the new one, and a
roll back is a promotion of the older version.  Every move is recorded as tags on the versions
involved: on the new champion ``promotion.reason``, ``promotion.at`` (UTC) and ``promotion.replaced``
(the version it replaced, empty for the first champion); on the replaced one ``demotion.reason`` and
``demotion.at``.

The steps run in an order that a kill at any point leaves readable: the new version's tags first,
then ``champion`` moved (one call: MLflow's alias names exactly one version at every moment), then
``previous``.  Killed before the move, the old champion stays; killed after it, the same promotion run
again finds the version already champion and completes what its tags say is missing (``previous``
and the demotion's tags), changing nothing else.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import TrackingError

CHAMPION, PREVIOUS = "champion", "previous"


@dataclass(frozen=True)
class Promotion:
    """A move of ``champion``: the registered model, the version now champion, the one it replaced
    (None for the first champion), why, when (UTC), and whether this call changed anything."""

    name: str
    version: str
    replaced: str | None
    reason: str
    at: str
    changed: bool = True

    def line(self) -> str:
        """The command's one line."""
        if not self.changed:
            return f"models:/{self.name}/{self.version} is already {CHAMPION} (since {self.at}): nothing moved"
        was = f"; version {self.replaced} is now {PREVIOUS}" if self.replaced else " (the first champion)"
        return f"promoted models:/{self.name}/{self.version} to {CHAMPION}{was}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "replaced": self.replaced, "reason": self.reason,
                "at": self.at, "changed": self.changed}


def client_of(cfg: RunConfig, command: str = "promote"):
    """A client of the registry at ``tracking.mlflow_uri`` (or MLFLOW_TRACKING_URI), checked to answer
    (``command`` names the command in the one line that says it is not set or not there)."""
    from alchemetric_ray.tracking.mlflow_runs import _mlflow, preflight

    store = cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not store:
        raise TrackingError(f"{command}: set tracking.mlflow_uri (or MLFLOW_TRACKING_URI) to the registry's store")
    preflight(store)
    mlflow = _mlflow()
    return mlflow.MlflowClient(tracking_uri=store, registry_uri=store)


def _version(client, uri: str):
    """The version ``uri`` names (``models:/NAME/VERSION`` or ``models:/NAME@alias``), refused in one line."""
    from mlflow.exceptions import MlflowException

    from alchemetric_ray.tracking.mlflow_runs import _lookup_version

    if not uri.startswith("models:/") or len(uri) == len("models:/"):
        raise TrackingError(f"promote: --model {uri!r} is not a registered version (models:/NAME/VERSION)")
    try:
        return _lookup_version(client, uri)
    except MlflowException as exc:
        raise TrackingError(f"promote: --model {uri}: {str(exc).splitlines()[0][:300]}") from None


def _champion(client, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # no champion yet
        return None


def promote(uri: str, cfg: RunConfig, *, reason: str | None = None) -> Promotion:
    """Make the version ``uri`` names the champion of its registered model (see the module docstring)."""
    client = client_of(cfg)
    version = _version(client, uri)
    name, number = version.name, str(version.version)
    old = _champion(client, name)
    if old is not None and str(old.version) == number:  # already champion: complete an interrupted promotion
        tags = version.tags or {}
        replaced = tags.get("promotion.replaced") or None
        if replaced:
            with _writes(uri):
                _demote(client, name, replaced, number, tags.get("promotion.reason", ""), tags.get("promotion.at", ""))
        return Promotion(name, number, replaced, tags.get("promotion.reason", ""), tags.get("promotion.at", ""),
                         changed=False)
    why = reason or "promoted by hand"
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    replaced = str(old.version) if old is not None else None
    with _writes(uri):
        for key, value in (("promotion.reason", why), ("promotion.at", at), ("promotion.replaced", replaced or "")):
            client.set_model_version_tag(name, number, key, value)
        client.set_registered_model_alias(name, CHAMPION, number)
        if replaced:
            _demote(client, name, replaced, number, why, at)
    return Promotion(name, number, replaced, why, at)


@contextlib.contextmanager
def _writes(uri: str) -> Iterator[None]:
    """The registry's writes; a failure among them is one line (run the same promotion again to finish it)."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        raise TrackingError(f"promote: --model {uri}: {str(exc).splitlines()[0][:300]} (run the same promote "
                            "again to finish it)") from None


def _demote(client, name: str, replaced: str, by: str, reason: str, at: str) -> None:
    """``previous`` on the replaced version, with why it left (idempotent: a rerun sets the same)."""
    client.set_registered_model_alias(name, PREVIOUS, replaced)
    client.set_model_version_tag(name, replaced, "demotion.reason", f"replaced by version {by}: {reason}")
    client.set_model_version_tag(name, replaced, "demotion.at", at)
