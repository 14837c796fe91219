"""``result.json``: what every call writes last into its folder, so that a result outlives the kernel.

``{"format": "alchemetric-ray result", "version": 1, "kind": ..., "created": ..., "result": <record>}``.
"""

from __future__ import annotations

import datetime as _dt

RESULT_FILE = "result.json"
FORMAT = "alchemetric-ray result"
VERSION = 1  # result.json's layout; a reader refuses a newer one in one line


def save_result(folder, result) -> None:
    """``result.json`` into the call's folder (a local folder or object storage), written whole."""
    from alchemetric_ray.storage import locate

    record = {"format": FORMAT, "version": VERSION, "kind": result.kind,
              "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "result": result.record()}
    (locate(folder) / RESULT_FILE).write_json(record)
