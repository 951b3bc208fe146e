"""The algorithm registries by kind, and ``lookup(kind, name)`` (see :mod:`agentrl.algos` for every entry)."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from agentrl.algos.advantages import ADVANTAGES
from agentrl.algos.credit import CREDIT
from agentrl.algos.distillation import DISTILLATION
from agentrl.algos.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from agentrl.algos.rollout_correction import ROLLOUT_CORRECTIONS
from agentrl.errors import ConfigError

REGISTRIES: dict[str, dict[str, Callable]] = {
    "advantage": ADVANTAGES,
    "credit": CREDIT,
    "policy_loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "kl": KL_ESTIMATORS,
    "rollout_correction": ROLLOUT_CORRECTIONS,
    "distillation": DISTILLATION,
}


def lookup(kind: str, name: str) -> Callable:
    """``REGISTRIES[kind][name]``; an unknown kind or name raises ConfigError naming the choices."""
    reg = REGISTRIES.get(kind)
    if reg is None:
        raise ConfigError(f"unknown algorithm registry {kind!r}; choose one of {sorted(REGISTRIES)}")
    fn = reg.get(name)
    if fn is None:
        close = difflib.get_close_matches(name, list(reg), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown {kind} {name!r}{hint}; choose one of {sorted(reg)}")
    return fn
