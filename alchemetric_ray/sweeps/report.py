"""A static HTML report of one sweep: a trial table, PNG plots and the chosen trial's test score.

``write_sweep_report(out_dir, summary)`` writes ``out_dir/index.html`` with its PNG plots beside it,
from a ``SweepSummary`` (or its ``as_dict`` form, as ``sweep_summary.json`` holds it).
It needs no server: open the file in a browser.  The folder is built in a temporary folder beside
``out_dir`` and then renamed over it, so a reader sees the old report or the new one, never half.

Every piece of text in ``summary`` (sweep name, trial ids, config values, class names, paths) may
come from a user and is HTML-escaped; in plot labels, ``$`` is escaped so that matplotlib never
reads a user's string as mathtext.
"""

from __future__ import annotations

import html
import json
import math
import numbers
from pathlib import Path
from typing import Any, cast

from alchemetric_ray.outputs import staged_output
from alchemetric_ray.storage import Location, locate
from alchemetric_ray.sweeps.summary import SweepSummary, TrialRow

INDEX = "index.html"
LEARNING_PNG = "learning_curves.png"
TRAIN_LOSS_PNG = "train_loss.png"
HPARAMS_PNG = "hparams.png"
CONFUSION_PNG = "confusion_matrix.png"

_MISSING = object()
_LEGEND_MAX = 10          # above this many trials only the best trial gets a legend entry
_LABEL_MAX = 28           # plot labels (trial ids, categories) are cut to this many characters
_BEST_COLOR = "#d62728"
# tab10 without its red, which is the best trial's alone
_OTHER_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
_DPI = 100


# ----------------------------------------------------------------------------- small helpers

def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float | None:
    """``value`` as a float (NaN and inf kept), or None for missing and non-numeric values."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):  # int, float and numpy scalars
        return float(value)
    return None


def _finite(value: Any) -> float | None:
    v = _num(value)
    return v if v is not None and math.isfinite(v) else None


def _fmt_float(v: float, spec: str) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return format(v, spec)


def _fmt_value(value: Any, spec: str = ".6g", integral: bool = True) -> str:
    """A hyperparameter or other config value (or, with ``spec``, a metric) as short text."""
    if value is _MISSING or value is None:
        return "\u2013"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    v = _num(value)
    if v is not None:
        if integral and float(v).is_integer() and not isinstance(value, float):
            return str(int(v))
        return _fmt_float(v, spec)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


def _fmt_metric(value: Any) -> str:
    return _fmt_value(value, ".4f", integral=False)


def _plot_text(value: Any, limit: int = _LABEL_MAX) -> str:
    """A user's string made safe for a matplotlib label: shortened, ``$`` escaped (no mathtext)."""
    text = str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    # matplotlib reads a label as mathtext only with an even, non-zero count of unescaped "$";
    # escaping every "$" makes that count zero, and "\$" is drawn as a plain "$".
    return text.replace("$", r"\$")


def _hp_value(config: Any, key: str) -> Any:
    """``config[key]`` for a flat key like ``"train.lr"``, else the nested ``config["train"]["lr"]``."""
    if not isinstance(config, dict):
        return _MISSING
    if key in config:
        return config[key]
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _hp_names(summary: SweepSummary, trials: list[TrialRow]) -> list[str]:
    space = summary.space
    if isinstance(space, dict) and space:
        return [str(k) for k in space]
    names: list[str] = []  # no space given: every key the trials' configs hold, first seen first
    for t in trials:
        cfg = t.config
        if isinstance(cfg, dict):
            for k in cfg:
                if str(k) not in names:
                    names.append(str(k))
    return names


def _space_choices(summary: SweepSummary, name: str) -> list[Any]:
    """The listed values of a ``grid``/``choice`` hyperparameter (for category order), else []."""
    space = summary.space
    spec = space.get(name) if isinstance(space, dict) else None
    if isinstance(spec, dict):
        for kind in ("grid", "choice", "grid_search", "categorical", "values"):
            values = spec.get(kind)
            if isinstance(values, (list, tuple)):
                return list(values)
    return []


