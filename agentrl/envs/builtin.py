"""Built-in environments and what importing ``agentrl.envs`` registers (cheaply: entry points are
strings, no env code runs).

Owns: the table of built-in envs and their registration in agentrl's registry (ids
``CodeExec-v0`` with alias ``code_exec``, ``Noop-v0`` with alias ``noop``, ``Concise-v0`` with alias
``concise``, ``TextWorld-v0`` with alias ``textworld``, ``BashFix-v0`` with alias ``bash_fix``), mirrored
into Gymnasium's as ``agentrl/CodeExec-v0``, ``agentrl/Noop-v0``, ``agentrl/Concise-v0``,
``agentrl/TextWorld-v0``, ``agentrl/BashFix-v0``
(aliases are not mirrored); and reading the installed packages' ``agentrl.envs`` entry points at
import (``registry.discover``), so their ids are known to
``gymnasium.make`` once ``agentrl.envs`` is imported. Which built-ins have held-out tasks: ``CodeExec-v0``,
``TextWorld-v0`` and ``BashFix-v0`` take ``split``; ``Noop-v0`` and ``Concise-v0`` declare ``has_eval_split=False``.
The env code lives in the submodules: ``base`` (AgentEnv, ToolEnv, TextSpace), ``code_exec``,
``noop``, ``concise``, ``textworld``, ``bash_fix``, ``bash_tasks``, ``tasks``, ``datasets``, ``rewards``.
Also registered: skyrl-gym's envs
through ``agentrl.envs.adapters.skyrl_gym`` (``skyrl/<id>`` for skyrl-gym's own ids, ``skyrl`` for any;
``pip install 'agentrl[skyrl]'``), with held-out tasks (``split``).
"""

from __future__ import annotations

from agentrl.envs.recipes import TEXTWORLD
from agentrl.envs.registry import discover, register

#: name -> (entry point, max_turns hint, aliases, has_eval_split)
BUILTINS: dict[str, tuple[str, int | None, tuple[str, ...], bool | None]] = {
    "CodeExec-v0": ("agentrl.envs.code_exec:CodeExecEnv", 8, ("code_exec",), True),
    "Noop-v0": ("agentrl.envs.noop:NoopEnv", None, ("noop",), False),
    "Concise-v0": ("agentrl.envs.concise:ConciseEnv", None, ("concise",), False),
    "TextWorld-v0": ("agentrl.envs.textworld:TextWorldEnv", 40, ("textworld",), True),
    "BashFix-v0": ("agentrl.envs.bash_fix:BashFixEnv", 8, ("bash_fix",), True),
}

#: skyrl-gym's env ids, served as ``skyrl/<id>`` by ``agentrl.envs.adapters.skyrl_gym`` (max_turns
#: hint: the env's own default); ``skyrl`` takes ``env_id=`` or each dataset row's ``env_class``
SKYRL_IDS: dict[str, int] = {
    "gsm8k": 1,
    "gsm8k_multi_turn": 5,
    "aime": 1,
    "lcb": 1,
    "text2sql": 5,
    "search": 2,
    "searchcode": 2,
}
_SKYRL_EP = "agentrl.envs.adapters.skyrl_gym:SkyRLGymEnv"
register("skyrl", _SKYRL_EP, source="builtin", has_eval_split=True, gym_id=None)
for _id, _max_turns in SKYRL_IDS.items():
    register(
        f"skyrl/{_id}", _SKYRL_EP, max_turns=_max_turns, source="builtin", has_eval_split=True, gym_id=None, env_id=_id
    )

register(
    "verifiers", "agentrl.envs.adapters.verifiers_env:VerifiersEnv", source="builtin", has_eval_split=True, gym_id=None
)
#: name -> its run recipe (``agentrl.envs.recipes``), shared by its aliases
RECIPES: dict[str, dict] = {"TextWorld-v0": TEXTWORLD}
for _name, (_ep, _max_turns, _aliases, _split) in BUILTINS.items():
    _common = dict(max_turns=_max_turns, source="builtin", has_eval_split=_split, run_defaults=RECIPES.get(_name))
    register(_name, _ep, gym_id=f"agentrl/{_name}", **_common)
    for _id in _aliases:
        register(_id, _ep, gym_id=None, **_common)

discover()
