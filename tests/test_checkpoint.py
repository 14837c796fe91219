"""A training checkpoint's round trip through a local folder (no Ray): the tensors, the loop state
and meta.json come back as they were saved; and a checkpoint that is not whole (state.pt cut short
or changed, meta.json missing or broken) is found and skipped for the newest whole one."""

import hashlib
import json
import shutil

import pytest
import torch
from torch import nn

from alchemetric_ray.artifacts.checkpoint import (
    CheckpointMeta,
    LoopState,
    Trainables,
    checkpoint_problem,
    latest_complete_checkpoint,
    load_state,
    read_meta,
    save_checkpoint,
)
from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.errors import CheckpointError
from alchemetric_ray.hardware.optimizer import OptimizerStep, adamw
from alchemetric_ray.hardware.precision import Precision, resolve_precision
from alchemetric_ray.storage import Location

# the keys of meta.json that the export, a resumed run and the sweep read
META_KEYS = {"epoch", "config", "metrics", "device", "precision", "plan", "world_size", "environment", "manifest",
             "loop", "state_file", "known_bugs"}


def _trainables(seed: int) -> Trainables:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    precision = resolve_precision("fp32", torch.device("cpu"))
    step = OptimizerStep(optimizer, precision, scaler=torch.amp.GradScaler("cpu", init_scale=512.0 + seed))
    return Trainables(model, optimizer, scheduler, step)


def _train_a_little(trainables: Trainables) -> None:
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    for step in range(3):
        loss = nn.functional.cross_entropy(trainables.model(x), y)
        trainables.step(loss, epoch=0, step=step)
        trainables.scheduler.step()


