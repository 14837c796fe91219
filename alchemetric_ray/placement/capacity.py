"""What the Ray cluster can become: the autoscaler's node types, learnt before planning.

A cold autoscaling cluster (a head with ``CPU: 0``, GPU workers from 0) shows no CPU and no GPU
when a job starts; planning from ``ray.cluster_resources()`` alone refuses what the autoscaler
would gladly provide.  Ray 2.60 has no public API for the node types, so :func:`discover_capacity`
learns them in this order:

1. the cluster config the autoscaler reported to the GCS
   (``ray._private.state.state.get_cluster_config()``; usually None with the v1 autoscaler);
2. the launcher YAML at ``scaling.cluster_config`` (default ``~/ray_bootstrap_config.yaml``, which
   ``ray up`` writes on the head, where job drivers run): ``available_node_types`` (resources,
   min_workers, max_workers) and the cluster-wide ``max_workers``;
3. otherwise "unknown": an explicit request the plan cannot see now is asked of the autoscaler and
   waited for within the start timeout; ``device auto`` with no GPU up is refused (it cannot tell a
   GPU cluster from a CPU one, and would train on the CPU of the GPU node the autoscaler starts).

KubeRay reports no node types to the GCS and writes no launcher YAML on the head: its node types
reach a job through a launcher-style file mounted on the head (``k8s/rayjob.yaml``'s node-types
ConfigMap, passed as ``scaling.cluster_config``).  :func:`from_kuberay_spec` derives that file's
content from a RayCluster spec with Ray's own converter (the one KubeRay's autoscaler runs), so the
manifest and the ConfigMap can be checked against each other.

Only a cluster this process joined (``RAY_ADDRESS``, as ``ray job submit`` sets it) is asked: a
local Ray of our own has no autoscaler, and plans from what is up ("now"), as ever.

:class:`Capacity` is plain data; ``placement/plan.py`` plans from it without touching Ray.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import CapacityError

CapacityKind = Literal["now", "node_types", "unknown"]


@dataclass(frozen=True)
class _Source:
    """What a kind of :class:`Capacity` says about the cluster."""

    autoscaling: bool  # an autoscaler may add nodes
    node_types_known: bool  # the plan is made for what its node types can become


_SOURCES: dict[str, _Source] = {
    "now": _Source(autoscaling=False, node_types_known=False),
    "node_types": _Source(autoscaling=True, node_types_known=True),
    "unknown": _Source(autoscaling=True, node_types_known=False),
}
UP_NOW = "the nodes that are up (ray.cluster_resources())"


@dataclass(frozen=True)
class NodeType:
    name: str
    resources: dict[str, float]
    min_workers: int = 0
    max_workers: int = 0
    head: bool = False
    instance_type: str = ""  # node_config's InstanceType (AWS) or machineType (GCP): the GPU model it carries

    def shape(self) -> str:
        return shape(self.resources)


@dataclass(frozen=True)
class Capacity:
    """Where the plan's resources come from.

    ``now``: the nodes that are up (``ray.cluster_resources()``), no autoscaler to ask;
    ``node_types``: an autoscaling cluster whose node types are known (``source`` says from where);
    ``unknown``: a cluster that may scale but whose node types could not be learnt.
    """

    kind: CapacityKind
    source: str
    node_types: tuple[NodeType, ...] = ()
    max_workers: int | None = None  # the cluster-wide cap on worker nodes (launcher `max_workers`)
    looked_in: list[str] = field(default_factory=list)  # where discovery looked, for messages

    @property
    def autoscaling(self) -> bool:
        return _SOURCES[self.kind].autoscaling

    @property
    def node_types_known(self) -> bool:
        """An autoscaling cluster whose node types are known: plan for what they can become."""
        return _SOURCES[self.kind].node_types_known

    @property
    def node_types_unknown(self) -> bool:
        """A cluster that may scale but whose node types could not be learnt."""
        return self.autoscaling and not self.node_types_known

    @property
    def head(self) -> NodeType | None:
        return next((t for t in self.node_types if t.head), None)

    @property
    def workers(self) -> tuple[NodeType, ...]:
        return tuple(t for t in self.node_types if not t.head)

    def limit(self, node_type: NodeType) -> int:
        """How many nodes of ``node_type`` the autoscaler may run (its own and the cluster's cap)."""
        if node_type.head:
            return 1
        cap = node_type.max_workers
        return cap if self.max_workers is None else min(cap, self.max_workers)

    def unknown_hint(self) -> str:
        """For a message where the node types are unknown: where they were looked for, how to declare them."""
        return ("declare the node types with scaling.cluster_config=PATH (a launcher YAML with "
                "available_node_types; on KubeRay, the node-types ConfigMap that k8s/rayjob.yaml mounts on the "
                f"head); none found: {'; '.join(self.looked_in) or self.source}")

    def describe_types(self) -> str:
        """``gpu_worker {CPU: 48, GPU: 4} x 0-4, ...; from launcher config PATH``"""
        shown = ", ".join(f"{t.name} {t.shape()} x {'head' if t.head else f'{t.min_workers}-{self.limit(t)}'}"
                          for t in self.node_types)
        return f"{shown or 'none'}; from {self.source}"


def shape(resources: dict[str, float], *, gpu_first: bool = False) -> str:
    """``{CPU: 4, GPU: 1}``: resources as plans and messages show them (``gpu_first``: ``{GPU: 1, CPU: 4}``,
    as the autoscaler's requests are shown); Ray's ``node:<ip>`` markers left out."""
    items = sorted((kv for kv in resources.items() if not kv[0].startswith("node:")),
                   key=lambda kv: ((kv[0] != "GPU") if gpu_first else 0, kv[0]))
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in items) + "}"


