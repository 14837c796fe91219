"""`ray job submit --working-dir . -- python jobs/predict.py --model DIR --data DIR --out signals.parquet`

Same arguments and the same library call as `alchemetric-ray predict`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alchemetric_ray.cli import run

if __name__ == "__main__":
    run(["predict", *sys.argv[1:]])