def _assert_equal(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_equal(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    else:
        assert a == b


MANIFEST = Manifest(features=["f0"], label={"scheme": "binary", "classes": ["down", "up"]}, splits={},
                    normalization={}, rows={"train": 8, "val": 4, "test": 4})


def test_training_checkpoint_round_trip(tmp_path):
    saved = _trainables(seed=0)
    _train_a_little(saved)
    state = LoopState(epoch=2, best=0.61, bad_epochs=1, history=[{"epoch": 0, "val_accuracy": 0.5}])
    run = CheckpointMeta(config={"train": {"epochs": 4}}, manifest=MANIFEST,
                         device={"device": "cpu", "reason": "test"}, precision={"mode": "fp32"},
                         plan={"num_workers": 1}, world_size=1, environment={"python": "test"})
    meta = run.at(state, {"val_accuracy": 0.61, "val_confusion": [[1, 0], [0, 1]]})
    save_checkpoint(tmp_path, saved.state_dict(state.epoch), meta.to_dict())

    # meta.json keeps the keys every reader knows; state.pt is tensors only (weights_only=True)
    assert set(json.loads((tmp_path / "meta.json").read_text())) == META_KEYS
    raw = load_state(tmp_path)
    assert set(raw) == {"model", "optimizer", "scheduler", "scaler", "epoch"} and int(raw["epoch"]) == 2

    restored = _trainables(seed=1)  # other weights, other scale: everything must come from the folder
    restored.load_state_dict(raw)
    back = CheckpointMeta.from_dict(read_meta(tmp_path))
    assert back == meta and back.loop_state() == state
    _assert_equal(restored.state_dict(state.epoch), saved.state_dict(state.epoch))
    assert restored.step.scaler.get_scale() == saved.step.scaler.get_scale()

    # and both go on alike: the same next step from the same state
    torch.manual_seed(7)
    _train_a_little(saved)
    torch.manual_seed(7)
    _train_a_little(restored)
    _assert_equal(restored.state_dict(3), saved.state_dict(3))


def test_checkpoint_meta_without_its_keys_is_refused():
    with pytest.raises(CheckpointError, match="without config"):
        CheckpointMeta.from_dict({"epoch": 0, "loop": {"best": None, "bad_epochs": 0, "history": []}})


@pytest.mark.parametrize("saved_fused, loaded_fused", [(False, True), (True, False)])
@pytest.mark.parametrize("mode", ["fp32", "fp16"])
def test_a_checkpoint_of_the_other_adamw_resumes_stepping_as_the_optimizer_was_built(tmp_path, saved_fused,
                                                                                     loaded_fused, mode):
    """A run checkpointed by a plain AdamW (before the loop fused it, or on MPS) resumes into the
    loop's fused one, and the other way round: the optimizer keeps its own way of stepping (a plain
    AdamW handed GradScaler's found-inf flag raises), and its moments and step counts come back."""
    cpu = torch.device("cpu")  # the device the optimizers step on: the CPU's fused and plain AdamW
    precision = (resolve_precision("fp32", cpu) if mode == "fp32" else
                 Precision("fp16", "cpu", torch.float16, True, False, "test: the CUDA fp16 recipe on the CPU"))

    def trainables(fused: bool) -> Trainables:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).to(cpu)
        optimizer = adamw(model.parameters(), lr=1e-2) if fused else torch.optim.AdamW(model.parameters(), lr=1e-2)
        assert bool(optimizer.defaults["fused"]) == fused
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return Trainables(model, optimizer, scheduler, OptimizerStep(optimizer, precision))

    saved = trainables(saved_fused)
    _train_a_little(saved)
    loaded = trainables(loaded_fused)
    loaded.load_state_dict(saved.state_dict(0))
    assert all(bool(g["fused"]) == loaded_fused for g in loaded.optimizer.param_groups)
    _train_a_little(loaded)  # steps (the fused kernel with GradScaler's flag, or the plain one)
    for p in loaded.model.parameters():
        state = loaded.optimizer.state[p]
        assert int(state["step"]) == 6 and state["step"].device == (p.device if loaded_fused else cpu)
        assert torch.isfinite(state["exp_avg"]).all()


# ---- whole checkpoints and incomplete ones ------------------------------------------------------------


def _run_folder(root, epochs: int, numel: int = 20_000):
    """A Train run's folder with one checkpoint per epoch (epoch-0000 ...), each a real save."""
    run = root / "run"
    for epoch in range(epochs):
        save_checkpoint(run / f"epoch-{epoch:04d}", {"model": {"w": torch.full((numel,), float(epoch))}},
                        {"epoch": epoch, "loop": {"best": None, "bad_epochs": 0, "history": []}})
    return run


def test_meta_json_records_the_size_and_sha256_of_state_pt(tmp_path):
    run = _run_folder(tmp_path, 1)
    ckpt = run / "epoch-0000"
    data = (ckpt / "state.pt").read_bytes()
    assert read_meta(ckpt)["state_file"] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert checkpoint_problem(ckpt) is None
    assert latest_complete_checkpoint(run) == (ckpt, 0)


def test_a_truncated_state_and_a_missing_meta_are_skipped_for_the_newest_whole_checkpoint(tmp_path, capsys):
    run = _run_folder(tmp_path, 4)
    (run / "checkpoint_manager_snapshot.json").write_text("{}")  # what else Ray Train keeps in a run folder
    (run / "tensorboard").mkdir()
    newest = run / "epoch-0003" / "state.pt"  # a copy cut short
    size = newest.stat().st_size
    newest.write_bytes(newest.read_bytes()[:4096])
    (run / "epoch-0002" / "meta.json").unlink()  # the save died before its last file

    assert checkpoint_problem(run / "epoch-0003") == f"state.pt is 4096 bytes, meta.json says {size}"
    assert checkpoint_problem(run / "epoch-0002") == "no meta.json: its save did not finish"
    capsys.readouterr()
    assert latest_complete_checkpoint(run) == (run / "epoch-0001", 1)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"warning: checkpoint epoch 4 (epoch-0003) is incomplete (state.pt is 4096 bytes, meta.json says {size}); "
        "using epoch 2 (epoch-0001)",
        "warning: checkpoint epoch 3 (epoch-0002) is incomplete (no meta.json: its save did not finish); "
        "using epoch 2 (epoch-0001)",
    ]
    assert torch.equal(load_state(run / "epoch-0001")["model"]["w"], torch.full((20_000,), 1.0))


