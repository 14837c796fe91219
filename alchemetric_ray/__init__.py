"""alchemetric-ray: train financial deep-learning models on Ray (CUDA, MPS or CPU)."""

import os as _os
import sys as _sys

# PYTORCH_ENABLE_MPS_FALLBACK is read once when torch loads; remember whether it was set in time.
MPS_FALLBACK_AT_IMPORT = _os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK")
TORCH_LOADED_BEFORE_US = "torch" in _sys.modules

__version__ = "0.1.0"
