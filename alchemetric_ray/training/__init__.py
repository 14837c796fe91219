"""The run itself: the TorchTrainer and its one per-worker loop (in a worker group, a Tune trial's
process or this process), the loop's runtime, losses and phase records, and its checks (the known-bug
table's trace, the in-run shadow check)."""
