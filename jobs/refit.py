"""`ray job submit --working-dir . -- python jobs/refit.py --model models:/NAME@champion --data NEW_BARS
--out REFIT_DIR [--config run.yaml] [key=value ...]`

The nightly refit (k8s/refit-cronjob.yaml runs it in a RayJob): joins the cluster the job runs in
(Ray sets RAY_ADDRESS for submitted jobs) or starts a local Ray; same arguments and the same library
call as `alchemetric-ray refit`. Exit 0 when the champion was promoted or kept (no new bars
included), non-zero on a failure.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alchemetric_ray.cli import run

if __name__ == "__main__":
    run(["refit", *sys.argv[1:]])
