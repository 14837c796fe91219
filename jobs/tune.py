"""`ray job submit --working-dir . -- python jobs/tune.py --config sweep.yaml [key=value ...]`

Same arguments and the same library call as `alchemetric-ray tune`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alchemetric_ray.cli import run

if __name__ == "__main__":
    run(["tune", *sys.argv[1:]])
