"""Facts about this process, noted when the package is first imported (before anything loads torch)."""

import os
import sys

# PYTORCH_ENABLE_MPS_FALLBACK is read once when torch loads; remember whether it was set in time.
MPS_FALLBACK_AT_IMPORT = os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK")
TORCH_LOADED_BEFORE_US = "torch" in sys.modules

VERSION = "0.1.0"
