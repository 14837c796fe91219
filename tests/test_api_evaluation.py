"""``ar.evaluate``'s result (issue 48 item 2): an evaluation report folder, written by a real
evaluation of the session's model (conftest's ``stock_model``), read back as the notebook's
:class:`~alchemetric_ray.api.evaluation.Evaluation`: its tables equal ``evaluation.json``'s figures,
its displays fit a screen and carry the equity curves as a PNG, and neither evaluating nor drawing
switches the user's matplotlib backend."""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import fields, replace
from types import SimpleNamespace

import pytest

USER_BACKEND = "svg"  # stands for the user's own backend (a notebook's inline one): anything but Agg


def _same(a, b) -> bool:
    """Equal figures: NaN in the table stands for None (or NaN) in the record."""
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return isinstance(a, float) and math.isnan(a)
    return a == pytest.approx(b, rel=1e-12, abs=0)


@pytest.fixture(scope="module")
def evaluated(stock_model, tmp_path_factory):
    """One evaluation of the session's model on its test segment, as the ``evaluate`` command runs it
    (cli.py's ``_evaluate``: the model loaded once, its own config with this command's device), with
    a user backend set that is not Agg."""
    import matplotlib

    from alchemetric_ray.artifacts.export import load_model
    from alchemetric_ray.data.manifest import reconcile_features, with_shard_features
    from alchemetric_ray.signals.evaluate import evaluate

    before = matplotlib.get_backend()
    matplotlib.use(USER_BACKEND)
    try:
        loaded = load_model(stock_model)
        cfg = reconcile_features(with_shard_features(loaded.config, loaded.manifest).replace("device.name=cpu"),
                                 loaded.manifest, str(stock_model), model=True)
        folder = tmp_path_factory.mktemp("api-evaluation") / "report"
        live = evaluate(loaded, None, folder, cfg)
        yield SimpleNamespace(live=live, folder=folder, backend=matplotlib.get_backend(),
                              record=json.loads((folder / "evaluation.json").read_text()))
    finally:
        matplotlib.use(before)


def test_the_folder_reads_back_as_evaluation_json_says(evaluated):
    from alchemetric_ray.api.evaluation import CONTENDER_COLUMNS, Evaluation, Verdict

    assert evaluated.backend == USER_BACKEND  # evaluating (plot_equity included) left the backend alone
    ev = Evaluation.from_folder(evaluated.folder)
    record, live = evaluated.record, evaluated.live
    assert json.dumps(ev.as_dict(), sort_keys=True) == json.dumps(record, sort_keys=True)
    table = ev.contenders
    assert list(table.columns) == list(CONTENDER_COLUMNS)
    assert list(table["name"]) == [row["name"] for row in record["rows"]] and table["name"][0] == "deep model"
    for (_, got), row, obj in zip(table.iterrows(), record["rows"], live.rows, strict=True):
        expected = {"rank_ic": row["rank_ic"]["mean"], "rank_ic_low": row["rank_ic"]["ci_low"],
                    "rank_ic_high": row["rank_ic"]["ci_high"], "rank_ic_days": row["rank_ic"]["n_days"],
                    "ic": row["ic"]["mean"], "ls_sharpe": row["long_short"]["sharpe"],
                    "ls_annual_return": row["long_short"]["annual_return"],
                    "balanced_accuracy": (row.get("classification") or {}).get("balanced_accuracy"),
                    "rows": row["rows"], "tickers": row["tickers"]}
        for column, value in expected.items():
            assert _same(got[column], value), (row["name"], column, got[column], value)
        # and the statistics objects the evaluation computed, figure for figure
        assert _same(got["rank_ic"], obj.rank_ic.mean) and _same(got["rank_ic_low"], obj.rank_ic.ci_low)
        assert _same(got["ls_sharpe"], obj.long_short.sharpe if obj.trades else None)
        assert _same(got["balanced_accuracy"], (obj.classification or {}).get("balanced_accuracy"))
    assert table["balanced_accuracy"].notna().sum() >= 1  # a class target: the deep model has one
    assert table.loc[table["name"] == "buy and hold", "ls_sharpe"].isna().all()  # no book: NaN, not 0
    (lightgbm,) = table.loc[table["name"] == "lightgbm", "rank_ic"]  # the strongest baseline, on the packaged data
    assert math.isfinite(lightgbm)

    verdict = ev.verdict
    assert verdict == Verdict(signal=record["verdict"]["signal"], edge=record["verdict"]["edge"],
                              line=record["verdict"]["line"])
    assert isinstance(verdict.signal, bool) and isinstance(verdict.edge, bool)
    assert (verdict.signal, verdict.edge) == (live.verdict.signal, live.verdict.edge)
    assert tuple(ev.segment) == (record["segment"]["start"], record["segment"]["end"])
    assert ev.segment.start == live.segment.start and ev.tickers == record["tickers"]
    assert ev.walk_forward is None
    assert ev.folder == evaluated.folder.resolve() and ev.report == ev.folder / "report.md"
    assert ev.report.is_file() and ev.equity_png.is_file() and ev.signals_file.is_file()
    # the live record reads as the file does, and the result's record round-trips
    assert json.dumps(Evaluation.from_live(live, evaluated.folder).as_dict(), sort_keys=True) == \
        json.dumps(record, sort_keys=True)
    again = Evaluation.from_record(ev.record(), ev.folder)
    assert json.dumps(again.as_dict(), sort_keys=True) == json.dumps(record, sort_keys=True)


