"""What a run leaves: checkpoints (``checkpoint``), the run folder and its best complete checkpoint
(``run_folder``), the exported model folder and its loader (``export``), its ``meta.json`` as a typed
record (``model_meta``) and its card for people (``model_card``), and the folder's ledgers of looks
at the test segment and of the selections behind the model (``ledger``)."""
