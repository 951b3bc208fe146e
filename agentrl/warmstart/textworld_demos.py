"""SFT demonstrations for ``TextWorld-v0``: the oracle planner played through the real episode
manager and env, so every demonstration has exactly the token layout RL sees (prompt ids, sampled
tool-call turns with mask 1, observation deltas with mask 0).

Owns ``textworld_demonstrations``: train-split worlds (never a held-out one), a planner's plan for
each (``"explorer"``: the plan of an agent that acts on what the transcript shows, the default;
``"oracle"``: the shortest plan, which knows where the object hides) written as one Hermes tool
call per turn by a scripted ``FakeEngine`` (which finds its episode's plan from the first user
message, the opening room description), successes only. ``variants`` > 1 plays each world once per
distinct plan of the explorer with its ties broken at random (up to ``variants`` plans): varied
games of the same worlds, whose actions still follow from the transcript. A game may switch
between plans that agree up to its turn, so two games can coincide: common paths weigh more, as
they would in samples of the randomized explorer.
Does not: run the SFT stage (``agentrl.warmstart.sft.run_sft`` takes these examples) or choose the
default model's recipe (``agentrl.warmstart.default_model``, which trains on ``code_exec`` only).
"""

from __future__ import annotations

import re

from agentrl.engine.fake import FakeEngine
from agentrl.episodes.config import RolloutConfig
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
from agentrl.warmstart.chat_data import SFTExample
from agentrl.warmstart.sft import _run_sync  # works inside a running loop too (a run's setup)

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)
_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)


def demo_worlds(n: int, difficulty: int | list[int] = 2, seed: int = 0) -> list[dict]:
    """``n`` train-split TextWorld tasks with distinct opening descriptions, difficulties cycled."""
    from agentrl.envs.textworld import generate_world  # lazy: pulls in gymnasium

    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    out, seen, i = [], set(), 0
    while len(out) < n:
        level = levels[len(out) % len(levels)]
        w = generate_world(seed * 1_000_003 + i, level, "train")
        i += 1
        if w.look() not in seen:
            seen.add(w.look())
            out.append(
                {
                    "id": w.task_id,
                    "seed": seed * 1_000_003 + i - 1,
                    "difficulty": level,
                    "split": "train",
                    "goal": w.goal_text(),
                }
            )
    return out


PLANNERS = ("explorer", "oracle")


def _planner(name: str):
    from agentrl.envs.textworld import oracle_actions  # lazy: pulls in gymnasium
    from agentrl.envs.textworld.explorer import explorer_actions  # lazy: pulls in gymnasium

    if name not in PLANNERS:
        raise ValueError(f"TextWorld demonstrations: planner must be one of {PLANNERS}, got {name!r}")
    return explorer_actions if name == "explorer" else oracle_actions


def _plans(world, planner: str, variants: int, seed: int) -> list[list[str]]:
    """Up to ``variants`` distinct plans of ``world`` as Hermes call texts: the planner's own first,
    then the explorer's with random tie-breaks (seeded by ``seed`` and the world)."""
    import random

    from agentrl.envs.textworld import hermes_call  # lazy: pulls in gymnasium
    from agentrl.envs.textworld.explorer import explorer_actions  # lazy: pulls in gymnasium

    plans = [[hermes_call(a) for a in _planner(planner)(world)]]
    rng = random.Random(f"{seed}/{world.task_id}")
    for _ in range(4 * variants):  # a small world has few distinct orders: stop trying after a while
        if len(plans) >= variants:
            break
        plan = [hermes_call(a) for a in explorer_actions(world, rng)]
        if plan not in plans:
            plans.append(plan)
    return plans


async def _demonstrations(tokenizer, tasks: list[dict], max_concurrency: int, planner: str, variants: int = 1):
    from agentrl.envs.textworld import TextWorldEnv, generate_world  # lazy: pulls in gymnasium

    plans, episodes = {}, []
    for t in tasks:
        w = generate_world(t["seed"], t["difficulty"], t["split"])
        plans[w.look()] = _plans(w, planner, variants, t["seed"])
        episodes += [(t, v) for v in range(len(plans[w.look()]))]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def policy(prompt_ids, params, ctx):
        text = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        done = [m.strip() for m in _ASSISTANT.findall(text)]
        # the plans of this world that the transcript so far follows; the sampling seed picks one
        # (a different one per episode of the same world), so a game may switch between plans that
        # agree up to here and its calls stay those of a plan with this very prefix
        fits = [p for p in plans[_USER.search(text).group(1)] if p[: len(done)] == done]
        plan = fits[(params.seed or 0) % len(fits)]
        return list(tokenizer.encode(plan[len(done)], add_special_tokens=False)) + [end]

    cfg = RolloutConfig(max_turns=40, max_concurrency=max_concurrency, max_new_tokens=512, max_context=1 << 20)
    manager = EpisodeManager(FakeEngine(policy, logprob=0.0), TextWorldEnv, tokenizer, cfg, env_id="textworld")
    specs = [EpisodeSpec(f"demo-{i}", 0, i, sampling_seed=v, options={"task": t}) for i, (t, v) in enumerate(episodes)]
    trajs = await manager.collect(specs)
    return [t for t in trajs if t.outcome.value == "ok" and t.reward == 1.0]


def textworld_demonstrations(
    tokenizer,
    n: int,
    *,
    difficulty: int | list[int] = 2,
    seed: int = 0,
    max_concurrency: int = 16,
    planner: str = "explorer",
    variants: int = 1,
) -> list[SFTExample]:
    """Demonstrations of ``planner`` on ``n`` worlds as ``SFTExample``s: one per world (fewer if any
    failed), or up to ``variants`` games per world (see the module docstring)."""
    _planner(planner)  # a bad name fails before any world is made
    if not isinstance(variants, int) or variants < 1:
        raise ValueError(f"TextWorld demonstrations: variants must be an int >= 1, got {variants!r}")
    if variants > 1 and planner != "explorer":
        raise ValueError(f"TextWorld demonstrations: variants > 1 varies the explorer's plans; planner is {planner!r}")
    tasks = demo_worlds(n, difficulty, seed)
    trajs = _run_sync(_demonstrations(tokenizer, tasks, max_concurrency, planner, variants))
    return [SFTExample(list(t.token_ids), list(t.loss_mask), f"demo:{t.task.get('id', '')}") for t in trajs]


def textworld_corpus(renderer, n: int = 300, seed: int = 0) -> list[str]:
    """Text for a tokenizer (``agentrl.warmstart.tiny_model``): ``n`` explorer games on train-split
    worlds of every difficulty, rendered by ``renderer`` (a tokenizer with a chat template) with the
    env's system prompt and tool schemas, as an agent sees them. Plain rendering (no episode
    manager): only the text matters here."""
    from agentrl.envs.textworld import TextWorldEnv, generate_world, hermes_call  # lazy: pulls in gymnasium
    from agentrl.envs.textworld.env import SYSTEM_PROMPT  # lazy: pulls in gymnasium
    from agentrl.envs.textworld.explorer import explorer_actions  # lazy: pulls in gymnasium

    tools = [t.schema() for t in TextWorldEnv().tools]
    out = []
    for i in range(n):
        w = generate_world(seed * 1_000_003 + i, 1 + i % 3, "train")
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": w.look()}]
        for name, args in explorer_actions(w):
            messages.append({"role": "assistant", "content": hermes_call((name, args))})
            messages.append({"role": "tool", "content": w.act(name, **args)})
        out.append(renderer.apply_chat_template(messages, tools=tools, tokenize=False))
    return out
