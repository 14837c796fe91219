"""cluster.yaml checked offline: Ray's own launcher schema, and what that schema cannot see."""

from pathlib import Path

import yaml

CLUSTER = Path(__file__).resolve().parents[1] / "cluster.yaml"


def _config() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


def test_valid_against_rays_launcher_schema():
    import json

    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(_config(), schema)  # raises on a violation
    broken = {**_config(), "max_workers": "many"}
    try:
        jsonschema.validate(broken, schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("the schema check accepted a broken config")


def test_head_runs_no_training_and_gpu_workers_scale_from_zero():
    cfg = _config()
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"]["CPU"] == 0 and "GPU" not in head["resources"]
    assert "--num-cpus=0" in " ".join(cfg["head_start_ray_commands"])
    gpu = [t for name, t in types.items() if t.get("resources", {}).get("GPU", 0) > 0]
    assert len(gpu) == 1
    assert gpu[0]["min_workers"] == 0 and gpu[0]["max_workers"] >= 1
    assert gpu[0]["node_config"]["InstanceType"].startswith(("g5.", "g6.", "p4d.", "p5."))
    assert not head["node_config"]["InstanceType"].startswith(("g", "p"))


def test_every_node_reaches_s3_through_an_instance_profile():
    """The head (job drivers) and the GPU workers (checkpoints) write to S3: an IAM instance profile on
    each, no access keys in the file."""
    cfg = _config()
    for name, node in cfg["available_node_types"].items():
        arn = node["node_config"].get("IamInstanceProfile", {}).get("Arn", "")
        assert arn.startswith("arn:aws:iam::") and ":instance-profile/" in arn, name
    assert "aws_secret" not in CLUSTER.read_text().lower()


def test_setup_installs_the_project_on_a_current_image():
    cfg = _config()
    assert cfg["docker"]["image"].startswith("rayproject/ray:2.60.0") and "ray-ml" not in cfg["docker"]["image"]
    assert cfg["file_mounts"]["/home/ray/alchemetric-ray"] == "."
    assert any("pip install" in c and "/home/ray/alchemetric-ray" in c for c in cfg["setup_commands"])


def test_nothing_exposes_the_dashboard_or_gcs():
    cfg = _config()
    start = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in start and "0.0.0.0" not in start
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    assert [(r["FromPort"], r["ToPort"]) for r in rules] == [(22, 22)]  # SSH only
    assert all(rng["CidrIp"] != "0.0.0.0/0" for r in rules for rng in r["IpRanges"])
    assert "RAY_AUTH_MODE" not in CLUSTER.read_text() or "disabled" not in CLUSTER.read_text()
