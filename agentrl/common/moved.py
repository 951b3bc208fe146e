"""Forwarding old module paths to where the code lives now, for one release.

A forwarding module is two lines (``forward(__name__, "agentrl.new.path")``): importing the old path
warns once with a ``DeprecationWarning`` naming the new one and yields the new module itself, so
``from agentrl.tooling import tool`` and ``monkeypatch.setattr("agentrl.tooling.x", ...)`` keep working.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def forward(old: str, new: str) -> None:
    """Make module ``old`` an alias of module ``new`` (call at the top of the old module)."""
    warnings.warn(f"{old} moved to {new}; the old path works until agentrl 0.3", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
