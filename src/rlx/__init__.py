"""rlx: reproducible RL post-training for language models, as a data-versioned DVC pipeline."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlx")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
