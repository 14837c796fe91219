"""k8s/refit-cronjob.yaml and jobs/refit.py checked offline: the nightly refit (issue 43, item 2).

Everything is read from the shipped file. The RayJob a run creates is not taken from the ConfigMap as
written (it holds the Job's name and uid as placeholders): it is what the CronJob pod's own shell
script passes to ``kubectl create``, obtained by running that script with ``/bin/sh`` against a stand-in
``kubectl`` that records its calls. That rendered RayJob is then checked as tests/test_kuberay.py checks
k8s/rayjob.yaml (KubeRay's vendored CRD: schema and unknown keys, with that module's helpers), compared
with k8s/rayjob.yaml's cluster, parsed with the CLI's own parser and planned on its node types as
tests/test_cluster_plans.py plans the shipped RayJob.

No Kubernetes schema is vendored for the CronJob itself: its own fields are checked against the
CronJobSpec and JobSpec field names of the batch/v1 API, and its pod template against the core/v1
PodTemplateSpec schema that KubeRay's CRD embeds (the head group's ``template``).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import zoneinfo
from pathlib import Path

import jsonschema
import pytest
import yaml
from device_probes import cpu_only_machine
from test_cluster_plans import _check_gpu_plans
from test_kuberay import (
    DOCKERFILE,
    MANIFEST,
    RAY,
    _documents,
    _entrypoint,
    _openapi_schema,
    _pod_specs,
    _rayjob,
    _schema_errors,
    _to_json_schema,
    unknown_keys,
)

from alchemetric_ray.cli import config_from_args, parse_args
from alchemetric_ray.config import load_config
from alchemetric_ray.fsutil import is_uri
from alchemetric_ray.placement.capacity import discover_capacity, from_kuberay_spec

REPO = Path(__file__).resolve().parents[1]
CRONJOB_FILE = REPO / "k8s" / "refit-cronjob.yaml"
JOB_SCRIPT = REPO / "jobs" / "refit.py"

# The field names of batch/v1 CronJobSpec and JobSpec (Kubernetes API reference, v1.31).
CRONJOB_SPEC_FIELDS = {"schedule", "timeZone", "jobTemplate", "concurrencyPolicy", "startingDeadlineSeconds",
                       "suspend", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"}
JOB_SPEC_FIELDS = {"template", "parallelism", "completions", "completionMode", "backoffLimit", "backoffLimitPerIndex",
                   "maxFailedIndexes", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend", "selector",
                   "manualSelector", "podFailurePolicy", "podReplacementPolicy", "successPolicy", "managedBy"}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# ---- the documents -------------------------------------------------------------------------------------


def _docs() -> list[dict]:
    return _documents(CRONJOB_FILE)


def _one(kind: str, name: str | None = None) -> dict:
    (doc,) = [d for d in _docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def _cronjob() -> dict:
    return _one("CronJob")


def _submit_pod() -> dict:
    return _cronjob()["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def _submit_container() -> dict:
    (container,) = _submit_pod()["containers"]
    return container


def _manifest_configmap() -> tuple[dict, str]:
    """The ConfigMap the submit container reads its RayJob from, and the key: found through the
    container's RAYJOB_MANIFEST, its volume mount and the volume, as the pod would find it."""
    container = _submit_container()
    env = {e["name"]: e for e in container["env"]}
    path = Path(env["RAYJOB_MANIFEST"]["value"])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in _submit_pod()["volumes"] if v["name"] == mount["name"]]
    return _one("ConfigMap", volume["configMap"]["name"]), path.name


# ---- the submit script, run -------------------------------------------------------------------------------

FAKE_KUBECTL = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:3] == ["create", "-f", "-"]:
    with open(os.environ["FAKE_CREATED"], "w") as out:
        out.write(sys.stdin.read())
    print("rayjob.ray.io/created")
elif args[:2] == ["get", "rayjob"]:
    with open(os.environ["FAKE_LOG"]) as log:
        gets = sum(1 for line in log if json.loads(line)[0] == "get")
    states = os.environ["FAKE_STATES"].split(",")
    state = states[min(gets, len(states)) - 1]
    if state == "ERROR":
        sys.exit("Error from server (InternalError): try again")
    print(state, end="")
