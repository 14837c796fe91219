"""Pick the bars source named by the config: files, the packaged stocknet prices, the built-in sample data,
or a synthetic market."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pandas as pd

from alchemetric_ray.config import DataConfig


@dataclass
class Source:
    kind: str
    description: str
    bars: Iterator[tuple[str, pd.DataFrame]]
    report: object | None = None  # the ingest report for files


def open_source(data: DataConfig, *, min_history: int = 0) -> Source:
    kind = "files" if data.path else data.source
    if kind in ("files", "stocknet"):
        from alchemetric_ray.bars.ingest import IngestReport, iter_bars

        if kind == "stocknet":  # a long table shipped with the package: the same ingest as a user's files
            from alchemetric_ray.bars.stocknet import DESCRIPTION, prices_path

            path, description = prices_path(), DESCRIPTION
        elif not data.path:
            from alchemetric_ray.bars.ingest import DataError

            raise DataError("data.source=files needs data.path (or --data DIR)")
        else:
            path, description = data.path, f"OHLCV files from {data.path}"
        report = IngestReport()
        bars = iter_bars(path, tickers=data.tickers, min_history=min_history, report=report,
                         on_duplicate=data.on_duplicate)
        return Source(kind, description, bars, report)
    if kind == "synthetic":
        from alchemetric_ray.bars.synthetic import SyntheticMarket, synthetic_bars

        market = SyntheticMarket(n_tickers=data.synthetic_tickers, n_days=data.synthetic_days,
                                 effect=data.synthetic_effect, seed=data.seed,
                                 momentum_window=data.synthetic_effect_window, effect_lag=data.synthetic_effect_lag)
        bars = synthetic_bars(market)
        if data.tickers:
            wanted = set(data.tickers)
            bars = ((t, b) for t, b in bars if t in wanted)
        return Source("synthetic", f"synthetic market ({market})", bars)
    from alchemetric_ray.bars.builtin import BUILTIN_DESCRIPTION, builtin_bars

    bars = builtin_bars()
    if data.tickers:
        wanted = {t.upper() for t in data.tickers}
        bars = ((t, b) for t, b in bars if t.upper() in wanted)
    return Source("builtin", BUILTIN_DESCRIPTION, bars)