def now() -> Capacity:
    return Capacity("now", UP_NOW)


# ---- parsing (pure) ------------------------------------------------------------------------


def from_launcher_config(data: Any, source: str) -> Capacity:
    """The node types of a Ray launcher YAML (already parsed); ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise CapacityError(f"{source}: not a Ray cluster launcher config (expected a mapping)")
    types = data.get("available_node_types")
    if not isinstance(types, dict) or not types:
        raise CapacityError(f"{source}: has no available_node_types; name the cluster's node types "
                            "(resources, min_workers, max_workers) as `ray up` expects")
    head_name = data.get("head_node_type")
    cluster_max = data.get("max_workers")
    if cluster_max is not None and not _count(cluster_max):
        raise CapacityError(f"{source}: max_workers {cluster_max!r} is not a count of nodes")
    parsed = []
    for name, spec in types.items():
        where = f"{source}: available_node_types.{name}"
        if not isinstance(spec, dict):
            raise CapacityError(f"{where} is not a mapping")
        resources = spec.get("resources", {})
        if not isinstance(resources, dict) or not all(_amount(v) for v in resources.values()):
            raise CapacityError(f"{where}.resources {resources!r} is not a mapping of resource -> amount")
        low, high = spec.get("min_workers", 0), spec.get("max_workers", cluster_max if cluster_max is not None else 0)
        if not _count(low) or not _count(high):
            raise CapacityError(f"{where}: min_workers {low!r} / max_workers {high!r} are not counts of nodes")
        parsed.append(NodeType(str(name), {str(k): float(v) for k, v in resources.items()}, int(low), int(high),
                               head=name == head_name, instance_type=_instance_type(spec.get("node_config"))))
    return Capacity("node_types", source, tuple(parsed), None if cluster_max is None else int(cluster_max))


def _instance_type(node_config: Any) -> str:
    """The instance type a launcher node type's ``node_config`` names (AWS ``InstanceType``, GCP
    ``machineType``), or ""."""
    if not isinstance(node_config, dict):
        return ""
    value = node_config.get("InstanceType") or node_config.get("machineType") or ""
    return value if isinstance(value, str) else ""


def from_gcs_config(config: Any, source: str = "the cluster config in the GCS") -> Capacity | None:
    """The node types of the ``ClusterConfig`` an autoscaler reported to the GCS, or None if it has none."""
    groups = list(getattr(config, "node_group_configs", None) or [])
    if not groups:
        return None
    parsed = tuple(NodeType(g.name, {k: float(v) for k, v in dict(g.resources).items()}, int(g.min_count),
                            int(g.max_count) if g.max_count >= 0 else 1 << 30) for g in groups)
    return Capacity("node_types", source, parsed)


KUBERAY_HEAD_TYPE = "headgroup"  # the head's node type in the config KubeRay's autoscaler derives


def from_kuberay_spec(ray_cluster_spec: Any, name: str = "raycluster") -> dict:
    """The launcher-style node types (``head_node_type``, ``max_workers``, ``available_node_types``
    with resources and min/max workers) that KubeRay's autoscaler derives from a RayCluster spec:
    ``num-cpus``/``num-gpus`` from ``rayStartParams``, else the containers' limits (``nvidia.com/gpu``).
    Ray's converter is private API (``ray.autoscaler._private.kuberay``): absent or changed, one line."""
    try:
        from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

        derived = _derive_autoscaling_config_from_ray_cr(
            {"metadata": {"name": name, "namespace": "default"}, "spec": ray_cluster_spec})
    except (ImportError, AttributeError) as exc:
        raise CapacityError(f"this Ray has no KubeRay autoscaling-config converter ({exc})") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CapacityError(f"RayCluster spec {name}: KubeRay's converter cannot read it ({exc!r})") from None
    types = {group: {"resources": dict(spec["resources"]), "min_workers": spec["min_workers"],
                     "max_workers": spec["max_workers"]}
             for group, spec in derived["available_node_types"].items()}
    return {"head_node_type": derived["head_node_type"], "max_workers": derived["max_workers"],
            "available_node_types": types}


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _amount(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


# ---- discovery (talks to Ray) --------------------------------------------------------------


def joined_cluster() -> bool:
    """Whether this process runs on a Ray cluster that someone else started: ``ray job submit``'s
    ``RAY_ADDRESS``, or a ``ray.init(address=...)`` made before us (a notebook's), read from Ray's own
    state: this driver's node was connected to, not started, by this process."""
    if os.environ.get("RAY_ADDRESS"):
        return True
    worker = sys.modules.get("ray._private.worker")
    node = getattr(getattr(worker, "global_worker", None), "node", None) if worker is not None else None
    return bool(node is not None and worker is not None and worker.global_worker.connected
                and not getattr(node, "head", True))


def discover_capacity(cfg: RunConfig, *, joined: bool | None = None) -> Capacity:
    """Learn what the cluster can become, in the order of the module docstring.

    ``joined``: whether this process joined a cluster someone else started (default: RAY_ADDRESS
    is set, as ``ray job submit`` does); only such a cluster can be "unknown"."""
    import yaml

    if joined is None:
        joined = joined_cluster()
    if not joined:  # a local Ray of our own: no autoscaler (whatever launcher YAML this machine holds)
        return now()
    looked = []
    gcs = _gcs_cluster_config()
    if gcs is not None:
        return gcs
    looked.append("no cluster config in the GCS")
    path = Path(os.path.expanduser(cfg.scaling.cluster_config))
    if path.is_file():
        source = f"launcher config {path}"
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CapacityError(f"config 'scaling.cluster_config': {path} cannot be read as YAML ({reason})") from None
        try:
            return from_launcher_config(data, source)
        except CapacityError as exc:
            raise CapacityError(f"config 'scaling.cluster_config': {exc}") from None
    looked.append(f"no launcher config at {path} (scaling.cluster_config)")
    return Capacity("unknown", "unknown node types (" + "; ".join(looked) + ")", looked_in=looked)


def _gcs_cluster_config() -> Capacity | None:
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # a private API: absent or changed, it only means "not known from here"
        return None
    return from_gcs_config(config) if config is not None else None