else:
    sys.exit(f"unexpected kubectl call: {args}")
"""


def _run_submit(tmp_path: Path, states: list[str], job_name: str = "alchemetric-refit-29410110",
                job_uid: str = "5b0c7f4e-0000-4000-8000-000000000001") -> tuple[subprocess.CompletedProcess, list, str]:
    """Run the CronJob container's command (``/bin/sh -c SCRIPT``) with its env, the ConfigMap's manifest at
    a local path and a kubectl that answers ``get`` with ``states`` in turn. Returns the process, kubectl's
    calls and what was piped to ``kubectl create``."""
    container = _submit_container()
    configmap, key = _manifest_configmap()
    manifest = tmp_path / key
    manifest.write_text(configmap["data"][key])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"#!{sys.executable}\n{FAKE_KUBECTL}")
    kubectl.chmod(0o755)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(JOB_NAME=job_name, JOB_UID=job_uid, RAYJOB_MANIFEST=str(manifest), POLL_SECONDS="0",
               HOME=str(tmp_path), PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               FAKE_LOG=str(tmp_path / "calls.jsonl"), FAKE_CREATED=str(tmp_path / "created.yaml"),
               FAKE_STATES=",".join(states))
    proc = subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True,
                          timeout=60)
    log = tmp_path / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    created = tmp_path / "created.yaml"
    return proc, calls, created.read_text() if created.exists() else ""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    """The RayJob a scheduled run creates, as the pod's script renders it."""
    proc, _, created = _run_submit(tmp_path_factory.mktemp("submit"), ["Complete/SUCCEEDED"])
    assert proc.returncode == 0, proc.stderr
    (job,) = [d for d in yaml.safe_load_all(created) if d]
    return job


def _refit_argv(job: dict) -> list[str]:
    """The entrypoint's arguments after ``python .../jobs/refit.py``."""
    argv = _entrypoint(job)
    assert argv[0] == "python" and Path(argv[1]).name == "refit.py", argv
    return argv[2:]


# ---- what the file holds ---------------------------------------------------------------------------------


def test_the_file_holds_the_cronjob_its_rbac_and_the_rayjob_manifest():
    kinds = sorted(d["kind"] for d in _docs())
    assert kinds == ["ConfigMap", "ConfigMap", "CronJob", "PersistentVolumeClaim", "Role", "RoleBinding",
                     "ServiceAccount", "ServiceAccount"]
    assert not [d for d in _docs() if d["kind"] in ("RayJob", "Secret", "ClusterRole", "ClusterRoleBinding")]
    for doc in _docs():
        name = doc["metadata"]["name"]
        assert DNS_SUBDOMAIN.match(name) and len(name) <= 253, name
        assert "namespace" not in doc["metadata"]  # everything lands in the namespace it is applied to


def test_the_documents_shared_with_k8s_rayjob_yaml_are_identical():
    """The IRSA ServiceAccount and the node types: applied by either file, they must not fight."""
    theirs = {(d["kind"], d["metadata"]["name"]): d for d in _documents(MANIFEST) if d["kind"] != "RayJob"}
    ours = {(d["kind"], d["metadata"]["name"]): d for d in _docs()}
    shared = set(theirs) & set(ours)
    assert shared == {("ServiceAccount", "alchemetric-ray-s3"), ("ConfigMap", "alchemetric-node-types")}
    for key in shared:
        assert ours[key] == theirs[key], key


# ---- the RayJob it creates -------------------------------------------------------------------------------


def test_the_rayjob_a_run_creates_passes_kuberays_schema_and_has_no_unknown_key(rendered):
    assert rendered["apiVersion"] == "ray.io/v1" and rendered["kind"] == "RayJob"
    assert _schema_errors(rendered) == []
    assert unknown_keys(rendered, _openapi_schema()) == []


