"""Operator coverage: the aten operators one step uses (forward, the run's loss, backward, the loop's
AdamW step), recorded on the CPU with a ``TorchDispatchMode``, then probed on the target device in
a fresh subprocess where ``PYTORCH_ENABLE_MPS_FALLBACK=0`` is set before torch loads; the probe
runs the same step under a dispatch mode that catches each unsupported operator, lists it, and
finishes that one call in float32 on the CPU, so every gap is listed instead of only the first."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from alchemetric_ray.checks.step import RunShape, _on, _step, first_line, make_batch, make_model
from alchemetric_ray.config import ModelConfig
from alchemetric_ray.hardware import OptimizerStep, Precision, adamw, resolve_device, resolve_precision
from alchemetric_ray.hardware.device import reference_device
from alchemetric_ray.hardware.inventory import MPS_FALLBACK_VAR
from alchemetric_ray.models import model_spec
from alchemetric_ray.training.losses import make_loss

LOW_PRECISION = (torch.float16, torch.bfloat16)


def _op_name(func) -> str:
    return str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)


def finish_on_reference(func, args: tuple, kwargs: dict):
    """Run ``func`` in float32 on the CPU and hand its results back as the call would have made them.

    Why float32: the CPU lacks half-precision kernels too (``linalg_eigh``, ``cholesky`` in bfloat16),
    so an operator missing on a device in half precision would fail again on the CPU.  Half and
    bfloat16 tensor arguments are cast to float32, floating outputs cast back to the dtype the
    original arguments promote to and moved back to their device; an argument the operator writes
    (an in-place update, an optimizer's ``_foreach_*_``) gets the result copied into it."""
    ref = reference_device()
    leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    home = leaves[0].device if leaves else ref
    floats = [t.dtype for t in leaves if t.is_floating_point()]
    out_dtype = functools.reduce(torch.promote_types, floats) if set(floats) & set(LOW_PRECISION) else None

    def lift(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.to(ref, torch.float32 if t.dtype in LOW_PRECISION else t.dtype)

    new_args, new_kwargs = tree_map(lift, args), tree_map(lift, kwargs)
    out = func(*new_args, **new_kwargs)
    written: list[tuple[torch.Tensor, torch.Tensor]] = []  # (the lifted tensor, the caller's)
    schema = getattr(func, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else []):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        old, new = (args[i], new_args[i]) if i < len(args) else (kwargs.get(arg.name), new_kwargs.get(arg.name))
        for o, n in zip(tree_leaves(old), tree_leaves(new)):
            if isinstance(o, torch.Tensor) and n is not o:
                o.copy_(n)
                written.append((n, o))

    def back(t):
        if not isinstance(t, torch.Tensor):
            return t
        for lifted, caller in written:
            if t is lifted:  # an in-place operator returns the tensor it wrote: the caller's
                return caller
        return t.to(home, out_dtype if out_dtype is not None and t.is_floating_point() else t.dtype)

    return tree_map(back, out)


class _Prober(TorchDispatchMode):
    """Run every op where its tensors are; one that has no kernel there is listed (with its error's
    first line) and finished in float32 on the CPU (:func:`finish_on_reference`), so that the step
    goes on and every gap of the step is listed, not only the first.  Every op's name is recorded."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()
        self.unsupported: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        self.ops.add(name)
        try:
            return func(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise  # a full device is no missing kernel
        except (NotImplementedError, RuntimeError) as exc:
            try:
                out = finish_on_reference(func, args, kwargs)
            except Exception:
                raise exc from None  # fails in float32 on the CPU too: the call itself is wrong
            self.unsupported.setdefault(name, first_line(exc))
            return out


def record_ops(shape: RunShape, batch: int | None = None) -> list[str]:
    """The aten operators one forward + loss + backward + AdamW step uses, recorded on the CPU (an
    operator the CPU lacks is finished in float32 there, so that the rest of the step is recorded)."""
    model = make_model(shape)
    step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-3), resolve_precision("fp32", reference_device()))
    data = _on(reference_device(), shape, make_batch(shape, batch or shape.batch))
    loss_fn = make_loss(shape.loss, None, reference_device())
    rec = _Prober()
    with rec:
        _step(model, data, resolve_precision("fp32", reference_device()), step_fn, loss_fn)
    return sorted(rec.ops)


def probe_in_process(shape: dict, device: str, mode: str, tf32: bool = False) -> dict:
    """Run in the fresh subprocess: one step of the run on ``device`` in precision ``mode`` under the prober."""
    run = RunShape.from_json(shape)
    dev = resolve_device(device, source="the doctor").device
    prec = resolve_precision(mode, dev, model=model_spec(run.model), tf32=tf32)  # the parent's decision, made again
    model = make_model(run).to(dev)
    step_fn = OptimizerStep(adamw(model.parameters(), lr=1e-3), prec)
    loss_fn = make_loss(run.loss, None, dev)
    host = make_batch(run, run.batch)
    prober = _Prober()
    error = None
    try:
        with prober:
            _step(model, _on(dev, run, host), prec, step_fn, loss_fn)
    except Exception as exc:  # something the prober could not finish on the CPU either
        error = f"{type(exc).__name__}: {first_line(exc)}"
    return {"unsupported": prober.unsupported, "error": error}


def module_folder(model_cfg: ModelConfig) -> str | None:
    """The folder ``model.module`` is imported from (None: no module, or nowhere on disk).  This
    process may see it through its own launcher (pytest's rootdir, a notebook's working folder); the
    probe's fresh process sees it only through ``PYTHONPATH``."""
    if not model_cfg.module:
        return None
    spec = importlib.util.find_spec(model_cfg.module.split(".")[0])
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: the folder that holds it
        return str(Path(next(iter(spec.submodule_search_locations))).parent)
    return str(Path(spec.origin).parent) if spec.has_location and spec.origin else None


def op_coverage(shape: RunShape, device: torch.device, precision: Precision, timeout: int = 300) -> dict:
    """Probe the run's operators on ``device`` in a fresh process with fallback disabled."""
    ops = record_ops(shape)
    env = {**os.environ, MPS_FALLBACK_VAR: "0"}
    folder = module_folder(shape.model)
    if folder:
        env["PYTHONPATH"] = os.pathsep.join([folder] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    code = ("import json,sys; from alchemetric_ray.checks.coverage import probe_in_process; a=json.loads(sys.argv[1]); "
            "print('DOCTOR:'+json.dumps(probe_in_process(a['s'], a['d'], a['p'], a['t'])))")
    arg = json.dumps({"s": shape.to_json(), "d": str(device), "p": precision.mode, "t": precision.tf32})
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("DOCTOR:")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
        probe = {"unsupported": {}, "error": f"probe process failed: {tail}"}
    else:
        probe = json.loads(lines[-1][len("DOCTOR:"):])
    return {"ops": ops, "n_ops": len(ops), "rows": shape.batch, "unsupported": probe["unsupported"],
            "error": probe["error"], "fallback_env": f"{MPS_FALLBACK_VAR}=0",
            "seconds": round(time.monotonic() - started, 2),
            "passed": not probe["unsupported"] and probe["error"] is None}

