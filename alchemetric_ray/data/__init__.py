"""Bars (from ``alchemetric_ray.bars``) -> features and labels -> the per-date pass -> splits ->
Parquet shards + their manifest -> Ray Data loaders (or pyarrow, for a one-worker local run).

Nothing in this package knows about models or devices.
"""