def _describe_space(spec: Any) -> str:
    if isinstance(spec, dict):
        return "; ".join(f"{k} {json.dumps(v, default=str)}" for k, v in spec.items())
    return json.dumps(spec, default=str)


def _history(trial: TrialRow) -> list[dict]:
    rows = trial.history
    if not isinstance(rows, list):
        return []
    return [r for r in rows if isinstance(r, dict)]


def _series(trial: TrialRow, key: str) -> tuple[list[float], list[float]]:
    """Epochs and values of ``key`` over a trial's history; missing values skipped, inf -> NaN."""
    xs: list[float] = []
    ys: list[float] = []
    for i, row in enumerate(_history(trial)):
        if key not in row:
            continue
        y = _num(row[key])
        if y is None:
            continue
        x = _num(row.get("epoch"))
        xs.append(float(i) if x is None or not math.isfinite(x) else x)
        ys.append(y if math.isfinite(y) else math.nan)
    return xs, ys


def _rank_key(trial: TrialRow, mode: str) -> tuple[int, float]:
    v = _finite(trial.best_value)
    if v is None:
        return (1, 0.0)
    return (0, -v if mode == "max" else v)


# ----------------------------------------------------------------------------- plots

def _new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> None:
    fig.savefig(path, format="png", dpi=_DPI, facecolor="white")


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555")


