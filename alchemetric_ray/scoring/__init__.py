"""Scoring a model on a split: its outputs over the shards' rows (``predictions``), the metrics of a
validation or test segment and the rule of which way each one is better (``metrics``), and the
baselines an exported model is compared with (``baselines``)."""
