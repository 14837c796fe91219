"""`alchemetric-ray refit`: new bars appended, a challenger trained, both scored on the same unseen days,
the challenger promoted only where the gate passes (``refits/run.py``; the gate: ``refits/gate.py``)."""