def test_repr_fits_a_screen_and_the_html_carries_the_table_and_the_curves(evaluated):
    import matplotlib

    from alchemetric_ray.api.evaluation import Evaluation

    ev = Evaluation.from_folder(evaluated.folder)
    text = repr(ev)
    lines = text.splitlines()
    assert len(lines) <= 25, text
    seg = evaluated.record["segment"]
    assert f"{seg['start']}..{seg['end']}" in lines[0]
    assert all(row["name"] in text for row in evaluated.record["rows"])
    assert f"verdict: {ev.verdict.line}" in lines
    assert lines[-1] == f"report: {ev.report}"

    page = ev._repr_html_()
    assert "<table" in page and "deep model" in page
    assert ev.verdict.line.split("(")[0] in page
    start = page.index("data:image/png;base64,") + len("data:image/png;base64,")
    png = base64.b64decode(page[start:page.index('"', start)])
    assert png == (evaluated.folder / "equity.png").read_bytes()  # the saved plot, without pyplot
    # without its folder, the live record draws the curves for the page; without either, no image
    live_only = Evaluation.from_record(evaluated.live.as_dict(), live=evaluated.live)
    assert "data:image/png;base64,iVBOR" in live_only._repr_html_()
    bare = Evaluation.from_record(evaluated.record)
    assert "<table" in bare._repr_html_() and "data:image/png" not in bare._repr_html_()
    assert len(repr(bare).splitlines()) <= 25 and "report:" not in repr(bare)
    assert matplotlib.get_backend() == USER_BACKEND


def test_figure_is_a_figure_and_leaves_the_backend_alone(evaluated):
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.signals.report import equity_curves

    live = evaluated.live
    drawn = Evaluation.from_record(live.as_dict(), evaluated.folder, live=live).figure()
    assert isinstance(drawn, Figure) and isinstance(drawn.canvas, FigureCanvasAgg)
    (ax,) = drawn.axes
    assert [line.get_label() for line in ax.get_lines()] == list(equity_curves(live.tickers, live.rows))
    assert matplotlib.get_backend() == USER_BACKEND

    shown = Evaluation.from_folder(evaluated.folder).figure()  # after a restart: the saved plot
    assert isinstance(shown, Figure) and len(shown.axes) == 1 and len(shown.axes[0].images) == 1
    height, width = shown.axes[0].images[0].get_array().shape[:2]
    assert (width, height) == (900, 450)  # plot_equity's 9 x 4.5 inches at 100 dpi
    buffer = io.BytesIO()
    shown.savefig(buffer, format="png")
    assert buffer.getvalue().startswith(b"\x89PNG")
    assert matplotlib.get_backend() == USER_BACKEND
    with pytest.raises(FileNotFoundError, match="without its folder"):
        Evaluation.from_record(evaluated.record).figure()


def test_a_folder_without_an_evaluation_is_refused_in_one_line(tmp_path):
    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.errors import EvaluationError

    with pytest.raises(FileNotFoundError, match="holds no evaluation.json"):
        Evaluation.from_folder(tmp_path)
    (tmp_path / "evaluation.json").write_text('{"rows": []}')
    with pytest.raises(EvaluationError, match="not an evaluation record") as err:
        Evaluation.from_folder(tmp_path)
    assert "\n" not in str(err.value)


def _walk_forward_record(live, wf) -> dict:
    """evaluation.json's dict as the code writes it, with ``wf`` as its walk-forward section."""
    from alchemetric_ray.fsutil import json_bytes

    return json.loads(json_bytes(replace(live, walk_forward=wf).as_dict()))


def _fold_rows(live, seconds: bool):
    from alchemetric_ray.signals.walk_forward import FoldRow

    start, end = live.segment.start, live.segment.end
    return [FoldRow(fold=0, test_start="2014-01-02", test_end="2014-12-31", train_start="2012-09-04",
                    train_end="2013-12-20", normalized_through="2013-12-20", days=250, rank_ic=0.031, sharpe=None,
                    best_baseline_rank_ic=0.012,
                    seconds={"train": 4.1, "stage": 0.5, "predict": 0.7, "baselines": 1.2} if seconds else None),
            FoldRow(fold=1, test_start=start, test_end=end, train_start="2012-09-04", train_end="2016-12-01",
                    normalized_through="2016-12-01", days=live.rows[0].rank_ic.n_days, rank_ic=-0.004, sharpe=0.85,
                    best_baseline_rank_ic=float("nan"),
                    seconds={"train": 3.9, "stage": 0.4, "predict": 0.6, "baselines": 1.1} if seconds else None)]