def _curves_plot(path: Path, trials: list[TrialRow], best_id: Any, key: str, title: str, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    fig = _new_figure(8, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    many = len(trials) > _LEGEND_MAX
    drawn = 0
    for i, t in enumerate(trials):
        xs, ys = _series(t, key)
        if not xs:
            continue
        is_best = best_id is not None and t.trial_id == best_id
        label = _plot_text(t.trial_id or f"#{i}")  # a hand-written summary may lack an id
        if is_best:
            label += " (best)"
        if all(math.isnan(y) for y in ys):
            label += " (all nan)"
        style: dict[str, Any] = {"marker": "o", "markersize": 3}
        if is_best:
            style.update(color=_BEST_COLOR, linewidth=2.8, markersize=5, zorder=5)
        elif many:
            style.update(color="#9a9a9a", linewidth=0.8, alpha=0.6, zorder=2)
        else:
            style.update(color=_OTHER_COLORS[drawn % len(_OTHER_COLORS)], linewidth=1.0, alpha=0.8, zorder=3)
        if many and not is_best:
            label = "_nolegend_"
        (line,) = ax.plot(xs, ys, label=label, **style)
        if t.stopped_early:  # where ASHA cut the trial
            last = next((j for j in range(len(ys) - 1, -1, -1) if not math.isnan(ys[j])), None)
            if last is not None:
                ax.plot([xs[last]], [ys[last]], marker="x", markersize=8, color=line.get_color(),
                        linestyle="none", label="_nolegend_", zorder=6)
        drawn += 1
    ax.set_title(_plot_text(title, 120))
    ax.set_xlabel("epoch")
    ax.set_ylabel(_plot_text(ylabel, 60))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    if drawn == 0:
        _no_data(ax, "no epochs recorded")
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best", framealpha=0.8)
    fig.tight_layout()
    _save(fig, path)


def _hparams_plot(path: Path, summary: SweepSummary, trials: list[TrialRow], names: list[str], best_id: Any,
                  metric: str) -> None:
    """One panel per hyperparameter: each trial's best metric against its value.  Trials without a
    finite best value (failed, NaN) are grey crosses along the bottom edge, so their values show."""
    n = len(names)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(4.0 * ncols, 3.2 * nrows)
    for k, name in enumerate(names):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        _hparam_panel(ax, _space_choices(summary, name), trials, name, best_id, metric)
    fig.suptitle(_plot_text(f"best validation {metric} per hyperparameter "
                            "(star: best trial; grey x: failed or nan)", 140), fontsize=11)
    fig.tight_layout()
    _save(fig, path)


def _hparam_panel(ax, choices: list[Any], trials: list[TrialRow], name: str, best_id: Any, metric: str) -> None:
    """The panel of one hyperparameter ``name``, whose space lists ``choices`` (or none)."""
    ax.set_title(_plot_text(name, 40), fontsize=10)
    ax.set_ylabel(_plot_text(metric, 40), fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    entries = []  # (value, best metric or None, is_best)
    for t in trials:
        v = _hp_value(t.config, name)
        if v is _MISSING or v is None:
            continue
        entries.append((v, _finite(t.best_value), best_id is not None and t.trial_id == best_id))
    if not entries:
        _no_data(ax, "no trial set this value")
        return
    values = [v for v, _, _ in entries]
    if all(_num(v) is not None for v in values + choices):
        xs = _numeric_axis(ax, values, choices)
        if xs is None:
            return
    else:
        xs = _category_axis(ax, values, choices)
    _scatter_trials(ax, xs, entries)


def _numeric_axis(ax, values: list[Any], choices: list[Any]) -> list[float] | None:
    """The x positions of numeric values, the axis spanning them and the space's choices (a log axis
    over more than two orders of magnitude); None, and a note on the panel, where none is finite."""
    span = [x for x in (_finite(v) for v in values + choices) if x is not None]
    xs = [float(cast(float, _num(v))) for v in values]  # cast: the caller passes values that are all numeric
    if not span:
        _no_data(ax, "no finite values")
        return None
    lo, hi = min(span), max(span)
    if lo > 0 and hi / lo > 100:
        ax.set_xscale("log")
        ax.set_xlim(lo / 2.0, hi * 2.0)
    else:  # explicit limits: the crosses drawn in axes units do not widen the autoscale
        pad = (hi - lo) * 0.08 if hi > lo else max(abs(lo) * 0.1, 1.0)
        ax.set_xlim(lo - pad, hi + pad)
    return xs


def _category_axis(ax, values: list[Any], choices: list[Any]) -> list[float]:
    """The x positions of categorical values: one tick per category, the space's choices first."""
    order: list[str] = []
    for c in choices + values:
        label = _fmt_value(c)
        if label not in order:
            order.append(label)
    pos = {label: i for i, label in enumerate(order)}
    xs = [float(pos[_fmt_value(v)]) for v in values]
    tilt = len(order) > 3
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([_plot_text(o, 16) for o in order], rotation=30 if tilt else 0,
                       ha="right" if tilt else "center")
    ax.set_xlim(-0.5, len(order) - 0.5)
    return xs


def _scatter_trials(ax, xs: list[float], entries: list[tuple]) -> None:
    """The trials on one panel: finished ones at their best metric (the best trial a red star), the
    rest grey crosses along the bottom edge."""
    good = [(x, y, b) for x, (_, y, b) in zip(xs, entries) if y is not None and math.isfinite(x)]
    bad = [x for x, (_, y, _) in zip(xs, entries) if y is None and math.isfinite(x)]
    others = [(x, y) for x, y, b in good if not b]
    bests = [(x, y) for x, y, b in good if b]
    if others:
        ax.scatter([p[0] for p in others], [p[1] for p in others], s=28, color="#1f77b4", alpha=0.75,
                   edgecolors="white", linewidths=0.5, zorder=3)
    if bests:
        ax.scatter([p[0] for p in bests], [p[1] for p in bests], s=110, marker="*", color=_BEST_COLOR,
                   edgecolors="black", linewidths=0.5, zorder=4)
    if bad:  # x in data units, y in axes units: along the bottom whatever the metric's range
        ax.margins(y=0.2)  # keeps finished trials clear of the crosses
        ax.scatter(bad, [0.04] * len(bad), s=30, marker="x", color="#7f7f7f", zorder=3,
                   transform=ax.get_xaxis_transform())
    if not good:
        _no_data(ax, "no finite metric values")


def _confusion_plot(path: Path, matrix: list, classes: list) -> None:
    import numpy as np

    m = np.array([[(_num(c) if _num(c) is not None else math.nan) for c in row] for row in matrix], dtype=float)
    n_rows, n_cols = m.shape
    labels_r = [_plot_text(c, 16) for c in classes] if len(classes) == n_rows else [str(i) for i in range(n_rows)]
    labels_c = [_plot_text(c, 16) for c in classes] if len(classes) == n_cols else [str(i) for i in range(n_cols)]
    size = max(4.0, 0.9 * max(n_rows, n_cols) + 2.0)
    fig = _new_figure(size + 1.0, size)
    ax = fig.add_subplot(1, 1, 1)
    shown = np.where(np.isfinite(m), m, 0.0)
    image = ax.imshow(shown, cmap="Blues", vmin=0.0, vmax=max(float(shown.max()), 1.0))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    high = max(float(shown.max()), 1.0)
    for i in range(n_rows):
        for j in range(n_cols):
            v = m[i, j]
            text = "nan" if math.isnan(v) else (str(int(v)) if float(v).is_integer() else f"{v:.3g}")
            ax.text(j, i, text, ha="center", va="center", fontsize=10,
                    color="white" if shown[i, j] > 0.55 * high else "black")
    ax.set_xticks(range(n_cols))
    ax.set_xticklabels(labels_c)
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(labels_r)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("best trial: validation confusion matrix")
    fig.tight_layout()
    _save(fig, path)


def _valid_matrix(matrix: Any) -> bool:
    if not isinstance(matrix, (list, tuple)) or not matrix:
        return False
    rows = [r for r in matrix]
    if not all(isinstance(r, (list, tuple)) and r for r in rows):
        return False
    return len({len(r) for r in rows}) == 1


# ----------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem; color: #222;
       background: #fff; }
main { max-width: 1200px; }
h1 { font-size: 1.6rem; margin-bottom: .3rem; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; word-break: break-all; }
p.lede { font-size: 1.05rem; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
dl.facts dt { font-weight: 600; }
dl.facts dd { margin: 0; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .92rem; }
th, td { border: 1px solid #ccc; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.trial.best td { background: #ffe98a; font-weight: 600; }
tr.trial.error td { color: #a00; }
.note { color: #555; font-size: .9rem; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: .9rem; }
"""


def _figure(png: Path, alt: str, caption: str) -> str:
    """The plot inlined as a data URI, so that index.html alone renders (as in MLflow's artifact view,
    which serves one file at a time); ``data-file`` names the same PNG beside it."""
    import base64

    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" data-file="{_esc(png.name)}" alt="{_esc(alt)}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


def _trial_table(trials: list[TrialRow], names: list[str], best_id: Any, metric: str) -> str:
    rank_ic = metric != "val_rank_ic"  # every target reports it: the trials' signal on one scale
    head = ["trial"] + names + ["status", f"best {metric}"] + (["val rank IC"] if rank_ic else []) + \
        ["epochs run", "stopped early"]
    out = ['<table id="trials">', "<thead><tr>"]
    out += [f'<th scope="col">{_esc(h)}</th>' for h in head]
    out.append("</tr></thead>")
    out.append("<tbody>")
    best_marked = False
    for t in trials:
        tid = t.trial_id
        classes = ["trial"]
        if not best_marked and best_id is not None and tid == best_id:
            classes.append("best")
            best_marked = True
        status = t.status
        if str(status).upper() == "ERROR":
            classes.append("error")
        cells = [f"<td><code>{_esc(tid)}</code></td>"]
        cfg = t.config
        for name in names:
            cells.append(f"<td>{_esc(_fmt_value(_hp_value(cfg, name)))}</td>")
        cells.append(f"<td>{_esc(status)}</td>")
        cells.append(f'<td class="num">{_esc(_fmt_metric(t.best_value))}</td>')
        if rank_ic:
            cells.append(f'<td class="num">{_esc(_fmt_metric(t.val_rank_ic))}</td>')
        cells.append(f'<td class="num">{_esc(_fmt_metric(t.epochs_run))}</td>')
        cells.append(f"<td>{'yes' if t.stopped_early else 'no'}</td>")
        out.append(f'<tr class="{" ".join(classes)}" data-trial-id="{_esc(tid)}">' + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _metrics_table(metrics: dict) -> str:
    rows = "".join(f'<tr><th scope="row">{_esc(k)}</th><td class="num">{_esc(_fmt_metric(v))}</td></tr>'
                   for k, v in metrics.items())
    return f'<table id="test-metrics"><thead><tr><th>metric</th><th>test</th></tr></thead><tbody>{rows}</tbody></table>'


def _build(folder: Path, summary: SweepSummary) -> None:
    """The plots, then ``index.html``, in ``folder``."""
    name, metric, mode = _shown(summary)
    trials, best = summary.trials, summary.best_trial()
    names = _hp_names(summary, trials)
    ranked = _ranked(trials, best, mode)
    figures = _figures(folder, summary, names)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Sweep report: {_esc(name)}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f'<h1>Sweep report: <span class="sweep-name">{_esc(name)}</span></h1>',
        _summary_line(summary, metric, mode),
        _facts(summary, best, metric),
    ]
    if isinstance(summary.space, dict) and summary.space:
        parts.append("<h2>Search space</h2>" + "<ul>" + "".join(
            f"<li><code>{_esc(k)}</code>: {_esc(_describe_space(v))}</li>" for k, v in summary.space.items()) + "</ul>")
    parts.append("<h2>Trials</h2>")
    parts.append('<p class="note">Ranked on validation only, best first; the highlighted row is the chosen trial.</p>')
    parts.append(_trial_table(ranked, names, summary.best_trial_id, metric))
    parts += figures
    parts.append("<h2>Chosen trial on test</h2>")
    if _scored(summary.test_metrics):
        parts.append(_metrics_table(cast(dict, summary.test_metrics)))  # cast: _scored saw a non-empty dict
    else:
        parts.append('<p class="note">No test metrics: the test split stays sealed (tune --evaluate, or '
                     'alchemetric-ray evaluate, scores the chosen trial on it and records the look).</p>')
    parts.append("<h2>Exported model</h2>")
    if summary.model_dir:
        parts.append(f'<p id="model-dir"><code>{_esc(summary.model_dir)}</code></p>')
    else:
        parts.append('<p class="note">No model was exported.</p>')
    parts.append("</main></body></html>")
    (folder / INDEX).write_text("\n".join(parts) + "\n", encoding="utf-8")


def _shown(summary: SweepSummary) -> tuple[str, str, str]:
    """The sweep's name, selection metric and mode as the report shows them (a placeholder where one is missing)."""
    return summary.name or "sweep", str(summary.metric or "metric"), str(summary.mode or "max")


def _scored(test_metrics: Any) -> bool:
    """Whether the chosen trial was scored on the test split."""
    return bool(isinstance(test_metrics, dict) and test_metrics)


def _ranked(trials: list[TrialRow], best: TrialRow | None, mode: str) -> list[TrialRow]:
    """The trials best first: finished trials by their best value, then the rest in the given order;
    the chosen trial leads even if its value ties or is not finite."""
    ranked = sorted(trials, key=lambda t: _rank_key(t, mode))
    if best is not None:
        ranked = [best] + [t for t in ranked if t is not best]
    return ranked


def _figures(folder: Path, summary: SweepSummary, names: list[str]) -> list[str]:
    """Draw the plots into ``folder``; their sections of the page, in order."""
    _, metric, mode = _shown(summary)
    trials, best_id = summary.trials, summary.best_trial_id
    _curves_plot(folder / LEARNING_PNG, trials, best_id, metric,
                 f"validation {metric} per epoch ({mode}; best trial bold, x: stopped early)", f"validation {metric}")
    figures = ["<h2>Learning curves</h2>" + _figure(
        folder / LEARNING_PNG,
        f"Validation {metric} per epoch, one line per trial; the best trial is the thick red line.",
        f"Validation {metric} per epoch, one line per trial. The best trial is bold red; "
        "an x marks the last epoch of a trial the scheduler stopped early.")]
    _curves_plot(folder / TRAIN_LOSS_PNG, trials, best_id, "train_loss", "training loss per epoch (best trial bold)",
                 "train loss")
    figures.append("<h2>Training loss</h2>" + _figure(
        folder / TRAIN_LOSS_PNG, "Training loss per epoch, one line per trial; the best trial is the thick red line.",
        "Training loss per epoch, one line per trial."))
    if names:
        _hparams_plot(folder / HPARAMS_PNG, summary, trials, names, best_id, metric)
        figures.append("<h2>Hyperparameters</h2>" + _figure(
            folder / HPARAMS_PNG, f"Best validation {metric} of each trial against each hyperparameter; "
            "the best trial is a red star.",
            f"Best validation {metric} against each hyperparameter of the space (one panel each; "
            "log x-axis where a numeric hyperparameter spans more than two orders of magnitude). "
            "Trials that failed or scored nan are grey crosses along the bottom edge."))
    if _valid_matrix(summary.best_confusion):
        _confusion_plot(folder / CONFUSION_PNG, cast(list, summary.best_confusion),  # cast: _valid_matrix saw rows
                        list(summary.classes or []))
        figures.append("<h2>Best trial: confusion matrix</h2>" + _figure(
            folder / CONFUSION_PNG, "Validation confusion matrix of the best trial at its best epoch, with counts "
            "(rows: true class, columns: predicted class).",
            "Validation confusion matrix of the best trial at its best epoch (rows: true, columns: predicted)."))
    return figures


def _summary_line(summary: SweepSummary, metric: str, mode: str) -> str:
    """How many configurations were tried, on what they were ranked, and whether the test split was used."""
    trials = summary.trials
    num_trials = summary.num_trials
    if not isinstance(num_trials, int) or isinstance(num_trials, bool):
        num_trials = len(trials)
    if _scored(summary.test_metrics):
        test_line = "the test split was used once, for the chosen trial only (a look, recorded in the model folder)."
    else:
        test_line = "the test split was not used: it stays sealed (tune --evaluate scores the chosen trial on it)."
    listed = "" if num_trials == len(trials) else f" ({len(trials)} listed below)"
    return (f'<p class="lede" id="summary-line">{num_trials} configuration{"" if num_trials == 1 else "s"} tried'
            f'{_esc(listed)}; ranked on validation '
            f"<code>{_esc(metric)}</code> ({_esc(mode)}); {_esc(test_line)}</p>")


def _facts(summary: SweepSummary, best: TrialRow | None, metric: str) -> str:
    """The scheduler, the epochs a trial may run, and the best trial with its value."""
    best_id = summary.best_trial_id
    facts = [("scheduler", _esc(summary.scheduler or "none")),
             ("max epochs", _esc(_fmt_metric(summary.max_epochs))),
             ("best trial", f"<code>{_esc(best_id)}</code>" if best_id is not None else "none (no trial finished)")]
    if best is not None:
        facts.append((f"best validation {metric}", _esc(_fmt_metric(best.best_value))))
    return '<dl class="facts">' + "".join(f"<dt>{_esc(k)}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"


def write_sweep_report(out_dir: str | Path | Location, summary: SweepSummary | dict) -> Path | Location:
    """Write out_dir/index.html plus PNG plots beside it (atomically: build in a temp folder beside
    out_dir, then rename over it; on object storage, index.html goes in last); return the index.html
    path (a ``Location`` on object storage).  ``summary`` is the record or its ``as_dict`` form."""
    if isinstance(summary, dict):
        summary = SweepSummary.from_dict(summary)
    if not isinstance(summary, SweepSummary):
        raise TypeError(f"summary must be a SweepSummary or a dict, not {type(summary).__name__}")
    target = locate(out_dir)
    with staged_output(target, "sweep-report", last=(INDEX,)) as tmp:
        _build(tmp, summary)
    index = target / INDEX
    return Path(out_dir) / INDEX if index.is_local else index  # a local report: the path as given


__all__ = ["write_sweep_report"]
