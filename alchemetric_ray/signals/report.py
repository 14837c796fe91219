"""The evaluation's report: the equity plot (``equity.png``) drawn from the contenders' rows, the
Markdown of ``report.md`` (with the tear sheet's tables and its plots, ``signals/tearsheet.py``) and
the terminal's verdict table, both rendered from the evaluation's record
(:class:`~alchemetric_ray.signals.records.Evaluation`), figure for figure what ``evaluation.json`` holds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pandas as pd

from alchemetric_ray.artifacts import ledger
from alchemetric_ray.signals.contenders import FEW_TICKERS, LIGHTGBM, ContenderRow, SegmentResult
from alchemetric_ray.signals.records import ModelInfo
from alchemetric_ray.signals.tearsheet import PNGS, TearSheet
from alchemetric_ray.signals.walk_forward import FoldsWalkForward, PooledWalkForward

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from alchemetric_ray.signals.records import Evaluation, Looks


def equity_curves(tickers: int, rows: list[ContenderRow]) -> dict[str, pd.DataFrame]:
    """The curve the equity plot draws per contender: the long-short portfolio on a cross-section
    (FEW_TICKERS or more names), else the thresholded positions.  Buy-and-hold is always its
    positions, the equal-weight long-only book: a constant score ranks no stock above another, so
    it has no long-short book (:attr:`ContenderRow.trades`), nor has any contender whose book never traded."""
    cross = tickers >= FEW_TICKERS
    curves = {}
    for row in rows:
        eq = row.long_short_equity if cross and row.trades else row.positions_equity
        if eq is not None and len(eq):
            curves[row.name] = eq
    return curves


def plot_equity(result: SegmentResult, path: Path | None = None) -> Figure:
    """The equity curves (:func:`equity_curves`) as a matplotlib Figure on its own Agg canvas, saved
    to ``path`` as a PNG where given.  No backend is chosen and pyplot is not imported: a caller's
    backend (a notebook's inline one, a desktop window) stays as it was."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), dpi=100)
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: the figure draws and saves without pyplot
    ax = fig.add_subplot(1, 1, 1)
    cross = result.tickers >= FEW_TICKERS
    for name, eq in equity_curves(result.tickers, result.rows).items():
        ax.plot(pd.to_datetime(eq["date"]), eq["equity"], label=name, linewidth=2.2 if name == "deep model" else 1.2)
    ax.set_title(("long-short top/bottom quantile" if cross else "thresholded positions") + ", net of costs")
    ax.set_ylabel("equity (start = 1)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, format="png")
    return fig


def _f(value, fmt="{:.4f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return fmt.format(value)


def _long_short(row: ContenderRow, figure: str) -> float | None:
    """A figure of the row's long-short book; None where the book never traded (it is undefined)."""
    return getattr(row.long_short, figure) if row.trades else None


def _balanced_accuracy(row: ContenderRow) -> float | None:
    return (row.classification or {}).get("balanced_accuracy")


def verdict_table(result: Evaluation) -> str:
    """The verdict and the side-by-side table for a terminal: one row per contender."""
    seg = result.segment
    scored = "new " if result.data else "test "
    header = (f"{scored + seg.start + '..' + seg.end:<26s} {'rank IC [95% CI]':>26s} {'L/S Sharpe':>10s} "
              f"{'L/S return':>10s} {'bal. acc':>8s}")
    lines = [header]
    for row in result.rows:
        rank_ic = row.rank_ic
        interval = f"{_f(rank_ic.mean, '{:+.4f}')} [{_f(rank_ic.ci_low, '{:+.4f}')}, {_f(rank_ic.ci_high, '{:+.4f}')}]"
        sharpe, annual = _f(_long_short(row, "sharpe"), "{:.2f}"), _f(_long_short(row, "annual_return"), "{:.1%}")
        lines.append(f"{row.name:<26s} {interval:>26s} {sharpe:>10s} {annual:>10s} {_f(_balanced_accuracy(row)):>8s}")
    return "\n".join([*lines, result.verdict.line])


def _contender_table(rows: list[ContenderRow]) -> list[str]:
    lines = ["| contender | rank IC [CI] | IC | ICIR | L/S Sharpe | L/S ann. return | max DD | turnover | "
             "positions Sharpe | hit rate | PSR | DSR | bal. acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        rank_ic = row.rank_ic
        cells = [row.name, f"{_f(rank_ic.mean)} [{_f(rank_ic.ci_low)}, {_f(rank_ic.ci_high)}]",
                 _f(row.ic.mean), _f(rank_ic.icir, "{:.2f}"),
                 _f(_long_short(row, "sharpe"), "{:.2f}"), _f(_long_short(row, "annual_return"), "{:.2%}"),
                 _f(_long_short(row, "max_drawdown"), "{:.2%}"), _f(_long_short(row, "turnover"), "{:.2f}"),
                 _f(row.positions.sharpe, "{:.2f}"), _f(row.hit_rate, "{:.3f}"),
                 _f(row.psr if row.trades else None, "{:.3f}"), _f(row.dsr, "{:.3f}"), _f(_balanced_accuracy(row))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fits_lines(fits: dict[str, list[dict]] | None) -> list[str]:
    """Where LightGBM stopped: its best round of the most it may run, on which validation dates (one
    fit; in a pooled walk-forward one per refit, in order)."""
    lightgbm = (fits or {}).get(LIGHTGBM)
    if not lightgbm:
        return []
    if len(lightgbm) == 1:
        fit = lightgbm[0]
        return [f"LightGBM, stopping early on the validation rows {fit['val_start']}..{fit['val_end']} "
                f"({fit['val_rows']} rows; fitted through {fit['fit_end']}): best round {fit['best_iteration']} "
                f"of at most {fit['max_rounds']} ({fit['rounds']} run).", ""]
    rounds = ", ".join(str(f["best_iteration"]) for f in lightgbm)
    return [f"LightGBM's best round per refit (of at most {lightgbm[0]['max_rounds']}, each stopped early on its "
            f"refit's validation rows): {rounds}.", ""]


def _pooled_section(wf: PooledWalkForward) -> list[str]:
    pooled, seg = wf.pooled, wf.pooled.segment
    days = pooled.deep_model.rank_ic.n_days
    lines = [f"## Walk-forward, pooled out of sample ({wf.refits} refits every {wf.refit_every} trading days, "
             f"{wf.window} window)", "",
             f"Every out-of-sample prediction of {seg.start}..{seg.end} ({days} days, {pooled.tickers} "
             f"tickers), scored once; each block was predicted by a model (and baselines) fitted only on the dates "
             f"before it. {wf.refits} refits took {wf.seconds:.0f} s ({wf.refits_per_minute:.2f} a minute).",
             "", f"**{pooled.verdict.line}**", ""]
    if pooled.baselines_note:
        lines += [f"> Baselines: {pooled.baselines_note}.", ""]
    lines += _contender_table(pooled.rows)
    lines += ["", *_fits_lines(pooled.baseline_fits)]
    lines += ["", "| year | days | rank IC [CI] | best baseline rank IC |", "|---|---|---|---|"]
    for year in wf.years:
        lines.append(f"| {year.year} | {year.days} | {_f(year.rank_ic)} [{_f(year.ci_low)}, "
                     f"{_f(year.ci_high)}] | {_f(year.best_baseline_rank_ic)} |")
    lines += ["", "| fold | trained through | scored | days | rank IC | Sharpe | best baseline rank IC |",
              "|---|---|---|---|---|---|---|"]
    for fold in wf.folds:
        lines.append(f"| {fold.fold} | {fold.train_end} | {fold.test_start}..{fold.test_end} | "
                     f"{fold.days} | {_f(fold.rank_ic)} | {_f(fold.sharpe, '{:.2f}')} | "
                     f"{_f(fold.best_baseline_rank_ic)} |")
    return [*lines, ""]


def _folds_section(wf: FoldsWalkForward) -> list[str]:
    lines = [f"## Walk-forward ({len(wf.folds)} folds, retrained per fold)", "",
             f"rank IC {wf.rank_ic_mean:.4f} ± {wf.rank_ic_std:.4f}; long-short Sharpe "
             f"{wf.sharpe_mean:.2f} ± {wf.sharpe_std:.2f}", "",
             "| fold | test | rank IC | Sharpe | best baseline rank IC |", "|---|---|---|---|---|"]
    for fold in wf.folds:
        lines.append(f"| {fold.fold} | {fold.test_start}..{fold.test_end} | {_f(fold.rank_ic)} | "
                     f"{_f(fold.sharpe, '{:.2f}')} | {_f(fold.best_baseline_rank_ic)} |")
    return [*lines, ""]


def _looks_lines(looks: Looks | None) -> list[str]:
    """How often the test segment has been scored: a look is a command that scored it (its labels
    against a model's scores): `evaluate`, `train`/`tune` with train.score_test, `doctor --model`."""
    if not looks:
        return []
    line = (f"Looks at the test segment {looks.test_start}..{looks.test_end}: {looks.count}, this one "
            "included (a look: a command that scored the segment's labels; recorded in the model folder's looks/)")
    if looks.earlier:
        line += f"; the earlier: {ledger.look_summary(looks.earlier)}"
    tail = (" Any look after the first may have steered the model (a retrain, another configuration): read these "
            "figures as less than out of sample; new data (`evaluate --data`) is fresh evidence."
            if looks.count > 1 else "")
    return [f"{line}.{tail}", ""]


def _data_lines(result: Evaluation) -> list[str]:
    """New data: the window scored and how the data's duplicated bars were treated."""
    if not result.data:
        return []
    window, dup, lines = result.data.window, result.data.duplicates, []
    if window:
        lines += [f"Scored window {window.start}..{window.end}: {window.days} days, "
                  f"{window.names} names of the new data, from the model's test-segment start "
                  f"{window.model_test_start} (earlier dates' labels took part in training and model selection) "
                  "to the data's last date with a realised return (the model's own test segment ended "
                  f"{window.model_test_end}).", ""]
    if result.baselines_note:
        lines += [f"> Baselines: {result.baselines_note}.", ""]
    if dup:
        lines += [f"Data {result.data.path}: {dup['exact_rows_dropped']} exact duplicate row(s) dropped; "
                  f"{dup['conflicting_dates']} date(s) with differing rows, resolved by data.on_duplicate="
                  f"{dup['resolved_by']}" + (f" (tickers skipped: {', '.join(dup['tickers_skipped'])})"
                                             if dup["tickers_skipped"] else "") + ".", ""]
    return lines


def _selection_lines(result: Evaluation) -> list[str]:
    """The trials behind the model and its deflated Sharpe ratio, beside the same book on the scored dates."""
    sel = result.selection
    if not sel:
        return []
    return [f"The model was chosen among {sel.n_trials} trials ({sel.selections} selection(s) exported "
            "under its name for this test segment: sweeps and training runs, from the model folder's "
            "trials.json). Its DSR deflates the chosen trial's *validation* long-short Sharpe ratio, gross "
            f"and per date as the trials were compared ({_f(sel.val_ls_sr_gross_per_date)}), against the "
            "best of that many unskilled trials whose Sharpe ratios vary as these did (Bailey and López de "
            "Prado, 2014): DSR " + _f(sel.dsr, "{:.3f}") + ". Like with like, the same book on the scored "
            f"dates, gross and per date: {_f(sel.scored_ls_sr_gross_per_date)} over {sel.scored_days} "
            "days. The table's L/S Sharpe is net of costs and annualised, not deflated.", ""]


def _tear_sheet_section(sheet: TearSheet | None) -> list[str]:
    """The tear sheet of the model's signal on the scored segment: its tables and its plots."""
    if sheet is None:
        return []
    h, bp = sheet.horizon, "{:+.1f}"
    lines = ["## Tear sheet", "",
             f"The deep model's score on the scored segment. Returns run from the open after the signal's bar to the "
             f"open h bars later (h = {h}, the label's horizon, unless said); quantiles of the score per date "
             f"({sheet.quantiles}, on dates with at least {sheet.quantiles} names: {sheet.days} dates). Definitions: "
             "docs/evaluation.md, *Tear sheet*.", "",
             f"| quantile | mean {h}-bar return (bp) | dates |", "|---|---|---|"]
    for row in sheet.quantile_returns:
        lines.append(f"| Q{row['quantile']} | {_f(_bp(row['mean']), bp)} | {row['days']} |")
    spread = sheet.spread
    lines += [f"| top - bottom | {_f(_bp(spread['mean']), bp)} (sd {_f(_bp(spread['std']), '{:.1f}')}) | "
              f"{spread['days']} |", "",
              f"![quantile returns]({PNGS['quantiles']})", "",
              "IC decay: the mean daily rank IC of the score against the h-bar return.", "",
              "| h | " + " | ".join(str(r["horizon"]) for r in sheet.ic_decay) + " |",
              "|---|" + "---|" * len(sheet.ic_decay),
              "| rank IC | " + " | ".join(_f(r["mean"], "{:+.3f}") for r in sheet.ic_decay) + " |",
              "| dates | " + " | ".join(str(r["days"]) for r in sheet.ic_decay) + " |", "",
              f"![IC decay]({PNGS['ic_decay']})", "",
              f"| month | rank IC ({h}-bar) | dates |", "|---|---|---|"]
    lines += [f"| {r['month']} | {_f(r['mean'], '{:+.4f}')} | {r['days']} |" for r in sheet.ic_by_month]
    turnover = sheet.turnover
    lines += ["", f"![rank IC by month]({PNGS['ic_month']})", "",
              f"Turnover (the share of a quantile's names that were not in it on the previous date), mean over "
              f"{turnover['days']} dates: top quantile {_f(turnover['top'], '{:.2f}')}, bottom quantile "
              f"{_f(turnover['bottom'], '{:.2f}')}.", "",
              f"![turnover]({PNGS['turnover']})", ""]
    return lines


def _bp(value: float | None) -> float | None:
    return None if value is None else value * 1e4


def render_report(result: Evaluation) -> str:
    seg, v, model = result.segment, result.verdict, cast(ModelInfo, result.model)  # cast: evaluate sets it first
    lines = [f"# Evaluation: {model.name} ({model.id})", "",
             f"**{v.line}**", "",
             f"signal: {'yes' if v.signal else 'no'} (the model's rank-IC interval "
             f"{'excludes' if v.signal else 'does not exclude'} 0); an edge over the best baseline also needs "
             "the paired daily difference to be above 0.", "",
             f"{'Scored window' if result.data else 'Test segment'} {seg.start}..{seg.end}, "
             f"{result.tickers} tickers; returns are earned from the "
             "open after each signal; costs are included in the portfolio figures.", ""]
    if result.data:
        lines += _data_lines(result)
    elif result.baselines_note:
        lines += [f"> Baselines: {result.baselines_note}.", ""]
    if not v.cross_section_meaningful:
        lines += [f"> With only {result.tickers} tickers the cross-sectional numbers (IC, rank IC, long-short) are "
                  "not meaningful; read the position returns instead.", ""]
    if model.cross_sectional:
        lines += [f"> Cross-sectional model ({model.label}): its labels or features compare the stocks "
                  "of each date. Survivorship: those stocks are the tickers in the data, i.e. listed at its end date; "
                  "stocks delisted earlier are missing from every date, which flatters long-short results.", ""]
    if result.seeds is not None:
        lines += [f"> Seed ensemble: the model scores the average of {len(result.seeds.seeds)} models trained at seeds "
                  f"{', '.join(map(str, result.seeds.seeds))}; each alone has a rank IC of "
                  f"{', '.join(f'{v:+.4f}' for v in result.seeds.rank_ic)} on this segment.", ""]
    lines += _looks_lines(result.looks)
    lines += _selection_lines(result)
    lines += _contender_table(result.rows)
    lines += ["", *_fits_lines(result.baseline_fits)]
    lines += ["![equity curves](equity.png)", ""]
    if isinstance(result.walk_forward, PooledWalkForward):
        lines += _pooled_section(result.walk_forward)
    elif result.walk_forward:
        lines += _folds_section(result.walk_forward)
    lines += _tear_sheet_section(result.tear_sheet)
    return "\n".join(lines) + "\n"
