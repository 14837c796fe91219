"""k8s/rayjob.yaml checked offline: KubeRay's RayJob schema, keys the schema does not know, and what
the job needs (Ray 2.60.0, scale from zero on GPU nodes, S3 through IRSA, token authentication).

The schema is the `v1` openAPIV3Schema of KubeRay's RayJob CRD, vendored in tests/schemas/kuberay
(source and licence in SOURCE.md there). Two checks, since neither is enough alone:

* ``jsonschema`` (Draft 7) for types, enums, required fields and patterns, after turning the
  OpenAPI extensions into plain JSON Schema (``x-kubernetes-int-or-string``: an integer or a string;
  ``nullable``: null allowed; other ``x-kubernetes-*`` annotations dropped);
* a walk of the manifest beside the schema that reports every key the schema does not define:
  the CRD has no ``additionalProperties: false``, so a misspelled key passes ``jsonschema`` while
  the API server (strict field validation) rejects it or drops it.

Needs no Ray, no cluster and nothing outside this repository.
"""

from __future__ import annotations

import copy
import functools
import gzip
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "k8s" / "rayjob.yaml"
DOCKERFILE = REPO / "k8s" / "Dockerfile"
SCHEMAS = Path(__file__).resolve().parent / "schemas" / "kuberay"
CRD = SCHEMAS / "ray.io_rayjobs.yaml.gz"
SAMPLE = SCHEMAS / "ray-job.sample.yaml"
RAY = "2.60.0"


# ---- the schema ------------------------------------------------------------------------------------


@functools.cache
def _openapi_schema() -> dict[str, Any]:
    """The RayJob CRD's served storage version (v1), as the CRD writes it."""
    crd = yaml.load(gzip.decompress(CRD.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == "RayJob"
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"]
    return v1["schema"]["openAPIV3Schema"]


def _to_json_schema(node: Any) -> Any:
    """An OpenAPI v3 (Kubernetes structural) schema node as plain JSON Schema."""
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]  # a `pattern` beside it applies to strings only
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    schema = _to_json_schema(_openapi_schema())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _schema_errors(doc: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:200]}"
            for e in _validator().iter_errors(doc)]


def unknown_keys(value: Any, schema: dict, path: str = "") -> list[str]:
    """Paths of the keys in ``value`` that ``schema`` does not define (where it defines its keys)."""
    if isinstance(value, list):
        items = schema.get("items")
        return [k for i, item in enumerate(value) for k in unknown_keys(item, items, f"{path}[{i}]")] if items else []
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    props, extra = schema.get("properties"), schema.get("additionalProperties")
    found = []
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if props is not None and key in props:
            found += unknown_keys(item, props[key], where)
        elif isinstance(extra, dict):  # a map: any key, values of one schema
            found += unknown_keys(item, extra, where)
        elif props is not None and extra is None:
            found.append(where)
        # neither properties nor additionalProperties (metadata, free-form objects): not checked
    return found


# ---- the documents -------------------------------------------------------------------------------


def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _rayjobs(path: Path) -> list[dict]:
    return [d for d in _documents(path) if d.get("kind") == "RayJob"]


def _rayjob() -> dict:
    (job,) = _rayjobs(MANIFEST)
    return job


def _pod_specs(job: dict) -> list[tuple[str, dict]]:
    cluster = job["spec"]["rayClusterSpec"]
    return [("head", cluster["headGroupSpec"]["template"]["spec"])] + [
        (group["groupName"], group["template"]["spec"]) for group in cluster.get("workerGroupSpecs", [])]


def _entrypoint(job: dict) -> list[str]:
    return shlex.split(job["spec"]["entrypoint"])


def _overrides(job: dict) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in _entrypoint(job)[2:] if "=" in arg and not arg.startswith("-"))


# ---- the validator, on KubeRay's own sample ----------------------------------------------------------