def test_a_misspelled_key_in_the_rayjob_is_caught(rendered):
    job = copy.deepcopy(rendered)
    job["spec"]["shutdownAfterJobFinish"] = job["spec"].pop("shutdownAfterJobFinishes")
    assert unknown_keys(job, _openapi_schema()) == ["spec.shutdownAfterJobFinish"]


def _refit_claim() -> dict:
    return _one("PersistentVolumeClaim")


def _without_refit_volume(cluster: dict) -> dict:
    """A rayClusterSpec without the refit's shared volume and its mounts."""
    cluster = copy.deepcopy(cluster)
    claim = _refit_claim()["metadata"]["name"]
    for pod in [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"]
                                                                for g in cluster["workerGroupSpecs"]]:
        names = {v["name"] for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == claim}
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in names]
        for container in pod["containers"]:
            container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] not in names]
    return cluster


def test_the_rayjob_runs_on_k8s_rayjob_yamls_cluster(rendered):
    """Same image, Ray 2.60.0, head and worker groups, S3 through IRSA, token authentication: the whole
    rayClusterSpec but the refit's volume, and every RayJob setting but the entrypoint, are k8s/rayjob.yaml's."""
    train = _rayjob()
    assert _without_refit_volume(rendered["spec"]["rayClusterSpec"]) == train["spec"]["rayClusterSpec"]
    assert rendered["spec"]["rayClusterSpec"] != train["spec"]["rayClusterSpec"]  # the volume is there
    ours = {k: v for k, v in rendered["spec"].items() if k not in ("entrypoint", "rayClusterSpec")}
    assert ours == {k: v for k, v in train["spec"].items() if k not in ("entrypoint", "rayClusterSpec")}
    cluster = rendered["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == RAY and cluster["authOptions"]["mode"] == "token"
    images = {c["image"] for _, pod in _pod_specs(rendered) for c in pod["containers"]}
    assert len(images) == 1 and images.pop().endswith(f"-ray{RAY}-py311-gpu")
    accounts = {pod["serviceAccountName"] for _, pod in _pod_specs(rendered)}
    assert accounts == {"alchemetric-ray-s3"}
    assert _one("ServiceAccount", "alchemetric-ray-s3")["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]


def test_each_run_gets_its_own_rayjob_owned_by_its_job(tmp_path):
    name, uid = "alchemetric-refit-29410555", "0e4c1f7d-1111-4222-8333-444455556666"
    proc, _, created = _run_submit(tmp_path, ["Complete/SUCCEEDED"], name, uid)
    assert proc.returncode == 0, proc.stderr
    (job,) = [d for d in yaml.safe_load_all(created) if d]
    assert job["metadata"]["name"] == name
    assert job["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}]
    assert not re.search(r"@JOB_[A-Z]+@", created)  # no placeholder left
    # the Job's name and uid come from the labels Kubernetes puts on a Job's pods
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in _submit_container()["env"]
              if "valueFrom" in e}
    assert fields == {"JOB_NAME": "metadata.labels['batch.kubernetes.io/job-name']",
                      "JOB_UID": "metadata.labels['batch.kubernetes.io/controller-uid']"}
    # a Job's name is the CronJob's plus "-" and up to 11 digits; the RayCluster adds "-" and 5 characters
    # and its head Service "-head-svc": within a Service name's 63 characters
    assert len(_cronjob()["metadata"]["name"]) + 12 + 6 + len("-head-svc") <= 63


# ---- its command line --------------------------------------------------------------------------------------


def test_the_entrypoint_is_jobs_refit_py_in_the_image(rendered):
    argv = _entrypoint(rendered)
    workdir = re.search(r"^WORKDIR\s+(\S+)", DOCKERFILE.read_text(), re.M).group(1)
    assert argv[:2] == ["python", f"{workdir}/jobs/refit.py"]
    assert JOB_SCRIPT.is_file()


def test_the_entrypoint_parses_as_a_refit_and_its_overrides_are_config_keys(rendered):
    args = parse_args(["refit", *_refit_argv(rendered)])
    assert args.command == "refit"
    assert "models:/alchemetric@champion" in (getattr(args, "model_dir", None), getattr(args, "model", None))
    assert args.data.startswith("s3://")
    cfg = load_config(None, args.overrides)
    assert cfg.tracking.mlflow_uri.startswith(("http://", "https://"))  # models:/ needs the registry's server
    command_cfg = config_from_args(args)  # the command's own config: the same, but for --data's data.*
    assert command_cfg.data.path == args.data
    assert {k: v for k, v in vars(command_cfg).items() if k != "data"} == {
        k: v for k, v in vars(cfg).items() if k != "data"}
    # the wait for GPU workers and the node types: as the training RayJob
    train = dict(a.split("=", 1) for a in _entrypoint(_rayjob())[2:] if "=" in a)
    ours = dict(a.split("=", 1) for a in args.overrides)
    for key in ("scaling.start_timeout_s", "scaling.cluster_config"):
        assert ours[key] == train[key], key
    assert rendered["spec"]["activeDeadlineSeconds"] > cfg.scaling.start_timeout_s


def test_out_is_a_local_folder_on_a_shared_volume_that_outlives_the_cluster(rendered):
    """refit keeps its lock, state, shards and runs in --out, a local folder (it refuses a URI), and the
    challenger checkpoints under it from the GPU workers: a ReadWriteMany claim mounted at one path on the
    head and every worker group, and storage.shared=true (the trainer refuses a local storage path on an
    autoscaling cluster without it)."""
    args = parse_args(["refit", *_refit_argv(rendered)])
    assert not is_uri(args.out) and Path(args.out).is_absolute()
    assert load_config(None, args.overrides).storage.shared is True
    claim = _refit_claim()
    assert "ReadWriteMany" in claim["spec"]["accessModes"] and claim["spec"]["resources"]["requests"]["storage"]
    for group, pod in _pod_specs(rendered):
        (volume,) = [v for v in pod["volumes"]
                     if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]]
        (container,) = pod["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert not mount.get("readOnly", False), group
        assert Path(args.out).is_relative_to(mount["mountPath"]), (group, args.out, mount["mountPath"])


def test_the_refit_plans_cuda_workers_on_the_node_types_it_mounts(rendered, tmp_path, monkeypatch):
    """As tests/test_cluster_plans.py plans k8s/rayjob.yaml: the config the entrypoint builds, the node
    types it reads (the ConfigMap mounted on the head at scaling.cluster_config), equal to what Ray's KubeRay
    converter derives from the cluster spec, and a default run's plans on them."""
    cpu_only_machine(monkeypatch)  # the job driver's host: a CPU-only head
    cfg = load_config(None, parse_args(["refit", *_refit_argv(rendered)]).overrides)
    assert cfg.device.name == "auto"
    path = Path(cfg.scaling.cluster_config)
    head = rendered["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (mount,) = [m for m in head["containers"][0]["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in head["volumes"] if v["name"] == mount["name"]]
    node_types = _one("ConfigMap", volume["configMap"]["name"])["data"][path.name]
    derived = from_kuberay_spec(rendered["spec"]["rayClusterSpec"], rendered["metadata"]["name"])
    assert yaml.safe_load(node_types) == derived
    local = tmp_path / path.name
    local.write_text(node_types)
    capacity = discover_capacity(cfg.replace(f"scaling.cluster_config={local}"), joined=True)
    assert capacity.kind == "node_types" and "gpu {CPU: 44, GPU: 4" in capacity.describe_types()
    _check_gpu_plans(cfg, capacity, "gpu", 44.0)


def test_jobs_refit_py_help_runs():
    proc = subprocess.run([sys.executable, str(JOB_SCRIPT), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--model" in proc.stdout and "--data" in proc.stdout and "--out" in proc.stdout


# ---- the schedule ------------------------------------------------------------------------------------------

CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
WEEKDAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
CRON_NAMES: tuple[dict[str, int], ...] = ({}, {}, {}, MONTHS, WEEKDAYS)


def _cron_number(expr: str, text: str, low: int, high: int, names: dict[str, int]) -> int:
    value = names.get(text.lower(), int(text) if text.isdigit() else None)
    if value is None or not low <= value <= high:
        raise ValueError(f"{expr!r}: {text!r} is not in {low}-{high}")
    return value


def cron_values(expr: str) -> list[set[int]]:
    """The values each of a 5-field cron expression's fields selects (numbers, names, ``*``, ranges, lists
    and steps, as Kubernetes' CronJob takes them); ValueError for anything else."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"{expr!r}: {len(fields)} fields, not 5")
    out = []
    for field, (low, high), names in zip(fields, CRON_RANGES, CRON_NAMES):
        chosen: set[int] = set()
        for part in field.split(","):
            body, slash, step = part.partition("/")
            if slash and not (step.isdigit() and int(step) > 0):
                raise ValueError(f"{expr!r}: bad step in {part!r}")
            if body == "*":
                first, last = low, high
            elif "-" in body:
                first, last = (_cron_number(expr, t, low, high, names) for t in body.split("-", 1))
                if first > last:
                    raise ValueError(f"{expr!r}: empty range {body!r}")
            else:
                first = _cron_number(expr, body, low, high, names)
                last = high if slash else first
            chosen |= set(range(first, last + 1, int(step or 1)))
        out.append(chosen)
    out[4] = {7 if d == 0 else d for d in out[4]}  # Sunday: 0 or 7
    return out


def nightly(expr: str) -> bool:
    """Once a day at one time, every month, on 5 days of the week at least (a trading week's nights or
    the mornings after them)."""
    minutes, hours, days, months, weekdays = cron_values(expr)
    return (len(minutes) == len(hours) == 1 and days == set(range(1, 32)) and months == set(range(1, 13))
            and len(weekdays) >= 5)


@pytest.mark.parametrize("expr, ok, is_nightly", [
    ("30 19 * * 1-5", True, True), ("0 6 * * 2-6", True, True), ("0 2 * * *", True, True),
    ("15 22 * * MON-FRI", True, True), ("0 2 * * 0-7", True, True),
    ("*/5 * * * *", True, False), ("0 2 1 * *", True, False), ("0 2 * * 6,0", True, False),
    ("0 2,14 * * *", True, False),
    ("60 19 * * *", False, None), ("30 24 * * *", False, None), ("30 19 * *", False, None),
    ("30 19 * * * *", False, None),
    ("30 19 0 * *", False, None), ("30 19 * * 5-1", False, None), ("30 19 * * mo", False, None),
    ("*/0 * * * *", False, None), ("0 2/ * * *", False, None), ("0 2 * * 1-", False, None),
])
def test_the_cron_checker(expr, ok, is_nightly):
    if not ok:
        with pytest.raises(ValueError):
            cron_values(expr)
    else:
        assert nightly(expr) is is_nightly


def test_the_schedule_is_a_valid_nightly_cron_in_a_real_time_zone():
    spec = _cronjob()["spec"]
    assert isinstance(spec["schedule"], str) and nightly(spec["schedule"])
    assert not spec["schedule"].lstrip().startswith(("TZ=", "CRON_TZ="))  # Kubernetes refuses these: timeZone
    zoneinfo.ZoneInfo(spec["timeZone"])  # an IANA name
    assert spec.get("suspend", False) is False


def test_one_refit_at_a_time_and_a_bounded_history():
    spec = _cronjob()["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    deadline = spec["startingDeadlineSeconds"]
    assert isinstance(deadline, int) and 10 <= deadline < 12 * 3600  # a missed night is skipped, not run at noon
    for key in ("successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
        assert isinstance(spec[key], int) and 1 <= spec[key] <= 10, key
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0  # a retry would create a second RayJob
    assert "ttlSecondsAfterFinished" not in job  # the history limits decide when a Job and its RayJob go
    # Forbid holds only while the Job lasts as long as the refit: it outlives the RayJob's own deadline
    configmap, key = _manifest_configmap()
    assert job["activeDeadlineSeconds"] > yaml.safe_load(configmap["data"][key])["spec"]["activeDeadlineSeconds"]


@pytest.mark.parametrize("states, code, gets", [
    (["Complete/SUCCEEDED"], 0, 1),
    (["/", "Initializing/", "Running/RUNNING", "Complete/SUCCEEDED"], 0, 4),
    (["Running/RUNNING", "Complete/FAILED"], 1, 2),
    (["Running/RUNNING", "Failed/FAILED"], 1, 2),
    (["Failed/"], 1, 1),  # e.g. the RayJob's activeDeadlineSeconds passed before the job started
    (["ERROR", "ERROR", "Complete/SUCCEEDED"], 0, 3),  # a passing API error is waited out
    (["ERROR"], 1, 10),  # a status that stays unreadable ends the run
])
def test_the_pod_waits_for_the_refit_and_exits_with_its_outcome(tmp_path, states, code, gets):
    proc, calls, created = _run_submit(tmp_path, states)
    assert proc.returncode == code, proc.stderr
    assert calls[0] == ["create", "-f", "-"] and created
    assert calls[1:] == [["get", "rayjob", "alchemetric-refit-29410110", "-o",
                          "jsonpath={.status.jobDeploymentStatus}/{.status.jobStatus}"]] * gets
    line = (proc.stdout if code == 0 else proc.stderr).strip().splitlines()[-1]
    assert line.startswith("refit alchemetric-refit-29410110: ")


def test_a_refused_create_fails_the_run_without_waiting(tmp_path):
    configmap, key = _manifest_configmap()
    (tmp_path / key).write_text(configmap["data"][key])
    broken = tmp_path / "broken"
    (broken / "bin").mkdir(parents=True)
    (broken / "bin" / "kubectl").write_text("#!/bin/sh\necho \"$@\" >> \"$FAKE_LOG\"\nexit 1\n")
    (broken / "bin" / "kubectl").chmod(0o755)
    env = {"JOB_NAME": "x", "JOB_UID": "u", "RAYJOB_MANIFEST": str(tmp_path / key), "POLL_SECONDS": "0",
           "PATH": f"{broken / 'bin'}:/usr/bin:/bin", "FAKE_LOG": str(broken / "calls")}
    container = _submit_container()
    proc = subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert (broken / "calls").read_text().splitlines() == ["create -f -"]  # no polling after a failed create


# ---- the CronJob as Kubernetes takes it ------------------------------------------------------------------------


def _pod_template_schema() -> dict:
    """core/v1 PodTemplateSpec, as KubeRay's CRD embeds it for the head group."""
    spec = _openapi_schema()["properties"]["spec"]["properties"]["rayClusterSpec"]["properties"]
    return spec["headGroupSpec"]["properties"]["template"]


def _cronjob_problems(cronjob: dict) -> list[str]:
    problems = []
    if cronjob.get("apiVersion") != "batch/v1" or cronjob.get("kind") != "CronJob":
        problems.append("apiVersion/kind: not batch/v1 CronJob")
    name = cronjob.get("metadata", {}).get("name", "")
    if not (DNS_SUBDOMAIN.match(name) and len(name) <= 52):
        problems.append(f"metadata.name: {name!r} is not a DNS subdomain of at most 52 characters")
    spec = cronjob.get("spec", {})
    problems += [f"spec: {k} is required" for k in ("schedule", "jobTemplate") if k not in spec]
    problems += [f"spec.{k}: unknown" for k in sorted(set(spec) - CRONJOB_SPEC_FIELDS)]
    if spec.get("concurrencyPolicy", "Allow") not in ("Allow", "Forbid", "Replace"):
        problems.append("spec.concurrencyPolicy: not Allow, Forbid or Replace")
    for key in ("startingDeadlineSeconds", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
        if key in spec and not (isinstance(spec[key], int) and not isinstance(spec[key], bool) and spec[key] >= 0):
            problems.append(f"spec.{key}: not a non-negative integer")
    job = spec.get("jobTemplate", {}).get("spec", {})
    problems += [f"spec.jobTemplate.spec.{k}: unknown" for k in sorted(set(job) - JOB_SPEC_FIELDS)]
    template = job.get("template")
    if template is None:
        return [*problems, "spec.jobTemplate.spec.template: required"]
    where = "spec.jobTemplate.spec.template"
    validator = jsonschema.Draft7Validator(_to_json_schema(_pod_template_schema()))
    problems += [f"{where}.{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}"
                 for e in validator.iter_errors(template)]
    problems += [f"{where}.{k}: unknown" for k in unknown_keys(template, _pod_template_schema())]
    if template.get("spec", {}).get("restartPolicy") not in ("Never", "OnFailure"):
        problems.append(f"{where}.spec.restartPolicy: a Job's pods need Never or OnFailure")
    return problems


def test_the_cronjob_has_what_kubernetes_requires_and_nothing_it_does_not_know():
    assert _cronjob_problems(_cronjob()) == []


@pytest.mark.parametrize("edit, reported", [
    (lambda c: c["spec"].__setitem__("concurencyPolicy", c["spec"].pop("concurrencyPolicy")),
     "spec.concurencyPolicy: unknown"),
    (lambda c: c["spec"].pop("schedule"), "spec: schedule is required"),
    (lambda c: c["spec"].__setitem__("concurrencyPolicy", "Never"), "spec.concurrencyPolicy"),
    (lambda c: c["spec"].__setitem__("startingDeadlineSeconds", "1h"), "spec.startingDeadlineSeconds"),
    (lambda c: c["spec"]["jobTemplate"]["spec"].__setitem__("backofLimit", 0), "spec.jobTemplate.spec.backofLimit"),
    (lambda c: c["spec"]["jobTemplate"]["spec"]["template"]["spec"].__setitem__("restartPolicy", "Always"),
     "restartPolicy"),
    (lambda c: c["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0].__setitem__(
        "volumeMount", []), "spec.jobTemplate.spec.template.spec.containers[0].volumeMount: unknown"),
    (lambda c: c["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0].pop("name"),
     "'name' is a required property"),
    (lambda c: c["metadata"].__setitem__("name", "Alchemetric_Refit"), "metadata.name"),
])
def test_a_broken_cronjob_is_reported(edit, reported):
    cronjob = copy.deepcopy(_cronjob())
    edit(cronjob)
    problems = _cronjob_problems(cronjob)
    assert any(reported in p for p in problems), problems


def test_the_submit_pod_is_locked_down():
    pod = _submit_pod()
    container = _submit_container()
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    limits = container["resources"]["limits"]  # both Kubernetes resources (processor and memory) are capped
    assert len(limits) == 2 and "memory" in limits and all(limits.values())
    assert "alchemetric-ray" not in container["image"]  # a small kubectl image, not the GPU training image


# ---- RBAC ---------------------------------------------------------------------------------------------------


def test_the_submitter_may_only_create_and_read_rayjobs(tmp_path):
    role = _one("Role")
    assert role["rules"] == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["create", "get"]}]
    binding = _one("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    account = _submit_pod()["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert "annotations" not in _one("ServiceAccount", account)["metadata"]  # no cloud role for the submitter
    # and that is all the script asks of the API server (a full run, with a retried read)
    _, calls, _ = _run_submit(tmp_path, ["ERROR", "Running/RUNNING", "Complete/SUCCEEDED"])
    verbs = {call[0] for call in calls}
    kinds = {call[1] if call[0] == "get" else "rayjob" for call in calls}
    assert verbs == {"create", "get"} and kinds == {"rayjob"}
    # the manifest it creates is a RayJob only
    configmap, key = _manifest_configmap()
    assert [d["kind"] for d in yaml.safe_load_all(configmap["data"][key]) if d] == ["RayJob"]


def test_no_credential_anywhere_in_the_file():
    text = CRONJOB_FILE.read_text()
    keys = (r"AWS_SECRET_ACCESS_KEY", r"AWS_ACCESS_KEY_ID", r"(?i)aws_secret", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
            r"RAY_AUTH_TOKEN")
    assert [k for k in keys if re.search(k, text)] == []
