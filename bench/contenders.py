"""The table that decides the defaults (issue 42 item 6): the pooled walk-forward on the packaged
data for every feature set x deep model, with LightGBM and HistGradientBoosting beside them.

    .venv/bin/python bench/contenders.py                                   # the whole grid, full size
    .venv/bin/python bench/contenders.py --sets basic --models mlp --refit-every 252 --epochs 2
    .venv/bin/python bench/contenders.py --sets basic,alpha158 --models mlp,gru -- train.batch_size=1024

Every row trains the model once as `train` does, then runs `evaluate --walk-forward` on it (refit
every `signals.refit_every` trading days, expanding window, every block pooled and scored once). One
target for every row: `features.label=cs_rank` unless `--label` says otherwise (cs_attention needs a
regression target; the others use it too so that the rows compare like with like). LightGBM and
HistGradientBoosting are refit by the evaluation on the same rows as the deep model in every refit,
so they come with each run: their rows are reported once per feature set (from the MLP's run where
it ran) and checked to be identical across that set's runs. The paired daily difference to LightGBM
is computed from the two pooled daily rank-IC series with
:func:`~alchemetric_ray.signals.metrics.ic_difference`.

Each (set, model) runs in a child process, so a crash or an out-of-memory kill costs one row (its
last error line is recorded as the row's failure); each row is printed when done and every result so
far is written to bench/results/contenders.json (atomically) after each row.  ``--`` passes any
further config override to every row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_result

SETS = ("basic", "alpha158", "alpha360")
MODELS = ("mlp", "gru", "cs_attention")
LIGHTGBM, HGB, DEEP = "lightgbm", "hist gradient boosting", "deep model"
RESULTS = Path(__file__).resolve().parent / "results"


class UsageError(Exception):
    """A bad option: one line on stderr, exit status 2."""


def _choices(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    picked = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in picked if t not in allowed]
    if bad or not picked:
        raise UsageError(f"--{what}: {', '.join(bad) or 'nothing given'} is not one of {', '.join(allowed)}")
    return list(dict.fromkeys(picked))


def _positive(text: str, what: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--{what}: expected an integer, got {text!r}") from None
    if value < least:
        raise UsageError(f"--{what}: must be at least {least}, got {value}")
    return value


def overrides(feature_set: str, model: str, args: argparse.Namespace) -> list[str]:
    """The config of one row: the set, the model, the one target, the size knobs, then ``--`` extras."""
    out = [f"features.set={feature_set}", f"model.name={model}", f"features.label={args.label}"]
    if args.refit_every is not None:
        out.append(f"signals.refit_every={args.refit_every}")
    if args.epochs is not None:
        out.append(f"train.epochs={args.epochs}")
    return [*out, *args.extra]


def _ic(stats: Any) -> dict[str, Any]:
    return {"mean": stats.mean, "ci_low": stats.ci_low, "ci_high": stats.ci_high, "n_days": stats.n_days}


def _digest(stats: Any) -> str:
    """A fingerprint of a daily rank-IC series (dates and values), to check two runs' baselines agree."""
    daily = stats.daily.sort_index()
    text = json.dumps([[str(d)[:10], round(float(v), 12)] for d, v in daily.items()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_one(feature_set: str, model: str, argv: list[str], out: Path) -> None:
    """Child: train, `evaluate --walk-forward`, write the row's figures to ``out``."""
    from alchemetric_ray.config import load_config
    from alchemetric_ray.signals import metrics as sm
    from alchemetric_ray.signals.evaluate import evaluate
    from alchemetric_ray.signals.walk_forward import PooledWalkForward
    from alchemetric_ray.training.trainer import run_training

    with tempfile.TemporaryDirectory(prefix="bench-contenders-") as work:
        cfg = load_config(None, [*argv, f"storage.path={work}/results", f"storage.models_dir={work}/models",
                                 "storage.name=bench-contenders"])
        started = time.monotonic()
        model_dir = run_training(cfg, progress=False).model_dir
        if model_dir is None:
            raise RuntimeError("training produced no checkpoint")
        train_s = time.monotonic() - started
        started = time.monotonic()
        result = evaluate(model_dir, None, Path(work) / "eval", cfg, pooled=True)
        evaluate_s = time.monotonic() - started
    wf = result.walk_forward
    if not isinstance(wf, PooledWalkForward):
        raise RuntimeError("evaluate returned no pooled walk-forward")
    pool = wf.pooled
    rows = {r.name: r for r in pool.rows}
    deep, lgb, hgb = rows[DEEP], rows.get(LIGHTGBM), rows.get(HGB)
    folds = [f.as_dict() for f in wf.folds]
    phase = {p: sum(f["seconds"][p] for f in folds) for p in ("train", "stage", "predict", "baselines")}
    record: dict[str, Any] = {
        "set": feature_set, "model": model, "overrides": argv, "status": "ok",
        "train_s": round(train_s, 1), "evaluate_s": round(evaluate_s, 1),
        "refits": wf.refits, "refit_every": wf.refit_every,
        "segment": pool.segment.as_dict(), "tickers": pool.tickers,
        "refit_s": {k: round(v / len(folds), 2) for k, v in phase.items()},
        "refit_total_s": round(sum(phase.values()) / len(folds), 2),
        "deep": {**_ic(deep.rank_ic), "digest": _digest(deep.rank_ic)},
        "best_baseline": pool.best_baseline, "verdict": pool.verdict.line,
        "baseline_fits": pool.baseline_fits,
    }
    for key, row in (("lightgbm", lgb), ("hgb", hgb)):
        if row is not None:
            record[key] = {**_ic(row.rank_ic), "digest": _digest(row.rank_ic)}
    if lgb is not None:
        for key, row in (("deep", deep), ("hgb", hgb)):
            if row is not None:
                mean, lo, hi, n = sm.ic_difference(row.rank_ic, lgb.rank_ic)
                record[key]["vs_lightgbm"] = {"mean": mean, "ci_low": lo, "ci_high": hi, "n_days": n}
    out.write_text(json.dumps(record, default=str))


def _failure(stderr: str, rc: int) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):  # the exception's own line, where the child raised one
        if ln.split(":", 1)[0].endswith(("Error", "Exception", "Killed")):
            return ln[:300]
    return (lines[-1][:300] if lines else "") + f" (exit status {rc})"


def _fmt(ic: dict[str, Any] | None) -> str:
    if not ic:
        return "-"
    return f"{ic['mean']:+.4f} [{ic['ci_low']:+.4f}, {ic['ci_high']:+.4f}]"


def print_row(r: dict[str, Any]) -> None:
    head = f"{r['set']:<9} {r['model']:<13}"
    if r["status"] != "ok":
        print(f"{head} {'failed: ' if r['status'] == 'failed' else ''}{r['failure']} ({r['wall_s']:.0f} s)", flush=True)
        return
    d = r["deep"]
    print(f"{head} rank IC {_fmt(d)} vs LightGBM {_fmt(d.get('vs_lightgbm'))}; refit {r['refit_total_s']:.1f} s "
          f"(train {r['refit_s']['train']:.1f} s) x {r['refits']}; LightGBM {_fmt(r.get('lightgbm'))}, "
          f"HGB {_fmt(r.get('hgb'))}, HGB vs LightGBM {_fmt(r.get('hgb', {}).get('vs_lightgbm'))}; "
          f"baselines phase {r['refit_s']['baselines']:.1f} s a refit; {r['wall_s']:.0f} s in all", flush=True)


def baseline_checks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per feature set: the LightGBM/HGB rows reported (the MLP's run's, else the first that ran) and
    whether every run of that set pooled the same daily series for them."""
    out: dict[str, Any] = {}
    for s in dict.fromkeys(r["set"] for r in rows):
        ok = [r for r in rows if r["set"] == s and r["status"] == "ok"]
        if not ok:
            continue
        src = next((r for r in ok if r["model"] == "mlp"), ok[0])
        same = {k: sorted({r[k]["digest"] for r in ok if k in r}) for k in ("lightgbm", "hgb")}
        out[s] = {"from": src["model"], "lightgbm": src.get("lightgbm"), "hgb": src.get("hgb"),
                  "identical_across_runs": {k: len(v) == 1 for k, v in same.items()},
                  "runs": [r["model"] for r in ok]}
    return out


def run_row(feature_set: str, model: str, argv: list[str], args: argparse.Namespace,
            limit: int | None) -> dict[str, Any]:
    """One row in a child process (``--one``), stopped after ``limit`` seconds: its record, or why not."""
    clock = time.monotonic()
    base = {"set": feature_set, "model": model, "overrides": overrides(feature_set, model, args)}
    with tempfile.TemporaryDirectory(prefix="bench-contenders-row-") as tmp:
        row_file = Path(tmp) / "row.json"
        child = [sys.executable, str(Path(__file__).resolve()), *argv, "--one", feature_set, model, str(row_file)]
        if args.extra:
            child += ["--", *args.extra]
        try:
            proc = subprocess.run(child, stderr=subprocess.PIPE, text=True, timeout=limit,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
        except subprocess.TimeoutExpired:
            return {**base, "status": "cut", "failure": f"cut: not finished within {limit} s (--row-timeout / "
                                                         f"--deadline)", "wall_s": round(time.monotonic() - clock, 1)}
        wall = round(time.monotonic() - clock, 1)
        if proc.returncode == 0 and row_file.exists():
            return {**json.loads(row_file.read_text()), "wall_s": wall}
        return {**base, "status": "failed", "failure": _failure(proc.stderr, proc.returncode), "wall_s": wall}


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--label", default="cs_rank",
                        help="features.label of every row (default cs_rank: cs_attention needs a regression target; "
                             "three_class, the config's default, confirms the default MLP's rows)")
    parser.add_argument("--refit-every", default=None,
                        help="signals.refit_every (trading days between refits; fewer refits = a shorter run)")
    parser.add_argument("--epochs", default=None, help="train.epochs of every fit (default: the config's)")
    parser.add_argument("--row-timeout", default=None,
                        help="seconds a row may run before it is stopped and recorded as cut (default: no limit)")
    parser.add_argument("--deadline", default=None,
                        help="HH:MM (UTC, today): a row still running then is stopped, later rows are not started; "
                             "both are recorded as cut")
    parser.add_argument("--out", default=str(RESULTS / "contenders.json"), help="the results file")
    parser.add_argument("--one", nargs=3, metavar=("SET", "MODEL", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.extra = extra
    try:
        sets = _choices(args.sets, SETS, "sets")
        models = _choices(args.models, MODELS, "models")
        if args.refit_every is not None:
            args.refit_every = _positive(args.refit_every, "refit-every", 2)
        if args.epochs is not None:
            args.epochs = _positive(args.epochs, "epochs", 1)
        if "cs_attention" in models and args.label not in ("cs_rank", "cs_zscore"):
            raise UsageError(f"--label: cs_attention needs a regression target, got {args.label}")
        if args.row_timeout is not None:
            args.row_timeout = _positive(args.row_timeout, "row-timeout", 1)
        deadline = None
        if args.deadline is not None:
            try:
                hh, mm = (int(x) for x in args.deadline.split(":"))
                deadline = datetime.now(timezone.utc).replace(hour=hh, minute=mm, second=0, microsecond=0)
            except ValueError:
                raise UsageError(f"--deadline: expected HH:MM (UTC), got {args.deadline!r}") from None
        if args.one:
            s, m, f = args.one
            run_one(_choices(s, SETS, "sets")[0], _choices(m, MODELS, "models")[0], overrides(s, m, args), Path(f))
            return 0
        from alchemetric_ray.config import load_config

        for m in models:
            for s in sets:
                load_config(None, overrides(s, m, args))  # a bad override: refused before any row runs
    except UsageError as exc:
        print(f"contenders.py: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a config the project refuses: its own one line
        print(f"contenders.py: {exc}".splitlines()[0], file=sys.stderr)
        return 2

    out = Path(args.out)
    started_at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join([".venv/bin/python", "bench/contenders.py", *sys.argv[1:]])
    rows: list[dict[str, Any]] = []
    print(f"contenders: sets {', '.join(sets)}; models {', '.join(models)}; target {args.label}; started {started_at}",
          flush=True)
    for m in models:  # in the order given: the cheap rows first, so that a cut run still has them
        for s in sets:
            limit = args.row_timeout
            if deadline is not None:
                left = int((deadline - datetime.now(timezone.utc)).total_seconds())
                limit = left if limit is None else min(limit, left)
            if limit is not None and limit <= 0:
                row = {"set": s, "model": m, "overrides": overrides(s, m, args), "status": "cut",
                       "failure": f"cut: not started before the deadline {args.deadline} UTC", "wall_s": 0.0}
            else:
                row = run_row(s, m, argv, args, limit)
            rows.append(row)
            print_row(row)
            write_result(out.parent, out.stem, {
                "benchmark": "contenders", "command": command, "started": started_at,
                "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "complete": len(rows) == len(sets) * len(models) and all(r["status"] == "ok" for r in rows),
                "machine": machine(), "sets": sets, "models": models, "target": args.label, "rows": rows,
                "baselines": baseline_checks(rows)})
    for s, b in baseline_checks(rows).items():
        print(f"{s}: LightGBM {_fmt(b['lightgbm'])}, HGB {_fmt(b['hgb'])} (from the {b['from']} run); identical "
              f"across {', '.join(b['runs'])}: {b['identical_across_runs']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
