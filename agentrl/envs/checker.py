"""Conformance checks for agentrl envs, for third-party env authors and our own tests.

Usage::

    from agentrl.envs.checker import check_agent_env, assert_agent_env
    problems = check_agent_env("mypkg/Maze-v0")      # or an env instance; [] means conformant
    assert_agent_env(MyEnv())                         # AssertionError listing every problem

What it checks, in order:

1. Gymnasium's own ``check_env`` (spaces, seeding determinism, step API, fresh data per call).
2. ``reset`` info: ``messages`` (well-formed chat, at least one ``user`` message), ``tools``
   (``{"type": "function", "function": {"name", "description", "parameters": {"type": "object",
   "properties": {...}}}}``), ``task`` (JSON-able, with ``id``); the same seed gives the same task.
3. A plain-text (final answer) step returns the documented types, ``info["messages"]`` and
   ``info["tool_stats"]`` (and, if present, ``info["reward_components"]`` maps names to finite
   numbers), and ``areset``/``astep`` agree with ``reset``/``step`` on it.
4. A scripted call of the first tool (arguments synthesized from its schema) gets a ``tool``
   message back and does not end the episode; for ``ToolEnv`` with ``on_bad_call="observe"``, a
   malformed call and an unknown tool are answered too and counted in ``tool_stats``.
5. The eval split (the contract in ``agentrl.envs.base``): an env that declares
   ``has_eval_split = False`` passes; otherwise it must be makeable with ``split="eval"`` (by id:
   ``make(id, **kwargs, split="eval")``; an instance: its class called with ``split="eval"``,
   skipped when the class needs arguments the checker cannot guess) and give other tasks than
   training on the same seeds.

The scripted calls really run the tool (e.g. ``print(1)`` through the python tool). Call from
sync code; inside a running event loop the checks run in a worker thread.
Does not: judge task quality, reward correctness, or anything about tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import numbers
import warnings
from typing import Any

from agentrl.envs.registry import load_entry_point, make, no_split_message, spec
from agentrl.errors import ConfigError

_ROLES = {"system", "user", "assistant", "tool"}
_FINAL = "The answer is 0."


def check_agent_env(env_or_id: Any, *, n_episodes: int = 3, seed: int = 0, **make_kwargs: Any) -> list[str]:
    """Every conformance problem found (see the module docstring); ``[]`` if none."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _check(env_or_id, n_episodes, seed, make_kwargs)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_check, env_or_id, n_episodes, seed, make_kwargs).result()


def assert_agent_env(env_or_id: Any, **kwargs: Any) -> None:
    """``check_agent_env`` that raises AssertionError listing the problems."""
    problems = check_agent_env(env_or_id, **kwargs)
    if problems:
        raise AssertionError("env does not conform:\n- " + "\n- ".join(problems))


