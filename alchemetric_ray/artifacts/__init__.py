"""What a run leaves: checkpoints (``checkpoint``), the run folder and its best complete checkpoint
(``run_folder``), the exported model folder and its loader (``export``), and the folder's ledgers of
looks at the test segment and of the selections behind the model (``ledger``)."""
