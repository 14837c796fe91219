"""Pick the bars source named by the config: files, the packaged stocknet prices, the built-in sample data,
or a synthetic market."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import pandas as pd

from alchemetric_ray.bars.report import IngestReport
from alchemetric_ray.config import DataConfig


@dataclass
class Source:
    kind: str
    description: str
    bars: Iterator[tuple[str, pd.DataFrame]]
    report: IngestReport | None = None  # the ingest report for files


def open_source(data: DataConfig, *, min_history: int = 0) -> Source:
    kind = "files" if data.path else data.source
    return _OPENERS.get(kind, _builtin)(data, min_history)


def _files(data: DataConfig, min_history: int) -> Source:
    if not data.path:
        from alchemetric_ray.errors import DataError

        raise DataError("data.source=files needs data.path (or --data DIR)")
    return _ingested("files", data.path, f"OHLCV files from {data.path}", data, min_history)


def _stocknet(data: DataConfig, min_history: int) -> Source:
    """A long table shipped with the package: the same ingest as a user's files."""
    from alchemetric_ray.bars.stocknet import DESCRIPTION, prices_path

    return _ingested("stocknet", prices_path(), DESCRIPTION, data, min_history)


def _ingested(kind: str, path, description: str, data: DataConfig, min_history: int) -> Source:
    from alchemetric_ray.bars.ingest import iter_bars

    report = IngestReport()
    bars = iter_bars(path, tickers=data.tickers, min_history=min_history, report=report,
                     on_duplicate=data.on_duplicate)
    return Source(kind, description, bars, report)


def _synthetic(data: DataConfig, min_history: int) -> Source:
    from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars

    market = SyntheticMarket(n_tickers=data.synthetic_tickers, n_days=data.synthetic_days,
                             effect=data.synthetic_effect, seed=data.seed,
                             momentum_window=data.synthetic_effect_window, effect_lag=data.synthetic_effect_lag)
    bars = synthetic_bars(market)
    if data.tickers:
        wanted = set(data.tickers)
        bars = ((t, b) for t, b in bars if t in wanted)
    return Source("synthetic", f"synthetic market ({market})", bars)


def _builtin(data: DataConfig, min_history: int) -> Source:
    from alchemetric_ray.bars.builtin import BUILTIN_DESCRIPTION, builtin_bars

    bars = builtin_bars()
    if data.tickers:
        wanted = {t.upper() for t in data.tickers}
        bars = ((t, b) for t, b in bars if t.upper() in wanted)
    return Source("builtin", BUILTIN_DESCRIPTION, bars)


# By kind: "files" where data.path is set, else data.source; any other kind gets the built-in sample data.
_OPENERS: dict[str, Callable[[DataConfig, int], Source]] = {
    "files": _files, "stocknet": _stocknet, "synthetic": _synthetic, "builtin": _builtin,
}