def _check(env_or_id: Any, n_episodes: int, seed: int, make_kwargs: dict) -> list[str]:
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    from agentrl.envs.base import STAT_KEYS, AgentEnv  # lazy: pulls in pydantic

    if isinstance(env_or_id, str):
        env = make(env_or_id, **make_kwargs)
    else:
        env = env_or_id
    env = getattr(env, "unwrapped", env)
    problems: list[str] = []
    if not isinstance(env, gymnasium.Env):
        return [f"{type(env).__name__} is not a gymnasium.Env"]
    if not isinstance(env, AgentEnv):
        problems.append(f"{type(env).__name__} is not an agentrl AgentEnv (no areset/astep contract)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's advice (render modes, spec) is not our business
        try:
            check_env(env, skip_render_check=True, skip_close_check=True)
        except Exception as e:
            problems.append(f"gymnasium check_env failed: {type(e).__name__}: {e}")
    for s in range(seed, seed + n_episodes):
        problems += _check_episode(env, s, STAT_KEYS)
    problems += _check_tool_calls(env, seed, STAT_KEYS)
    problems += _check_eval_split(env_or_id, env, make_kwargs, seed, n_episodes)
    return list(dict.fromkeys(problems))  # the same problem from several seeds once


def _held_out_env(env_or_id: Any, env: Any, make_kwargs: dict) -> tuple[Any, list[str]]:
    """(the env made with split="eval", problems); (None, []) when it declares no split or cannot be made here."""
    if isinstance(env_or_id, str):
        s = spec(env_or_id)
        declared = s.has_eval_split
        if declared is None:
            declared = getattr(load_entry_point(s.entry_point, s.id), "has_eval_split", None)
        if declared is False:
            return None, []
        try:
            return make(env_or_id, **{**make_kwargs, "split": "eval"}), []
        except ConfigError as e:
            return None, [f"eval split: {e}"]
        except Exception as e:
            return None, [f"eval split: make({env_or_id!r}, split='eval') raised {type(e).__name__}: {e}"]
    cls = type(env)
    if getattr(cls, "has_eval_split", None) is False:
        return None, []
    try:
        return cls(split="eval"), []
    except TypeError as e:
        if "'split'" in str(e):
            return None, [f"eval split: {no_split_message(cls.__name__, 'eval')}"]
        return None, []  # the class needs arguments the checker cannot guess: check it by id instead
    except Exception as e:
        return None, [f"eval split: {cls.__name__}(split='eval') raised {type(e).__name__}: {e}"]


def _check_eval_split(env_or_id: Any, env: Any, make_kwargs: dict, seed: int, n: int) -> list[str]:
    held, problems = _held_out_env(env_or_id, env, make_kwargs)
    if held is None:
        return problems
    try:
        same = []
        for s in range(seed, seed + max(n, 1)):
            train_task, eval_task = env.reset(seed=s)[1].get("task"), held.reset(seed=s)[1].get("task")
            same.append(train_task == eval_task)
    except Exception as e:
        return [f"eval split: reset of the split='eval' env raised {type(e).__name__}: {e}"]
    finally:
        held.close()
    if all(same):
        return [
            f"eval split: split='eval' gives the same tasks as training on seeds {seed}..{seed + max(n, 1) - 1}; "
            "held-out tasks must differ (or declare has_eval_split = False)"
        ]
    return []


def _messages_problems(messages: Any, where: str, need_user: bool) -> list[str]:
    if not isinstance(messages, list):
        return [f"{where} must be a list of messages, got {type(messages).__name__}"]
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            out.append(f"{where}[{i}] must be a dict with role in {sorted(_ROLES)} and str content, got {m!r:.120}")
    if need_user and not any(isinstance(m, dict) and m.get("role") == "user" for m in messages):
        out.append(f"{where} has no user message")
    return out


def _schema_problems(tools: Any) -> list[str]:
    if not isinstance(tools, list):
        return [f"reset info['tools'] must be a list of tool schemas, got {type(tools).__name__}"]
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        if not (
            isinstance(t, dict)
            and t.get("type") == "function"
            and isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and fn["name"]
            and isinstance(fn.get("description"), str)
            and isinstance(params, dict)
            and params.get("type") == "object"
            and isinstance(params.get("properties", {}), dict)
        ):
            out.append(
                f"reset info['tools'][{i}] is not a function schema "
                "{type: function, function: {name, description, parameters: {type: object, properties}}}: "
                f"{t!r:.160}"
            )
    return out


def _step_problems(result: Any, where: str, stat_keys: tuple) -> list[str]:
    if not isinstance(result, tuple) or len(result) != 5:
        return [f"{where} must return (obs, reward, terminated, truncated, info)"]
    obs, reward, term, trunc, info = result
    out = []
    if not isinstance(obs, str):
        out.append(f"{where} obs must be str, got {type(obs).__name__}")
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
        out.append(f"{where} reward must be a finite float, got {reward!r}")
    if not isinstance(term, bool) or not isinstance(trunc, bool):
        out.append(f"{where} terminated/truncated must be bools, got {term!r}, {trunc!r}")
    if not isinstance(info, dict):
        return out + [f"{where} info must be a dict"]
    out += _messages_problems(info.get("messages"), f"{where} info['messages']", need_user=False)
    stats = info.get("tool_stats")
    if not isinstance(stats, dict) or not all(isinstance(stats.get(k), int) for k in stat_keys[:5]):
        out.append(f"{where} info['tool_stats'] must be a dict with int {', '.join(stat_keys[:5])}; got {stats!r:.120}")
    comps = info.get("reward_components")
    if comps is not None and not (isinstance(comps, dict) and all(map(_component_ok, comps.items()))):
        out.append(f"{where} info['reward_components'] must map names to finite numbers; got {comps!r:.120}")
    return out


def _component_ok(item: tuple) -> bool:
    name, v = item
    if not isinstance(name, str) or not name or isinstance(v, bool) or not isinstance(v, numbers.Real):
        return False
    return math.isfinite(v)


def _comparable(result: tuple) -> tuple:
    obs, reward, term, trunc, info = result
    return obs, float(reward), term, trunc, info.get("messages"), info.get("tool_stats")


def _check_episode(env: Any, s: int, stat_keys: tuple) -> list[str]:
    try:
        obs, info = env.reset(seed=s)
        _, info2 = env.reset(seed=s)
    except Exception as e:
        return [f"reset(seed={s}) raised {type(e).__name__}: {e}"]
    out = []
    if not isinstance(obs, str):
        out.append(f"reset obs must be str, got {type(obs).__name__}")
    if not isinstance(info, dict):
        return out + ["reset info must be a dict"]
    out += _messages_problems(info.get("messages"), "reset info['messages']", need_user=True)
    out += _schema_problems(info.get("tools"))
    task = info.get("task")
    if not isinstance(task, dict) or "id" not in task:
        out.append(f"reset info['task'] must be a dict with an 'id', got {task!r:.120}")
    else:
        try:
            json.dumps(task)
        except (TypeError, ValueError) as e:
            out.append(f"reset info['task'] is not JSON-able: {e}")
    if (info.get("task"), info.get("messages")) != (info2.get("task"), info2.get("messages")):
        out.append(f"reset(seed={s}) twice gave different tasks/messages: tasks must be a function of the seed")
    try:
        env.reset(seed=s)
        sync = env.step(_FINAL)
    except Exception as e:
        return out + [f"step({_FINAL!r}) after reset(seed={s}) raised {type(e).__name__}: {e}"]
    out += _step_problems(sync, "step", stat_keys)
    if out or not hasattr(env, "areset") or not hasattr(env, "astep"):
        return out

    async def run_async():
        await env.areset(seed=s)
        return await env.astep(_FINAL)

    try:
        asynced = asyncio.run(run_async())
    except Exception as e:
        return out + [f"areset/astep on seed {s} raised {type(e).__name__}: {e}"]
    out += _step_problems(asynced, "astep", stat_keys)
    if not out and _comparable(sync) != _comparable(asynced):
        out.append(f"astep and step disagree on seed {s}: {_comparable(sync)!r:.200} vs {_comparable(asynced)!r:.200}")
    return out


def _example_args(params: dict) -> dict:
    by_name = {"code": "print(1)", "command": "echo 1"}
    args = {}
    for name in params.get("required", []):
        prop = params.get("properties", {}).get(name, {})
        if "enum" in prop and prop["enum"]:
            args[name] = prop["enum"][0]
            continue
        kind = prop.get("type")
        kind = kind[0] if isinstance(kind, list) else kind
        args[name] = {
            "string": by_name.get(name, "test"),
            "integer": 1,
            "number": 1.0,
            "boolean": True,
            "array": [],
            "object": {},
            "null": None,
        }.get(kind, by_name.get(name, "test"))
    return args


def _check_tool_calls(env: Any, s: int, stat_keys: tuple) -> list[str]:
    try:
        _, info = env.reset(seed=s)
    except Exception:
        return []  # already reported
    tools = info.get("tools") or []
    if not tools or _schema_problems(tools):
        return []
    parser = getattr(env, "parser", "hermes")
    fn = tools[0]["function"]
    if parser == "hermes":
        action = (
            "<tool_call>"
            + json.dumps({"name": fn["name"], "arguments": _example_args(fn["parameters"])})
            + "</tool_call>"
        )
    elif parser == "python_block" and fn["name"] == "python":
        action = "```python\nprint(1)\n```"
    else:
        return []  # no scripted call for an unknown parser
    out = _expect_tool_answer(env, s, action, f"a scripted call of tool {fn['name']!r}", None, stat_keys)
    if parser == "hermes" and getattr(env, "on_bad_call", None) == "observe":
        out += _expect_tool_answer(
            env, s, "<tool_call>{not json</tool_call>", "a malformed call", "malformed", stat_keys
        )
        bad = '<tool_call>{"name": "no_such_tool_xyz", "arguments": {}}</tool_call>'
        out += _expect_tool_answer(env, s, bad, "a call of an unknown tool", "unknown_tool", stat_keys)
    return out


def _expect_tool_answer(env: Any, s: int, action: str, what: str, stat: str | None, stat_keys: tuple) -> list[str]:
    try:
        env.reset(seed=s)
        result = env.step(action)
    except Exception as e:
        return [f"{what} raised {type(e).__name__}: {e}"]
    out = _step_problems(result, f"step({what})", stat_keys)
    if out:
        return out
    _, _, term, _, info = result
    msgs = info["messages"]
    if term:
        out.append(f"{what} ended the episode; tool calls must get an answer and the episode go on")
    if not any(m["role"] == "tool" and m["content"] for m in msgs):
        out.append(f"{what} got no non-empty 'tool' message back: {msgs!r:.200}")
    if stat is not None and info["tool_stats"].get(stat) != 1:
        out.append(f"{what} was not counted in tool_stats[{stat!r}]: {info['tool_stats']!r}")
    return out