def test_a_pooled_walk_forward_reads_as_its_tables(evaluated):
    """The pooled walk-forward section as ``PooledWalkForward.as_dict`` writes it (a real run retrains
    per refit, minutes here): the evaluation's own segment as the pool, two refits."""
    import pandas as pd

    from alchemetric_ray.api.evaluation import CONTENDER_COLUMNS, Evaluation, Verdict
    from alchemetric_ray.signals.contenders import SegmentResult
    from alchemetric_ray.signals.walk_forward import PooledWalkForward, YearRow

    live = evaluated.live
    pool = SegmentResult(**{f.name: getattr(live, f.name) for f in fields(SegmentResult)})
    wf = PooledWalkForward(refit_every=250, window="expanding", refits=2, seconds=12.4, refits_per_minute=9.68,
                           pooled=pool, years=[YearRow(2014, 250, 0.031, 0.001, 0.061, 0.012),
                                               YearRow(2017, live.rows[0].rank_ic.n_days, -0.004, -0.1, 0.09, None)],
                           folds=_fold_rows(live, seconds=True))
    record = _walk_forward_record(live, wf)
    ev = Evaluation.from_record(record, evaluated.folder)
    got = ev.walk_forward
    assert got is not None and got.kind == "pooled"
    assert list(got.pooled.columns) == list(CONTENDER_COLUMNS)
    pd.testing.assert_frame_equal(got.pooled, ev.contenders)  # the same segment scored: the same table
    assert got.verdict == Verdict(live.verdict.signal, live.verdict.edge, live.verdict.line)
    assert tuple(got.segment) == (live.segment.start, live.segment.end)
    assert (got.refits, got.refit_every, got.window, got.seconds) == (2, 250, "expanding", 12.4)
    folds = got.folds
    assert list(folds.columns) == ["fold", "test_start", "test_end", "train_start", "train_end", "normalized_through",
                                   "days", "rank_ic", "sharpe", "best_baseline_rank_ic", "seconds_train",
                                   "seconds_stage", "seconds_predict", "seconds_baselines"]
    assert list(folds["fold"]) == [0, 1] and list(folds["seconds_train"]) == [4.1, 3.9]
    assert folds["test_start"][1] == pd.Timestamp(live.segment.start)
    assert math.isnan(folds["sharpe"][0]) and folds["sharpe"][1] == 0.85  # None: a book that never traded
    assert math.isnan(folds["best_baseline_rank_ic"][1])
    assert list(got.years["year"]) == [2014, 2017] and math.isnan(got.years["best_baseline_rank_ic"][1])
    line = got.line()
    assert line.startswith(f"walk-forward, pooled out of sample {live.segment.start}..{live.segment.end} "
                           f"({live.rows[0].rank_ic.n_days} days, 2 refits every 250 days, 12 s): ")
    assert line.endswith(live.verdict.line)
    text = repr(ev)
    assert line in text.splitlines() and len(text.splitlines()) <= 25
    assert "walk-forward, pooled" in ev._repr_html_()


def test_a_walk_forward_per_fold_reads_as_its_tables(evaluated):
    """``signals.folds``: the section as ``FoldsWalkForward.as_dict`` writes it: one row per fold, the
    mean and spread over the folds, no pooled table."""
    from alchemetric_ray.api.evaluation import Evaluation
    from alchemetric_ray.signals.walk_forward import FoldsWalkForward

    live = evaluated.live
    wf = FoldsWalkForward(folds=_fold_rows(live, seconds=False), rank_ic_mean=0.0135, rank_ic_std=0.0175,
                          sharpe_mean=0.85, sharpe_std=0.0)
    got = Evaluation.from_record(_walk_forward_record(live, wf), evaluated.folder).walk_forward
    assert got is not None and got.kind == "folds" and got.pooled is None and got.verdict is None
    assert list(got.folds.columns) == ["fold", "test_start", "test_end", "train_start", "train_end",
                                       "normalized_through", "days", "rank_ic", "sharpe", "best_baseline_rank_ic"]
    assert list(got.folds["rank_ic"]) == [0.031, -0.004]
    assert (got.rank_ic_mean, got.rank_ic_std, got.sharpe_mean, got.sharpe_std) == (0.0135, 0.0175, 0.85, 0.0)
    assert got.line() == "walk-forward, 2 folds retrained: rank IC 0.0135 ± 0.0175; long-short Sharpe 0.85 ± 0.00"
