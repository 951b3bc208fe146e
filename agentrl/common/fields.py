"""``doc()``: the documented dataclass field every config class in agentrl uses.

Kept apart from ``agentrl.config.schema`` so that config classes living beside their owners (e.g.
``agentrl.trainer.config``) can use it without importing the whole config tree.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def doc(default: Any, text: str, **kw: Any) -> Any:
    """A dataclass field with a one-line doc (shown by ``agentrl config --docs``); ``min``/``max``
    keywords are range checks applied by the config loader."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": text, **kw})
    return field(default=default, metadata={"doc": text, **kw})
