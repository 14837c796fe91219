"""Host syncs of the training step, per precision and for the IC loss: what the loop's step waits on.

    .venv/bin/python bench/syncs.py                  # the CPU count, in-process, seconds (no Ray)
    .venv/bin/python bench/syncs.py --steps 100 --check-every 10
    python3 bench/syncs.py --device cuda             # torch's own detector on a GPU (bench/gpu.py runs it)

A sync is the host waiting for the device: ``.item()``/``float()``/``bool()`` of a device tensor
(``aten._local_scalar_dense``), a copy to the host (``Tensor.tolist``/``numpy``/``cpu``), and the
operators whose output size depends on the data (``nonzero``, ``unique``, ``bincount``,
``masked_select``, indexing with a boolean mask).  On a CPU nothing waits, so this counts those
operations, which on a GPU would wait: a ``TorchDispatchMode`` sees the aten operators and a
``TorchFunctionMode`` the host copies (a CPU tensor's ``tolist`` runs no aten operator).  What it
leaves out: an optimizer's step counters (plain AdamW reads its 0-dim CPU ``step`` tensors with
``.item()``, on a GPU too, where they stay in host memory: no wait on the device).

Each run is one epoch of the loop's step (``training/loop.py``'s ``_train_epoch``: forward under
autocast, the loss in float32, the product's ``OptimizerStep`` with the loop's AdamW, the epoch's
loss summed on the device) and the epoch's closing check, which reads everything in one transfer.
On CUDA (``--device cuda``, and ``bench/gpu.py``) the same runs are counted by torch's own
detector (``torch.cuda.set_sync_debug_mode("warn")``, every synchronizing call a warning):
:func:`count_cuda`.  Their batches are already on the GPU; one more run takes its batches through
the loop's pinned staging (``hardware/staging.py``), whose wait on a CUDA event before it reuses a
staging buffer is deliberate (the copy out of it must have finished), and is shown apart.

BEFORE is what the same runs cost before the sync-free step (commit 87c6c2b, counted with this
file's rules on this CPU): per step ``torch.isfinite(loss)`` read with ``not`` and
``float(clip_grad_norm_(...))``; under fp16 also ``GradScaler.get_scale()`` twice and the plain
AdamW's found-inf read inside ``GradScaler.step``; the IC loss's ``unique``, ``int(code.max())``,
``bincount``, ``bool(valid.any())`` and three boolean-mask selections; and the epoch mean's
``float(...)``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import machine, write_result
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from alchemetric_ray.errors import PrecisionError
from alchemetric_ray.hardware import OptimizerStep, Precision, adamw, resolve_device, resolve_precision
from alchemetric_ray.hardware.staging import PINNED, BatchSource, DataPath
from alchemetric_ray.training.losses import DateGroups, make_loss

KINDS = ("fp32", "bf16", "fp16", "ic")  # ic: the IC loss, under fp32
SYNC_OPS = {"_local_scalar_dense", "nonzero", "_unique", "_unique2", "unique_dim", "unique_consecutive",
            "unique_dim_consecutive", "bincount", "masked_select"}
HOST_COPIES = {"tolist", "numpy", "cpu"}
# Syncs per 50 steps and one epoch-end read before the sync-free step (commit 87c6c2b), by operator.
BEFORE = {
    "fp32": {"_local_scalar_dense": 101},
    "bf16": {"_local_scalar_dense": 101},
    "fp16": {"_local_scalar_dense": 201},
    "ic": {"_local_scalar_dense": 201, "_unique2": 50, "bincount": 50, "index (bool mask)": 150},
}
ROWS, FEATURES, DATE_ROWS = 256, 16, 16  # a batch: 16 dates of 16 stocks


class SyncCount:
    """Counts the operations that wait on the device (module docstring) while it is entered, by name;
    ``optimizer``'s step counters are left out."""

    def __init__(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.optimizer = optimizer
        self.by_op: Counter[str] = Counter()
        self.events: list[str] = []  # in order, for a test to see where they happened
        count = self

        class _Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                           for i in (args[1] if len(args) > 1 else ()) or ()):
                    count._hit("index (bool mask)")
                elif name in SYNC_OPS and not (name == "_local_scalar_dense" and count._is_step_counter(args[0])):
                    count._hit(name)
                return func(*args, **(kwargs or {}))

        class _Copies(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in HOST_COPIES:
                    count._hit(f"Tensor.{func.__name__}")
                return func(*args, **(kwargs or {}))

        self._modes = (_Ops(), _Copies())

    def _is_step_counter(self, t: torch.Tensor) -> bool:
        states = self.optimizer.state.values() if self.optimizer is not None else ()
        return any(s.get("step") is t for s in states)

    def _hit(self, name: str) -> None:
        self.by_op[name] += 1
        self.events.append(name)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __enter__(self) -> SyncCount:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def precision_for(kind: str, device: torch.device) -> Precision:
    """The kind's precision on ``device``: the policy's, except off CUDA, where the policy refuses
    fp16 (and bf16 is explicit): the CUDA recipes are run on the CPU as they are."""
    mode = "fp32" if kind == "ic" else kind
    if device.type == "cuda" or mode == "fp32":
        return resolve_precision(mode, device)
    dtype = torch.float16 if mode == "fp16" else torch.bfloat16
    return Precision(mode, device.type, dtype, mode == "fp16", False, f"bench: the CUDA {mode} recipe on {device}")


class StepLoop:
    """One epoch of the loop's step on synthetic data: model, the loop's AdamW, ``OptimizerStep``, loss."""

    def __init__(self, kind: str, device: torch.device, *, check_every: int, seed: int = 0,
                 staged: bool = False) -> None:
        torch.manual_seed(seed)
        self.kind, self.device = kind, device
        self.precision = precision_for(kind, device)
        outputs = 1 if kind == "ic" else 2
        self.model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, outputs)).to(device)
        self.optimizer = adamw(self.model.parameters(), lr=1e-3, weight_decay=1e-4)
        self.step_fn = OptimizerStep(self.optimizer, self.precision, grad_clip=1.0, check_every=check_every)
        self.loss_fn = make_loss("ic" if kind == "ic" else "ce")
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(ROWS, FEATURES, generator=generator).to(device)
        signal = self.x[:, 0] + 0.5 * torch.randn(ROWS, generator=generator).to(device)
        self.y = signal if kind == "ic" else (signal > 0).long()
        self.date_rows = [DATE_ROWS] * (ROWS // DATE_ROWS)  # what the loop's date batches hand the loss
        # staged: each batch gathered into pinned host memory and copied, as the loop's PINNED path does
        self.source = (BatchSource((self.x.cpu(), self.y.cpu()), device, DataPath(PINNED, "bench"), max_rows=ROWS)
                       if staged else None)
        self.order = torch.arange(ROWS)

    def epoch(self, steps: int) -> dict[str, float]:
        """``steps`` steps and the epoch's closing check: the mean loss of the steps taken, skipped steps."""
        loss_sum = torch.zeros((), device=self.device)
        taken = torch.zeros((), device=self.device)
        for step in range(steps):
            x, y = self.source.take(self.order) if self.source is not None else (self.x, self.y)
            with self.precision.autocast():
                out = self.model(x)
            dates = DateGroups.from_sizes(self.date_rows, self.device) if self.kind == "ic" else None
            loss = self.loss_fn(out, y, dates)
            outcome = self.step_fn(loss, epoch=1, step=step)
            kept = ~outcome.skipped
            loss_sum += torch.where(kept, loss.detach().float(), 0.0)
            taken += kept
        skipped = self.step_fn.skipped_steps()
        total, count, skipped = self.step_fn.check(loss_sum, taken, skipped if skipped is not None else taken * 0)
        return {"loss": total / max(count, 1), "skipped": skipped}


def count_cpu(kind: str, steps: int, check_every: int) -> SyncCount:
    """The syncs of one epoch of ``steps`` steps on the CPU, counted as the module docstring says."""
    loop = StepLoop(kind, torch.device("cpu"), check_every=check_every)
    with SyncCount(loop.optimizer) as count:
        loop.epoch(steps)
    return count


def count_cuda(kind: str, device: torch.device, steps: int, check_every: int, staged: bool = False) -> int:
    """The synchronizing calls torch's detector reports in one epoch of ``steps`` steps on ``device``
    (after one warm-up epoch: first-use allocations and lazy initialisation are not the step's)."""
    loop = StepLoop(kind, device, check_every=check_every, staged=staged)
    loop.epoch(2)
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            loop.epoch(steps)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def reads_allowed(steps: int, check_every: int) -> int:
    """What the sync-free step may cost: one read per check (after every ``check_every`` steps and at
    the epoch's end, which a check that just ran makes unnecessary only in count, not in kind)."""
    return steps // check_every + 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu: the in-process count | auto | cuda | cuda:N: torch's "
                                                        "detector where the device is CUDA")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--check-every", type=int, default=25, help="train.check_every (the default: 25)")
    parser.add_argument("--out", help="also write the counts to OUT/syncs-<cuda|cpu>.json")
    args = parser.parse_args(argv)
    device = resolve_device(args.device).device
    cuda = device.type == "cuda"
    allowed = reads_allowed(args.steps, args.check_every)
    if cuda:
        print(f"host syncs in one epoch of {args.steps} steps + its closing read on {device} "
              f"({torch.cuda.get_device_name(device)}), torch's detector (set_sync_debug_mode('warn')), "
              f"train.check_every={args.check_every}; torch {torch.__version__}")
    else:
        print(f"no CUDA (device {device}): torch's sync detector is CUDA-only; counted on the CPU in-process "
              "with this file's rules instead")
        torch.set_num_threads(1)
        print(f"host syncs in one epoch of {args.steps} steps + its closing read, on the CPU in-process "
              f"(train.check_every={args.check_every}; torch {torch.__version__})")
    print(f"{'':6s} {'before':>7s} {'after':>6s}  after, by operation")
    rows, ok = [], True
    for kind in KINDS:
        try:
            count = count_cuda(kind, device, args.steps, args.check_every) if cuda else count_cpu(
                kind, args.steps, args.check_every)
        except PrecisionError as exc:
            print(f"{kind:6s} refused: {exc}")
            rows.append({"kind": kind, "refused": str(exc)})
            continue
        total = count if cuda else count.total
        before = sum(BEFORE[kind].values()) if args.steps == 50 else None
        shown = "synchronizing calls" if cuda else "  ".join(f"{k} {v}" for k, v in sorted(count.by_op.items())) or "-"
        print(f"{kind:6s} {before if before is not None else 'n/a':>7} {total:>6d}  {shown}")
        rows.append({"kind": kind, "syncs": total, "before": before, "allowed": allowed,
                     **({} if cuda else {"by_op": dict(count.by_op)})})
        ok = ok and total <= allowed
    if cuda:
        staged = count_cuda("fp32", device, args.steps, args.check_every, staged=True)
        print(f"fp32 with its batches through pinned staging: {staged} synchronizing calls; staging's wait on a CUDA "
              "event before reusing a buffer is deliberate (hardware/staging.py), if the detector reports it")
        rows.append({"kind": "fp32+pinned staging", "syncs": staged, "allowed": allowed + args.steps})
    print("before (87c6c2b, counted on the CPU), by operation: " + "; ".join(
        f"{k} " + ", ".join(f"{op} {n}" for op, n in v.items()) for k, v in BEFORE.items()))
    print(f"allowed: one read per check ({args.steps} // {args.check_every} + the epoch's end = {allowed})"
          f" -> {'within' if ok else 'OVER'}")
    if args.out:
        write_result(args.out, f"syncs-{'cuda' if cuda else 'cpu'}",
                     {"machine": machine(torch=torch.__version__, device=str(device)), "steps": args.steps,
                      "check_every": args.check_every, "rows": rows})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
