"""Training on Ray Train: the resource plan, the per-worker loop, checkpoints, metrics, export."""