def test_a_state_of_the_right_size_but_other_bytes_is_not_whole(tmp_path):
    run = _run_folder(tmp_path, 2)
    state = run / "epoch-0001" / "state.pt"
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte in the tensor data: torch.load would not notice
    state.write_bytes(bytes(raw))
    problem = checkpoint_problem(run / "epoch-0001")
    assert problem and problem.startswith("state.pt's sha256 is ") and "meta.json says" in problem
    assert latest_complete_checkpoint(run) == (run / "epoch-0000", 0)


def test_other_incomplete_checkpoints(tmp_path, capsys):
    run = _run_folder(tmp_path, 3)
    (run / "epoch-0002" / "meta.json").write_text('{"epoch": 2, "loop": ')  # cut short
    (run / "epoch-0001" / "state.pt").unlink()
    assert checkpoint_problem(run / "epoch-0002") == "meta.json is not valid JSON"
    assert checkpoint_problem(run / "epoch-0001") == "no state.pt"
    (run / "epoch-0000" / "state.pt").write_bytes(b"")
    capsys.readouterr()
    assert latest_complete_checkpoint(run) is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.endswith(f"; no complete checkpoint is left in {run}") for line in err)
    assert err[2].startswith("warning: checkpoint epoch 1 (epoch-0000) is incomplete (state.pt is 0 bytes, ")
    assert latest_complete_checkpoint(tmp_path / "no-such-run") is None
    assert latest_complete_checkpoint(tmp_path) is None  # a folder without epoch-NNNN folders: no checkpoint


def test_a_checkpoint_from_before_the_record_is_taken_on_its_state_file(tmp_path):
    ckpt = _run_folder(tmp_path, 1) / "epoch-0000"
    meta = read_meta(ckpt)
    del meta["state_file"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    assert checkpoint_problem(ckpt) is None
    (ckpt / "state.pt").unlink()
    assert checkpoint_problem(ckpt) == "no state.pt"


def test_the_epochs_are_ordered_by_number_not_by_name(tmp_path):
    run = _run_folder(tmp_path, 1)
    shutil.copytree(run / "epoch-0000", run / "epoch-10000")  # a run past 9999 epochs: five digits
    meta = read_meta(run / "epoch-10000")
    (run / "epoch-10000" / "meta.json").write_text(json.dumps({**meta, "epoch": 10000}))
    shutil.copytree(run / "epoch-0000", run / "epoch-0999")
    assert latest_complete_checkpoint(run) == (run / "epoch-10000", 10000)


def test_checkpoints_on_object_storage(s3, tmp_path, capsys):
    """The same checks on a bucket (the tests' S3 server): the folder comes back as a Location."""
    run = _run_folder(tmp_path, 2, numel=1000)
    bucket = s3.bucket("ar-checkpoints")
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        body = path.read_bytes()
        if path == run / "epoch-0001" / "state.pt":
            body = body[:1000]  # an upload cut short
        s3.client.put_object(Bucket="ar-checkpoints", Key=f"run/{path.relative_to(run)}", Body=body)
    found = latest_complete_checkpoint(f"{bucket}/run")
    assert found is not None and isinstance(found[0], Location) and found[1] == 0
    assert found[0].uri == f"{bucket}/run/epoch-0000" and checkpoint_problem(found[0]) is None
    assert "checkpoint epoch 2 (epoch-0001) is incomplete (state.pt is 1000 bytes" in capsys.readouterr().err


def test_an_unreadable_checkpoint_is_one_line_not_an_exception(tmp_path):
    ckpt = _run_folder(tmp_path, 1) / "epoch-0000"
    (ckpt / "meta.json").unlink()
    (ckpt / "meta.json").mkdir()  # root reads any file; nobody reads a folder as one
    problem = checkpoint_problem(ckpt)
    assert problem.startswith("unreadable: ") and "\n" not in problem
