"""A training checkpoint's round trip through a local folder (no Ray): the tensors, the loop state
and meta.json come back as they were saved."""

import json

import pytest
import torch
from torch import nn

from alchemetric_ray.data.manifest import Manifest
from alchemetric_ray.hardware.precision import OptimizerStep, Precision, adamw, resolve_precision
from alchemetric_ray.train.checkpoint import (
    CheckpointError,
    CheckpointMeta,
    LoopState,
    Trainables,
    load_state,
    read_meta,
    save_checkpoint,
)

# the keys of meta.json that the export, a resumed run and the sweep read
META_KEYS = {"epoch", "config", "metrics", "device", "precision", "plan", "world_size", "environment", "manifest",
             "loop"}


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
    precision = (resolve_precision("fp32", torch.device("cpu")) if mode == "fp32" else
                 Precision("fp16", "cpu", torch.float16, True, False, "test: the CUDA fp16 recipe on the CPU"))

    def trainables(fused: bool) -> Trainables:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
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
        assert int(state["step"]) == 6 and state["step"].device == (p.device if loaded_fused else torch.device("cpu"))
        assert torch.isfinite(state["exp_avg"]).all()
