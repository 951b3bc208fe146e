"""Where agentrl keeps files that outlive a run on this machine.

Owns the cache directory (``$AGENTRL_CACHE``, else ``~/.cache/agentrl``): the built-in model, the
SGLang virtualenv and anything else built once and reused. Does not create it nor decide what goes
in it (each user names its own sub-directory).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$AGENTRL_CACHE`` when set, else ``~/.cache/agentrl`` (not created here)."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))
