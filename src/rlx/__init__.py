"""rlx: reproducible RL post-training for language models, as a data-versioned DVC pipeline."""

import os
from importlib.metadata import PackageNotFoundError, version

# OpenMP threads that finish a parallel region sleep instead of spinning: `rlx fit` records each step
# in DVC from a low-priority process that only gets the cores generation and training leave idle,
# and spinning threads leave none. Read once, when torch loads; set it yourself to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    __version__ = version("rlx")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
