"""Print the node-types file a KubeRay job needs, derived from the manifest's RayCluster spec.

    python scripts/kuberay_node_types.py                    # from k8s/rayjob.yaml
    python scripts/kuberay_node_types.py path/to/rayjob.yaml

KubeRay's autoscaler reads the node types from the RayCluster custom resource and reports none of
them to Ray, so a job driver on the head cannot learn them; without them ``device auto`` cannot
tell a GPU cluster from a CPU one (alchemetric_ray/placement/capacity.py).  The manifest therefore
carries them a second time, as the ``node-types.yaml`` key of a ConfigMap mounted on the head and
passed as ``scaling.cluster_config``.  This prints that key's value as Ray's own converter (the one
KubeRay's autoscaler runs) derives it from each RayJob's ``rayClusterSpec`` (or a RayCluster's
``spec``): paste it into the ConfigMap after editing a worker group.  tests/test_cluster_plans.py
fails while the two disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alchemetric_ray.placement.capacity import from_kuberay_spec  # noqa: E402


def cluster_specs(manifest: Path) -> list[tuple[str, dict]]:
    """(name, RayCluster spec) of every RayJob and RayCluster in ``manifest``."""
    found = []
    for doc in yaml.safe_load_all(manifest.read_text()):
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "RayJob":
            found.append((doc["metadata"]["name"], doc["spec"]["rayClusterSpec"]))
        elif doc.get("kind") == "RayCluster":
            found.append((doc["metadata"]["name"], doc["spec"]))
    return found


def main(argv: list[str]) -> int:
    manifest = Path(argv[0]) if argv else REPO / "k8s" / "rayjob.yaml"
    specs = cluster_specs(manifest)
    if not specs:
        print(f"{manifest}: no RayJob or RayCluster in it", file=sys.stderr)
        return 2
    for name, spec in specs:
        print(f"# node-types.yaml for {name} ({manifest})")
        print(yaml.safe_dump(from_kuberay_spec(spec, name), sort_keys=False, default_flow_style=None), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
