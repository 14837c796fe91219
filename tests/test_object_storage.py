"""Object storage end to end, against a real S3-compatible server on 127.0.0.1 (moto, ``s3`` fixture).

Nothing in the product knows the server is moto: it is reached through AWS_ENDPOINT_URL and the
standard credential variables that conftest.py sets for the session, as any S3 endpoint would be.
The bad-input cases (no credentials, no bucket, a dead endpoint, keys in a URI) are in
test_bad_input.py with the rest of the checklist.
"""

from __future__ import annotations

import io
import json
import pickle

import pyarrow.parquet as pq
import pytest
from conftest import S3_SECRET

from alchemetric_ray.cli import main
from alchemetric_ray.data.manifest import MANIFEST, Manifest
from alchemetric_ray.outputs import MARK
from alchemetric_ray.storage import locate

TICKERS = "AAPL,MSFT,XOM"


def test_the_filesystem_pickled_to_workers_holds_no_credentials(s3):
    """Ray pickles the storage file system to every worker: it must carry the endpoint, not the keys."""
    where = locate("s3://any-bucket/runs")
    blob = pickle.dumps(where.filesystem)
    assert S3_SECRET.encode() not in blob and b"alchemetric-test-key" not in blob
    assert pickle.loads(blob).get_file_info("any-bucket").type.name == "NotFound"  # it still works there


def test_workers_learn_where_the_bucket_is_but_never_the_keys():
    """runtime_env variables are shown on the dashboard: the endpoint and region go there, keys never."""
    from alchemetric_ray.config import RunConfig
    from alchemetric_ray.placement.session import worker_env

    env = worker_env(RunConfig())
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:") and env["AWS_REGION"] == "us-east-1"
    assert S3_SECRET not in json.dumps(env)
    assert not any(name.startswith("AWS_") and ("KEY" in name or "TOKEN" in name) for name in env)


def test_shards_on_a_bucket_manifest_last_and_only_listed_files_are_read(s3, stocknet_dir, tmp_path, monkeypatch,
                                                                         capsys):
    """`features --out s3://...` writes shards and the manifest there (put in place after every shard it
    lists: test_staged_dir.py), and readers read the files it lists and nothing else."""
    from alchemetric_ray.data.loaders import check_shard_files
    from alchemetric_ray.scoring.predictions import split_frame

    monkeypatch.chdir(tmp_path)
    bucket = s3.bucket("ar-shards")
    assert main(["features", "--data", str(stocknet_dir), "--out", f"{bucket}/shards", "--quiet",
                 f"data.tickers={TICKERS}"]) == 0
    keys = s3.keys("ar-shards", "shards/")
    manifest = Manifest.read(f"{bucket}/shards")
    listed = [f"shards/{name}" for files in manifest.files.values() for name in files]
    assert listed and f"shards/{MANIFEST}" in keys and set(listed) <= set(keys)
    assert not any((k.startswith("shards/.") and k != f"shards/{MARK}") or "/.shards" in k for k in keys)  # no upload
    assert f"shards/{MARK}" in keys  # the mark: shards of ours, which a later features --out may replace
    assert list(tmp_path.iterdir()) == []  # a URI never becomes a local folder (no "s3:" here)

    # a stray file in a split's folder (an older or unfinished build) is not read
    train_file = manifest.files["train"][0]
    s3.client.put_object(Bucket="ar-shards", Key="shards/split=train/part-99999.parquet",
                         Body=s3.read("ar-shards", f"shards/{train_file}"))
    check_shard_files(f"{bucket}/shards", manifest)  # row counts still match the manifest
    frame = split_frame(f"{bucket}/shards", "train", manifest.features, manifest)
    assert len(frame) == manifest.rows["train"]


@pytest.mark.slow
def test_train_predict_and_evaluate_with_everything_on_a_bucket(ray_session, s3, stocknet_dir, tmp_path,
                                                                       monkeypatch, capfd):
    """Shards, runs (checkpoints, TensorBoard events), the exported model, raw bars, signals and the
    evaluation report all on object storage; no credential in anything written.  (A run resumed from
    a bucket: test_training.py's bitwise resume test.)"""
    monkeypatch.chdir(tmp_path)
    bucket = s3.bucket("ar-e2e")
    for ticker in TICKERS.split(","):  # raw bars for predict and evaluate, as the source's CSVs
        s3.client.upload_file(str(stocknet_dir / f"{ticker}.csv"), "ar-e2e", f"raw/{ticker}.csv")
    assert main(["features", "--data", str(stocknet_dir), "--out", f"{bucket}/shards", "--quiet",
                 f"data.tickers={TICKERS}"]) == 0
    assert main(["train", "--data", f"{bucket}/shards", f"storage.path={bucket}/runs",
                 f"storage.models_dir={bucket}/models", "storage.name=e2e", "model.hidden=8", "train.epochs=2"]) == 0
    out = "".join(capfd.readouterr())
    assert "saved model: s3://ar-e2e/models/e2e" in out
    model_keys = s3.keys("ar-e2e", "models/e2e/")
    assert {"models/e2e/weights.pt", "models/e2e/meta.json", "models/e2e/metrics.json"} <= set(model_keys)
    metas = [k for k in s3.keys("ar-e2e", "runs/") if k.endswith("/meta.json")]  # a checkpoint per epoch
    assert {json.loads(s3.read("ar-e2e", k))["epoch"] for k in metas} == {0, 1}, metas
    assert all(k.startswith("runs/e2e-") for k in metas)
    assert any("/tensorboard/events.out.tfevents." in k for k in s3.keys("ar-e2e", "runs/"))
    assert any("/tensorboard/hparams/events.out.tfevents." in k for k in s3.keys("ar-e2e", "runs/"))  # HParams

    assert main(["predict", "--model", f"{bucket}/models/e2e", "--data", f"{bucket}/raw",
                 "--out", f"{bucket}/signals/e2e.parquet"]) == 0
    signals = pq.read_table(io.BytesIO(s3.read("ar-e2e", "signals/e2e.parquet"))).to_pandas()
    assert set(signals["ticker"]) == set(TICKERS.split(",")) and len(signals) > 1000
    assert signals["model_id"].iloc[0].startswith("e2e@")

    assert main(["evaluate", "--model", f"{bucket}/models/e2e", "--data", f"{bucket}/raw",
                 "--out", f"{bucket}/evaluation/e2e"]) == 0
    report = s3.keys("ar-e2e", "evaluation/e2e/")
    assert {"evaluation/e2e/report.md", "evaluation/e2e/evaluation.json"} <= set(report)
    verdict = json.loads(s3.read("ar-e2e", "evaluation/e2e/evaluation.json"))["verdict"]
    assert verdict["line"]

    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())  # no local "s3:" folder
    printed = "".join(capfd.readouterr()) + out
    assert S3_SECRET not in printed
    for key in s3.keys("ar-e2e"):  # checkpoints, metadata, model, reports: no credential anywhere
        assert S3_SECRET.encode() not in s3.read("ar-e2e", key), key
