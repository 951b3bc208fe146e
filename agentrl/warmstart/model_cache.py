"""Building a cached model directory once, for the built-in models.

Re-exports ``cached(dest, build)``, ``lock`` and ``say`` from ``agentrl.common.cache_entry`` (concurrent
runs never see half a model and never build it twice; a failed build leaves nothing behind) and
``sft_progress`` from ``agentrl.warmstart.progress`` (an SFT build's step, loss and tokens/s, said
every so many steps). Used by the built-in models
(``agentrl.warmstart.default_model``, ``textworld_model``, ``textworld_practice``); does not decide
where entries live or what goes in them.
"""

from __future__ import annotations

from agentrl.common.cache_entry import cached, lock, say
from agentrl.warmstart.progress import sft_progress

__all__ = ["cached", "lock", "say", "sft_progress"]
