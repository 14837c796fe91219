"""`ray job submit --working-dir . -- python jobs/train.py [--config run.yaml] [key=value ...]`

Joins the cluster the job runs in (Ray sets RAY_ADDRESS for submitted jobs) or starts a local
Ray; same arguments and the same library call as `alchemetric-ray train`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alchemetric_ray.cli import run

if __name__ == "__main__":
    run(["train", *sys.argv[1:]])
