"""The ingest implementation before it was vectorized (bars/cleaning.py, columns.py, files.py, ingest.py
and messages.py as of commit 47e2a96, copied verbatim; only their imports point here): the slow reference
that tests/test_ingest_speed.py holds the fast one equal to."""
