"""Check a Mac's GPU (MPS) the way a run uses it, and write the one file to send back.

    make install && .venv/bin/python scripts/mac_check.py        # on an Apple-silicon Mac
    .venv/bin/python scripts/mac_check.py --device cpu            # the same three steps on any machine

Three steps, each printed as one ``PASS`` or ``FAIL`` line:

1. **known bugs**: torch, macOS, the chip and its GPU family, and the entries of the known-bug table
   (``alchemetric_ray/hardware/known_bugs.yaml``) that apply to this backend (``alchemetric-ray env``).
2. **doctor**: ``alchemetric-ray doctor`` on the device for the configured model at the run's own batch
   shape: operator coverage (no silent CPU fallback), parity with the CPU, mixed precision, and the
   table's trigger-shape probes after dirtying the allocator; passes when the doctor recommends a
   target on this device.
3. **train**: a one-worker local-mode run (``train.local_mode=true``) of ``train.epochs`` epochs (2) on the
   packaged prices, on the device, with the shadow check at every ``train.shadow_every`` steps (25)
   against a float32 CPU copy; passes when it finishes with no divergence (a divergence stops the run
   with one line naming the epoch, step and parameter).

Then it writes ``mac-check-<date>.json`` (``--out``: a folder, default the current one): the three
steps' results, the machine, the doctor's full report and the run's summary.  Send that file back.
Exit status 0 only when every step passed.  Overrides (``section.key=value``) go to both the doctor
and the run, e.g. ``model.name=transformer train.batch_size=2048``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alchemetric_ray.config import load_config
from alchemetric_ray.errors import UserError

DEFAULTS = ("train.epochs=2", "train.shadow=true", "train.shadow_every=25", "train.local_mode=true",
            "scaling.workers=1")


def _step(name: str, passed: bool, line: str, **detail) -> dict:
    print(f"{'PASS' if passed else 'FAIL'}  {name:<10} {line}", flush=True)
    return {"step": name, "passed": passed, "line": line, **detail}


def known_bugs_step(device: str) -> dict:
    """The table's entries for this machine's backends; fails only where the device is not here."""
    import torch

    from alchemetric_ray.hardware.device import device_kind_available
    from alchemetric_ray.hardware.known_bugs import Backend
    from alchemetric_ray.hardware.report import known_bugs_here

    kind = torch.device(device).type
    if not device_kind_available(kind):
        return _step("known bugs", False, f"no {kind} device here (torch {torch.__version__}, {platform.platform()})")
    backend = str(Backend.of(device))
    here = known_bugs_here()
    mine = [row for row in here["apply"] if row["backend"] == backend]
    listed = ", ".join(f"{row['id']} ({row['checked']})" for row in mine) or "none"
    return _step("known bugs", True, f"{backend}: {len(mine)} of the table's {here['entries']} entries apply: {listed}",
                 backend=backend, entries=mine)


def doctor_step(device: str, overrides: list[str], storage: str) -> dict:
    import torch

    from alchemetric_ray.checks.run import run_doctor

    cfg = load_config(None, [*overrides, f"device.name={device}", f"storage.path={storage}"])
    report = run_doctor(cfg, device=device, quick=True)
    kind = torch.device(device).type
    mine = [t for t in report.targets if t.device_type == kind]
    refused = [f"{t.device} {t.mode}" for t in mine if t.refused is not None]
    blocked = [f"{t.device} {t.mode}: {'; '.join(t.blockers)}" for t in mine if not t.passed and t.refused is None]
    passed_here = [f"{t.device} {t.mode}" for t in mine if t.passed]
    passed = bool(passed_here)
    best = report.verdict.recommended
    line = (f"passed on {', '.join(passed_here)}" if passed else "no target on this device passed") \
        + (f"; blocked: {' | '.join(blocked)}" if blocked else "") \
        + (f"; refused by the precision policy: {', '.join(refused)}" if refused else "") \
        + f"; recommended: {best.device + ' ' + best.precision if best else 'none'}" \
        + f" (run shape {report.run.describe()})"
    return _step("doctor", passed, line, report=report.as_dict())


def train_step(device: str, overrides: list[str], storage: str) -> dict:
    from alchemetric_ray.training.trainer import run_training

    cfg = load_config(None, [*DEFAULTS, *overrides, f"device.name={device}", f"storage.path={storage}",
                             "storage.name=mac-check"])
    started = time.monotonic()
    try:
        outcome = run_training(cfg, export=False, progress=False)
    except UserError as exc:  # a shadow divergence, a known-bug refusal: its one line
        return _step("train", False, str(exc), seconds=round(time.monotonic() - started, 1))
    summary = outcome.summary
    shadow = summary.shadow or {}
    line = (f"{summary.epochs_run} epoch(s) on {device} in {outcome.seconds:.0f}s; shadow check: "
            f"{shadow.get('checks', 0)} checks, largest whole-gradient error {shadow.get('max_error', 0):.2g}, "
            f"largest on one parameter {shadow.get('max_parameter_error', 0):.2g} "
            f"({shadow.get('max_error_param') or '-'})")
    passed = bool(shadow.get("checks"))
    if not passed:
        line += "; no shadow check ran"
    return _step("train", passed, line, summary=summary.as_dict())


def machine() -> dict:
    import ray
    import torch

    from alchemetric_ray.hardware.device import mps_available, mps_built
    from alchemetric_ray.hardware.inventory import cpu_model, macos_version

    mac = macos_version()
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "ray": ray.__version__, "chip": cpu_model(), "macos": ".".join(map(str, mac)) if mac else None,
            "mps": {"built": mps_built(), "available": mps_available()}}


def write_atomic(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mac_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="mps", help="the device to check (default: mps)")
    parser.add_argument("--out", default=".", help="folder for mac-check-<date>.json (default: here)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_args(argv)
    try:
        load_config(None, [*DEFAULTS, *args.overrides, f"device.name={args.device}"])  # bad input: one line
    except UserError as exc:
        print(f"mac_check.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) / f"mac-check-{dt.date.today().isoformat()}.json"
    steps = [known_bugs_step(args.device)]
    if steps[0]["passed"]:
        with tempfile.TemporaryDirectory(prefix="mac-check-") as storage:
            for step in (doctor_step, train_step):
                try:
                    steps.append(step(args.device, args.overrides, storage))
                except UserError as exc:
                    steps.append(_step(step.__name__.removesuffix("_step"), False, str(exc)))
    ok = all(s["passed"] for s in steps)
    write_atomic(out, {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "device": args.device, "overrides": args.overrides, "passed": ok,
                       "machine": machine(), "steps": steps})
    print(f"{'every step passed' if ok else 'a step failed'}: send back {out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
