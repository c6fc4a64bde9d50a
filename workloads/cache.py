"""Where generated data sets are kept between runs: one folder for every runner.

The simulator (``gossipnet sim``) and the local swarm launcher (``gossipnet launch``) both
generate MNIST-1D once per argument set and read it back from this folder afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Where generated data sets are kept: ``$GOSSIPNET_CACHE`` if set, else
    ``$XDG_CACHE_HOME/gossipnet`` (``~/.cache/gossipnet``); a leading ``~`` is expanded."""
    explicit = os.environ.get("GOSSIPNET_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gossipnet"
