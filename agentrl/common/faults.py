"""Fault-injection points for crash tests: SIGKILL this process at a named place.

``AGENTRL_FAULT_KILL="checkpoint_write:2"`` kills the process (SIGKILL, no cleanup, like an OOM
killer or a lost node) the 2nd time it passes ``fault_point("checkpoint_write")``. Several points:
comma-separated. Unset (the normal case) it costs one dict lookup. Points in the code:

* ``checkpoint_write`` — inside ``trainer.checkpoint.save``, after the model and optimizer files are
  in ``step_N.tmp`` and before the ``COMPLETE`` marker and the rename;
* ``after_train_step`` — in the run loop, after an optimizer step and before its ledger line.

Owns only that. The tests and ``bench/bench_faults.py`` decide when and where to kill.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV_VAR = "AGENTRL_FAULT_KILL"
_passes: Counter = Counter()


def _targets() -> dict[str, int]:
    spec = os.environ.get(ENV_VAR, "")
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, n = part.partition(":")
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"{ENV_VAR}: {part!r} is not NAME:N with N >= 1")
        out[name] = int(n)
    return out


def fault_point(name: str) -> None:
    """Count a pass through ``name``; SIGKILL this process if ``AGENTRL_FAULT_KILL`` says so."""
    if ENV_VAR not in os.environ:
        return
    _passes[name] += 1
    if _targets().get(name) == _passes[name]:
        os.kill(os.getpid(), signal.SIGKILL)
