"""Scoring a model on a split: its outputs over the shards' rows (``predictions``), the metrics of a
validation or test segment (``metrics``), the run's objective: its loss, the metric that selects its
best and which way that metric is better (``objective``), and the baselines an exported model is
compared with (``baselines``)."""
