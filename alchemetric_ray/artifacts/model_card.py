"""A saved model's ``model_card.md``: what the model folder holds, for people.

The model, its data and features, its label and splits, where and in what precision it trained
(with the reasons), the known backend bugs met and the shadow check's figures, the versions behind
it, and its validation figures beside the baselines' (the test segment's only where the export
scored it: ``train.score_test``; else the card says it is sealed).
"""

from __future__ import annotations

from alchemetric_ray.artifacts.model_meta import ModelMeta
from alchemetric_ray.config import RunConfig
from alchemetric_ray.data.manifest import Manifest

FEW_TICKERS = 10
# The scored table's columns, by kind of label: its header, and each column's figure as (segment, metric).
_SCORED_TABLES = {
    True: ("| model | val rank IC | test rank IC | test IC | test MSE |",
           (("val", "rank_ic"), ("test", "rank_ic"), ("test", "ic"), ("test", "mse"))),
    False: ("| model | val balanced acc | test balanced acc | test log loss | test macro F1 |",
            (("val", "balanced_accuracy"), ("test", "balanced_accuracy"), ("test", "log_loss"), ("test", "macro_f1"))),
}


def _backend_lines(known: dict, history: list[dict]) -> list[str]:
    """The card's lines on trusting the backend: the known-bug table's findings for the run
    (``train/backend_check.py``) and the shadow check's figures (``train/shadow.py``), where there are any."""
    lines = []
    if known:
        matched = [f"{m['id']} ({m['source']})" for m in known.get("matched", [])]
        unknown = sorted({f"{u['id']} ({u['source']})" for u in known.get("unknown", [])})
        micro = known.get("micro_batch_rows") or 0
        if matched:
            lines.append(f"- known backend bugs met: {', '.join(matched)}; worked around with micro-batches of "
                         f"{micro:,} rows (the same gradient)")
        elif micro:
            lines.append(f"- micro-batches of {micro:,} rows (train.micro_batch_rows)")
        if unknown:
            lines.append(f"- known backend bugs the trace could not decide (unknown: probe): {', '.join(unknown)}")
        if not matched and not unknown:
            lines.append(f"- known backend bugs: none of the table's entries matches this run on {known['backend']}")
    checked = [row for row in history if "shadow_checks" in row]
    if checked:
        largest = max(row["shadow_max_error"] for row in checked)
        lines.append(f"- shadow check against a float32 CPU copy: {checked[-1]['shadow_checks']} checks up to "
                     f"epoch {checked[-1]['epoch']} (the exported one), largest whole-gradient error {largest:.2e}")
    return lines


def model_card(cfg: RunConfig, manifest: Manifest, metrics: dict, meta: ModelMeta) -> str:
    """The card of a model exported with ``metrics`` (``metrics.json``) and ``meta`` (``meta.json``)."""
    n_tickers = len(manifest.tickers)
    device, precision = meta.device or {}, meta.precision or {}
    splits = manifest.splits
    label = manifest.label
    lines = [
        f"# Model card: {cfg.storage.name}",
        "",
        f"- model: `{cfg.model.name}` (hidden {cfg.model.hidden}, layers {cfg.model.layers}, "
        f"dropout {cfg.model.dropout})",
        f"- data: {manifest.source}; {n_tickers} tickers; input hash `{manifest.input_hash[:16]}`",
        f"- features ({len(manifest.features)}): {', '.join(manifest.features)}",
        f"- label: {label['scheme']}, horizon {label['horizon']} bar(s), "
        + (f"classes {', '.join(label['classes'])}; " if label["classes"] else
           "regression on the forward return's place among the date's stocks; ")
        + "a signal at the close of t trades from the open of t+1",
        f"- splits: train {splits['train_start']}..{splits['train_end']}, "
        f"val {splits['val_start']}..{splits['val_end']}, "
        f"test {splits['test_start']}..{splits['test_end']} (embargo {splits['embargo']} bars)",
        f"- trained on: {device['device']} ({device['reason']}); precision {precision['mode']} "
        f"({precision['reason']})",
        f"- best epoch: {metrics['best_epoch']} by {metrics['selection_metric']}",
        *_backend_lines(meta.known_bugs or {}, metrics["history"]),
        f"- torch {meta.environment['torch']}, ray {meta.environment['ray']}, "
        f"git {meta.environment['git_commit']}",
        "",
    ]
    if n_tickers < FEW_TICKERS:
        lines += [f"> Only {n_tickers} tickers: cross-sectional statistics (IC, long-short) are not meaningful.", ""]
    cross = manifest.cross_section
    if cross:
        lines += [f"> Cross-sectional: {', '.join(sorted({op['kind'] for op in cross['ops']}))} across the stocks of "
                  f"each date; {cross['dates_dropped']} date(s) with fewer than {cross['min_names']} stocks dropped. "
                  "Survivorship: the tickers are those in the data, i.e. listed at its end date; stocks that were "
                  "delisted earlier are missing from every cross-section.", ""]
    nan = float("nan")
    if "test" not in metrics:  # sealed: no test figure was computed
        lines += [f"Test segment {splits['test_start']}..{splits['test_end']}: sealed, not scored at export. "
                  "`alchemetric-ray evaluate` scores it against the baselines; every look is recorded in "
                  "this folder's `looks/` and counted in the evaluation report.", "",
                  "| model | val " + ("rank IC" if manifest.regression else "balanced acc") + " |", "|---|---|"]
        key = "rank_ic" if manifest.regression else "balanced_accuracy"
        rows = [("deep model", metrics["val"]), *((n, b.get("val", {})) for n, b in metrics["baselines"].items())]
        lines += [f"| {name} | {val.get(key, nan):.4f} |" for name, val in rows]
        return "\n".join(lines) + "\n"
    header, columns = _SCORED_TABLES[bool(manifest.regression)]
    lines += [header, "|---|---|---|---|---|"]
    rows = [("deep model", {"val": metrics["val"], "test": metrics["test"]}), *metrics["baselines"].items()]
    for name, scores in rows:
        lines.append(f"| {name} | " + " | ".join(f"{scores.get(segment, {}).get(metric, nan):.4f}"
                                                 for segment, metric in columns) + " |")
    return "\n".join(lines) + "\n"