def test_kuberays_own_sample_passes_both_checks():
    jobs = _rayjobs(SAMPLE)
    assert len(jobs) == 1 and any(d["kind"] == "ConfigMap" for d in _documents(SAMPLE))  # other kinds skipped
    assert _schema_errors(jobs[0]) == []
    assert unknown_keys(jobs[0], _openapi_schema()) == []


# ---- the manifest against the schema ------------------------------------------------------------------


def test_every_rayjob_in_the_manifest_is_valid_and_has_no_unknown_key():
    jobs = _rayjobs(MANIFEST)
    assert jobs, "k8s/rayjob.yaml holds no RayJob"
    for job in jobs:
        assert job["apiVersion"] == "ray.io/v1"
        assert _schema_errors(job) == []
        assert unknown_keys(job, _openapi_schema()) == []


@pytest.mark.parametrize("where, good, bad, reported", [
    (("spec",), "shutdownAfterJobFinishes", "shutdownAfterJobFinish", "spec.shutdownAfterJobFinish"),
    (("spec", "rayClusterSpec"), "enableInTreeAutoscaling", "enableInTreeAutoscalling",
     "spec.rayClusterSpec.enableInTreeAutoscalling"),
    (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec", "containers", 0),
     "volumeMounts", "volumeMount", "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].volumeMount"),
])
def test_a_misspelled_key_is_reported_with_its_path(where, good, bad, reported):
    job = copy.deepcopy(_rayjob())
    node = job
    for step in where:
        node = node[step]
    node[bad] = node.pop(good)
    assert unknown_keys(job, _openapi_schema()) == [reported]
    assert _schema_errors(job) == []  # what jsonschema alone lets through: why the walk exists


@pytest.mark.parametrize("where, value", [
    (("spec", "activeDeadlineSeconds"), "soon"),
    (("spec", "shutdownAfterJobFinishes"), "yes"),
    (("spec", "rayClusterSpec", "authOptions", "mode"), "tokens"),
    (("spec", "rayClusterSpec", "headGroupSpec", "rayStartParams", "num-cpus"), 0),  # ray start params are strings
    (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "minReplicas"), -1.5),
    (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec", "containers", 0, "resources", "limits",
      "nvidia.com/gpu"), ["4"]),
    (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec", "containers", 0, "resources", "limits",
      "memory"), "lots"),  # not a quantity
])
def test_a_wrong_type_or_value_is_rejected_by_the_schema(where, value):
    job = copy.deepcopy(_rayjob())
    node = job
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = value
    errors = _schema_errors(job)
    assert errors and all(e.startswith(".".join(map(str, where))) for e in errors), errors


def test_the_openapi_extensions_become_json_schema():
    quantity = jsonschema.Draft7Validator(_to_json_schema({"x-kubernetes-int-or-string": True}))
    assert quantity.is_valid(4) and quantity.is_valid("500m") and not quantity.is_valid(["4"])
    optional = jsonschema.Draft7Validator(_to_json_schema({"type": "string", "nullable": True}))
    assert optional.is_valid(None) and optional.is_valid("x") and not optional.is_valid(3)
    listed = _to_json_schema({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "atomic"})
    assert listed == {"type": "array", "items": {"type": "string"}}


def test_quantities_take_an_integer_or_a_string():
    job = copy.deepcopy(_rayjob())
    limits = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    limits["limits"]["nvidia.com/gpu"] = "4"
    limits["limits"]["cpu"] = 44
    assert _schema_errors(job) == []


# ---- what the issue asks of the job ----------------------------------------------------------------------


def test_ray_2_60_everywhere():
    job = _rayjob()
    assert job["spec"]["rayClusterSpec"]["rayVersion"] == RAY
    images = [c["image"] for _, pod in _pod_specs(job) for c in pod["containers"]]
    assert images and all(f"ray{RAY}" in image.rsplit(":", 1)[1] for image in images), images
    base = re.search(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), re.M).group(1)
    assert base == f"rayproject/ray:{RAY}-py311-gpu"
    assert all(image.endswith(f"-ray{RAY}-py311-gpu") for image in images)  # the tag names its base


