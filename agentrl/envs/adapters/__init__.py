"""Adapters that run environments written for other trainers as agentrl envs: ``skyrl_gym``
(skyrl-gym's text envs, ids ``skyrl/<id>`` and ``skyrl``) with its built-in task sample
(``skyrl_sample``). Importing this package imports no peer package; the adapters do, when an env
is made."""

from agentrl.envs.adapters.skyrl_gym import DEFAULT_STOPS, SkyRLGymEnv

__all__ = ["DEFAULT_STOPS", "SkyRLGymEnv"]
