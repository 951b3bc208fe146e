"""Oracle tool-use demonstrations of ``code_exec``: token-exact, for any chat template, checked.

Owns:

* ``make_demonstrations``: oracle trajectories produced by the *real* ``EpisodeManager`` and env (the
  real python tool runs every program) with a scripted ``FakeEngine`` whose "policy" writes the
  reference turns as token ids. A demonstration therefore has exactly the token layout RL sees with
  this tokenizer (its chat template and ``model.tool_prompt`` choice): prompt ids, sampled-turn ids
  (mask 1), observation deltas (mask 0). Turn 1 calls the tool with the task's reference
  ``solution``; turn 2 gives the reference answer as ``\\boxed{..}`` (or, for function tasks, the
  function in a code block). A ``direct`` task is answered at once, without the tool.
* the checks each demonstration must pass (``check_demonstration``): the episode ended ``ok``, the
  env read turn 1 as a tool call, the tool printed the reference answer, the env scored 1. The first
  failure is a ``DemonstrationError`` naming the demonstration, the check, the tool's output tail
  and how many failed (``demonstration_examples``).
* ``OracleSandbox`` (the reference programs run in-process) and ``demo_tasks``.

The oracle never reads the rendered text: it finds its episode by the engine call's session (the
episode id) and counts its turns, and each reply ends with the template's own end-of-turn token
(``ChatRenderer.end_of_turn_id``), so no template's markup (``<|im_start|>``, ``<tool_response>``)
is assumed. Why the answer is written from the task and checked against the tool's output, instead of
read from the transcript: reading it would mean parsing each template's rendering of a tool message.

Does not: train (``agentrl.warmstart.sft``), or make TextWorld demonstrations
(``agentrl.warmstart.textworld_demos``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from agentrl.engine.fake import FakeEngine
from agentrl.episodes.chat import ChatRenderer
from agentrl.episodes.config import RolloutConfig
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
from agentrl.errors import DemonstrationError, EngineError, SandboxError, TemplateError
from agentrl.sandbox.base import ExecResult, Sandbox
from agentrl.warmstart.chat_data import SFTExample

_TAIL = 300  # characters of a tool's output an error quotes


class OracleSandbox(Sandbox):
    """Runs the oracle's own reference programs (``python3 -`` with the code on stdin) *in this
    process* with ``exec`` and returns what a sandbox would: their real stdout/stderr and exit code,
    as an ``ExecResult``. Spawning a process per demonstration would make data generation, not
    training, the cost of the warm start. Only for trusted code we generated: it isolates nothing,
    has no deadline and no output cap. ``tests/warmstart/test_sft.py`` checks that demonstrations made with it
    are token-identical to ones made with a real sandbox. It cannot grade difficulty-5 tasks (their
    unit tests run as a file): ``build_sft_config`` refuses that pairing, and such episodes end
    ``sandbox_error``; use ``demo_sandbox='env'`` for them."""

    name = "oracle"

    async def run(self, argv, *, stdin: bytes | None = None, timeout_s: float, files=None, **_: Any):
        import contextlib
        import io
        import time
        import traceback

        if list(argv)[-1:] != ["-"] or files:
            raise SandboxError(f"OracleSandbox only runs python programs given on stdin, not {list(argv)!r}")
        out, err, code = io.StringIO(), io.StringIO(), 0
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(
                    compile((stdin or b"").decode("utf-8", "surrogatepass"), "<stdin>", "exec"),
                    {"__name__": "__main__"},
                )
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
        return ExecResult(
            stdout=out.getvalue(), stderr=err.getvalue(), exit_code=code, status="ok", wall_s=time.perf_counter() - t0
        )


def oracle_turn(task: dict, turn: int, observation: str | None, parser: str = "hermes", direct: bool = False) -> str:
    """The reference assistant turn ``turn`` (0 = the tool call, 1 = the final answer) for ``task``;
    ``direct=True``: turn 0 is the final answer itself (the task's known answer, no tool call).
    ``observation`` (what the tool printed) is the answer of turn 1; None: the task's ``answer``."""
    code = task["solution"]
    if direct and turn == 0:
        if task.get("tests"):
            return f"```python\n{task['solution']}\n```"
        return f"The answer is \\boxed{{{task['answer']}}}."
    if turn == 0:
        if task.get("tests"):  # a function task: define it and try it on the first test's call
            call = task["tests"][0].removeprefix("assert ").rsplit(" == ", 1)[0]
            code = f"{code}\n\nprint({call})"
        if parser == "python_block":
            return f"```python\n{code}\n```"
        return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"
    if task.get("tests"):
        if parser == "python_block":  # a block would be run, not read: the last code run is the answer
            return f"The function `{task['entry_point']}` I ran above is my solution."
        return f"```python\n{task['solution']}\n```"
    answer = task["answer"] if observation is None else observation
    return f"The answer is \\boxed{{{str(answer).strip()}}}."


def _session(i: int) -> str:
    # the episode manager's episode id for spec i (group "demo-i", sample 0): the session it generates under
    return f"demo-{i}-0"


def _oracle_policy(tokenizer, tasks: list[dict], parser: str, end_of_turn: int):
    """A FakeEngine policy writing ``oracle_turn``s: the episode is found by its session, the turn by
    counting that session's calls; every reply ends with ``end_of_turn``."""
    by_session = {_session(i): t for i, t in enumerate(tasks)}
    turns: dict[str, int] = {}

    def policy(prompt_ids, params, ctx):
        task = by_session.get(ctx.session)
        if task is None:
            raise EngineError(f"the oracle has no demonstration for session {ctx.session!r}")
        turn = turns[ctx.session] = turns.get(ctx.session, -1) + 1
        reply = oracle_turn(task, turn, None, parser, bool(task.get("direct")))
        return list(tokenizer.encode(reply, add_special_tokens=False)) + [end_of_turn]

    return policy


def demo_tasks(
    n: int, difficulty: int | list[int] = (1, 2, 3, 4), seed: int = 0, direct_frac: float = 0.0
) -> list[dict]:
    """``n`` train-split procedural tasks, difficulties cycled (never a held-out prompt); a seeded
    ``direct_frac`` of them marked ``"direct": True`` (demonstrated without the tool)."""
    import random

    from agentrl.envs import tasks  # lazy: pulls in gymnasium

    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    rng = random.Random(seed)
    out = [tasks.generate_task(seed * 1_000_003 + i, levels[i % len(levels)], "train") for i in range(n)]
    return [{**t, "direct": True} if rng.random() < direct_frac else t for t in out]


def _tail(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]


def check_demonstration(traj, task: dict, parser: str = "hermes") -> str | None:
    """None when ``traj`` is a good demonstration of ``task``, else the check it failed, in words."""
    outcome = getattr(traj.outcome, "value", traj.outcome)
    if outcome != "ok":
        return f"the episode ended {outcome}: {_tail(traj.outcome_detail)}"
    roles = [m.get("role") for m in traj.messages]
    tool_outputs = [m.get("content", "") for m in traj.messages if m.get("role") == "tool"]
    if not task.get("direct"):
        if not tool_outputs:
            return (
                f"the env's {parser!r} tool-call parser found no tool call in the demonstrated call "
                f"(the conversation's roles were {roles})"
            )
        if task.get("answer") is not None and str(tool_outputs[0]).strip() != str(task["answer"]).strip():
            return (
                f"the python tool ran the reference solution and returned {_tail(tool_outputs[0])!r}, "
                f"not the reference answer {task['answer']!r}"
            )
    if traj.reward != 1.0:
        got = f"; the tool returned {_tail(tool_outputs[-1])!r}" if tool_outputs else ""
        return f"the env scored the reference answer {traj.reward:g}, not 1{got}"
    return None


@dataclass
class DemoRun:
    """What ``run_demonstrations`` made: the good trajectories (in task order) and the failures as
    (task index, check failed)."""

    good: list[Any]
    failed: list[tuple[int, str]]


async def run_demonstrations(
    tokenizer, tasks: list[dict], *, env_kwargs: dict | None = None, max_concurrency: int = 16
) -> DemoRun:
    """Oracle ``Trajectory``s for ``tasks`` on ``code_exec`` (see the module docstring), each checked."""
    from agentrl.envs.registry import make  # lazy: pulls in gymnasium

    kwargs = dict(env_kwargs or {})
    parser = kwargs.get("parser") or "hermes"
    end = ChatRenderer(tokenizer).end_of_turn_id
    if end is None:
        raise TemplateError(
            "oracle demonstrations: the chat template does not end an assistant turn with a special token, "
            "so no demonstration can end its turn the way the model must (run `agentrl check-template`)"
        )
    engine = FakeEngine(_oracle_policy(tokenizer, tasks, parser, end), logprob=0.0)
    cfg = RolloutConfig(max_turns=3, max_concurrency=max_concurrency, max_new_tokens=4096, max_context=1 << 20)
    manager = EpisodeManager(engine, lambda: make("code_exec", **kwargs), tokenizer, cfg, env_id="code_exec")
    specs = [EpisodeSpec(f"demo-{i}", 0, i, options={"task": t}) for i, t in enumerate(tasks)]
    index = {_session(i): i for i in range(len(tasks))}
    trajs = sorted(await manager.collect(specs), key=lambda t: index[t.episode_id])
    good, failed = [], []
    for traj in trajs:
        i = index[traj.episode_id]
        why = check_demonstration(traj, tasks[i], parser)
        if why is None:
            good.append(traj)
        else:
            failed.append((i, why))
    return DemoRun(good, failed)


async def make_demonstrations(
    tokenizer, tasks: list[dict], *, env_kwargs: dict | None = None, max_concurrency: int = 16
) -> list[Any]:
    """The demonstrations of ``tasks`` that pass ``check_demonstration`` (a demonstration is always a
    success), in task order."""
    run = await run_demonstrations(tokenizer, tasks, env_kwargs=env_kwargs, max_concurrency=max_concurrency)
    return run.good


def run_sync(coro):
    """``asyncio.run`` that also works when called from inside a running loop (e.g. a run's setup)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def failure_message(tasks: list[dict], failed: list[tuple[int, str]], sandbox: str) -> str:
    """One paragraph: how many failed, and the first failure (its task, the check, the tool's output)."""
    i, why = failed[0]
    t = tasks[i]
    how = "answered directly" if t.get("direct") else "with the python tool"
    return (
        f"{len(failed)} of {len(tasks)} oracle demonstrations failed their checks (sft.demo_sandbox={sandbox!r}); "
        f"the first, demonstration {i} (task {t.get('id')!r}, difficulty {t.get('difficulty')}, {how}): {why}"
    )


def demonstration_examples(
    tokenizer,
    n: int,
    *,
    difficulty: int | list[int] = (1, 2, 3, 4),
    seed: int = 0,
    direct_frac: float = 0.0,
    env_kwargs: dict | None = None,
    sandbox: str = "env",
) -> list[SFTExample]:
    """``n`` demonstrations as ``SFTExample``s (token ids and loss mask straight from the
    trajectories). Any failed check is a ``DemonstrationError`` (``failure_message``); ``sandbox``
    names the ``sft.demo_sandbox`` in use for it."""
    tasks = demo_tasks(n, difficulty, seed, direct_frac)
    run = run_sync(run_demonstrations(tokenizer, tasks, env_kwargs=env_kwargs, max_concurrency=64))
    if run.failed:
        raise DemonstrationError(failure_message(tasks, run.failed, sandbox))
    return [SFTExample(list(t.token_ids), list(t.loss_mask), f"demo:{t.task.get('id', '')}") for t in run.good]