def test_the_image_holds_the_entry_point_the_job_runs():
    job = _rayjob()
    argv = _entrypoint(job)
    workdir = re.search(r"^WORKDIR\s+(\S+)", DOCKERFILE.read_text(), re.M).group(1)
    assert argv[0] == "python" and argv[1] == f"{workdir}/jobs/train.py"
    assert (REPO / "jobs" / "train.py").is_file()
    assert re.search(r"^COPY\s+(--\S+\s+)*\.\s+\.\s*$", DOCKERFILE.read_text(), re.M)
    assert re.search(r"pip install --no-cache-dir -c constraints\.txt \.", DOCKERFILE.read_text())
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "results", "models"} <= set(ignored)


def test_the_entrypoint_writes_to_s3_and_lets_the_workers_start():
    job = _rayjob()
    overrides = _overrides(job)
    assert overrides["storage.path"].startswith("s3://")
    assert overrides["storage.models_dir"].startswith("s3://")  # the cluster goes after the job: keep the model
    start_timeout = int(overrides["scaling.start_timeout_s"])
    assert job["spec"]["activeDeadlineSeconds"] > start_timeout
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] >= 0
    assert isinstance(spec["submitterConfig"]["backoffLimit"], int) and spec["submitterConfig"]["backoffLimit"] >= 1


def test_the_entrypoint_overrides_are_config_keys():
    from alchemetric_ray.config import load_config

    overrides = _overrides(_rayjob())
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    assert cfg.storage.path == overrides["storage.path"]
    assert cfg.scaling.start_timeout_s == float(overrides["scaling.start_timeout_s"])


def test_the_head_trains_nothing_and_gpu_workers_scale_from_zero():
    cluster = _rayjob()["spec"]["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    gpu_groups = [g for g in cluster["workerGroupSpecs"]
                  if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]]
    assert len(gpu_groups) == 1
    (group,) = gpu_groups
    assert group["minReplicas"] == 0 and group.get("replicas", 0) == 0 and group["maxReplicas"] >= 1
    pod = group["template"]["spec"]
    assert int(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    for kind in ("requests", "limits"):
        assert {"CPU", "MEMORY"} <= {name.upper() for name in pod["containers"][0]["resources"][kind]}
    tolerates = any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", []))
    assert tolerates or pod.get("nodeSelector")


def test_every_pod_mounts_a_memory_backed_dev_shm():
    for name, pod in _pod_specs(_rayjob()):
        shm = {v["name"] for v in pod.get("volumes", []) if v.get("emptyDir", {}).get("medium") == "Memory"}
        mounts = {m["name"] for m in pod["containers"][0].get("volumeMounts", []) if m["mountPath"] == "/dev/shm"}
        assert shm & mounts, f"{name}: no emptyDir(medium: Memory) mounted at /dev/shm"


def test_s3_through_an_irsa_service_account_and_no_key_anywhere():
    docs = _documents(MANIFEST)
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    for name, pod in _pod_specs(_rayjob()):
        account = pod.get("serviceAccountName")
        assert account in accounts, f"{name}: serviceAccountName {account!r} is not defined in the manifest"
        assert accounts[account]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert not [d for d in docs if d["kind"] == "Secret"]
    text = MANIFEST.read_text()
    keys = (r"AWS_SECRET_ACCESS_KEY", r"AWS_ACCESS_KEY_ID", r"(?i)aws_secret", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")
    assert [k for k in keys if re.search(k, text)] == []
    assert re.search(keys[-1], "id: " + "AKIA" + "Q7" * 8)  # the pattern finds a key id (built here, not stored)


def test_token_authentication_is_on_and_the_dashboard_stays_inside():
    job = _rayjob()
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"]["mode"] == "token"
    for name, pod in _pod_specs(job):
        for container in pod["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            assert env.get("RAY_AUTH_MODE", {}).get("value", "token") == "token", name
            assert "value" not in env.get("RAY_AUTH_TOKEN", {}), f"{name}: a literal RAY_AUTH_TOKEN"
    head = cluster["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP" and not head.get("enableIngress", False)
