"""Episode manager tests on a FakeEngine (scripted policy) and real envs/templates."""

import asyncio
import json
import re

from agentrl.config.schema import RolloutConfig
from agentrl.engine.fake import FakeEngine
from agentrl.envs.base import ToolEnv
from agentrl.envs.noop import NoopEnv
from agentrl.episodes.chat import ChatRenderer
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec, make_specs
from agentrl.errors import EngineError
from agentrl.tools.base import Tool
from agentrl.trajectory import Outcome


def _call(name, **args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


class AddEnv(ToolEnv):
    """Task: add numbers with the `add` tool; the final answer is scored against the sum."""

    def __init__(self, **kw):
        async def add(a: int, b: int) -> str:
            """Add two integers.

            Args:
                a: first
                b: second
            """
            return str(a + b)

        self.tools = [Tool(add, name="add")]
        super().__init__(**kw)

    def sample_task(self, rng, options):
        return {"id": int(rng.integers(1000)), "answer": "42"}

    def initial_messages(self, task):
        return [{"role": "system", "content": "You add."}, {"role": "user", "content": f"Task {task['id']}"}]

    async def score(self, task, final_text, transcript):
        return 1.0 if task["answer"] in final_text else 0.0


def test_qwen_template_30_turns_token_exact(tiny_tokenizer):
    tok = tiny_tokenizer
    turns_with_calls = 32
    sampled: list[list[int]] = []

    def policy(prompt_ids, params, ctx):
        k = ctx.call_index
        if k < turns_with_calls:
            text = "Let me compute.\n" + "\n".join(_call("add", a=k, b=j) for j in range(1 + k % 3))
        else:
            text = "The answer is 42."
        ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        sampled.append(ids)
        return ids

    engine = FakeEngine(policy)
    cfg = RolloutConfig(max_turns=40, max_context=100_000, max_new_tokens=512)
    mgr = EpisodeManager(engine, AddEnv, tok, cfg, env_id="add")
    traj = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, task_seed=1)))
    assert traj.outcome == Outcome.OK, traj.outcome_detail
    assert traj.num_turns == turns_with_calls + 1 and traj.reward == 1.0
    traj.validate()

    # ids == prompt + (sampled_k + delta_k)*: rebuild independently from the text log
    r = ChatRenderer(tok, tools=[AddEnv().toolset.get("add").schema()])
    msgs = traj.messages
    first_asst = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    expected = r.prompt_ids(msgs[:first_asst])
    assert traj.token_ids[: traj.prompt_len] == expected
    i, turn = first_asst, 0
    while i < len(msgs):
        assert msgs[i]["role"] == "assistant"
        expected += sampled[turn]
        j = i + 1
        while j < len(msgs) and msgs[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            expected += r.observation_ids(msgs[i + 1 : j])
        i, turn = j, turn + 1
    assert traj.token_ids == expected
    # and the whole sequence is exactly what the template renders for the conversation
    full = tok.apply_chat_template(msgs, tools=r.tools, tokenize=False)
    assert tok.decode(traj.token_ids) + "\n" == full
    # masks: exactly the sampled tokens; versions/turns per token
    assert sum(traj.loss_mask) == sum(map(len, sampled))
    for rec, ids in zip(traj.turns, sampled):
        assert traj.token_ids[rec.start : rec.start + rec.n_sampled] == ids
        assert traj.loss_mask[rec.start : rec.start + rec.n_sampled] == [1] * len(ids)
        assert set(traj.turn_ids[rec.start : rec.start + rec.n_sampled + rec.n_observation]) == {rec.index}
    assert traj.info["tool_stats"]["calls"] == sum(1 + k % 3 for k in range(turns_with_calls))


# ---------------------------------------------------------------------------- faults at scale
FAULTS = ["exception", "exception", "timeout", "malformed", "unknown", "badreward"] + ["none"] * 14
EXPECTED = {
    "exception": Outcome.ENV_ERROR,
    "timeout": Outcome.TOOL_TIMEOUT,
    "malformed": Outcome.OK,
    "unknown": Outcome.OK,
    "badreward": Outcome.REWARD_ERROR,
    "none": Outcome.OK,
    "engine": Outcome.ENGINE_ERROR,
    "engine_crash": Outcome.ENGINE_ERROR,
}


class FaultEnv(ToolEnv):
    def __init__(self, **kw):
        async def work(x: int) -> str:
            """Do work.

            Args:
                x: input
            """
            fault = self._task["fault"]
            if fault == "exception":
                raise RuntimeError("tool blew up")
            if fault == "timeout":
                await asyncio.sleep(60)
            await asyncio.sleep(0.001 * (x % 5))
            return str(x * 2)

        self.tools = [Tool(work, name="work")]
        super().__init__(tool_timeout_s=3.0, **kw)  # generous: 2k episodes share one busy loop

    def sample_task(self, rng, options):
        raise AssertionError("tasks come from options")

    def initial_messages(self, task):
        return [{"role": "user", "content": f"fault={task['fault']} id={task['id']}"}]

    async def score(self, task, final_text, transcript):
        if task["fault"] == "badreward":
            raise ValueError("grader crashed")
        return 1.0


def test_2000_concurrent_episodes_with_injected_faults(tiny_tokenizer):
    tok = tiny_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    n = 2000
    plan = {i: FAULTS[i % len(FAULTS)] for i in range(n)}
    plan[777], plan[1555] = "engine", "engine_crash"

    def policy(prompt_ids, params, ctx):
        text = tok.decode(prompt_ids)
        fault = re.search(r"fault=(\w+) id=(\d+)", text).group(1)
        turn = text.count("<|im_start|>assistant") - 1
        if fault == "engine" and turn == 1:
            raise EngineError("engine fell over")
        if fault == "engine_crash":
            raise ConnectionError("socket closed")
        if turn == 0 and fault == "malformed":
            out = "<tool_call>{not json</tool_call>"
        elif turn == 0 and fault == "unknown":
            out = _call("nope", x=1)
        elif turn < 2:
            out = _call("work", x=turn)
        else:
            out = "done"
        return tok.encode(out, add_special_tokens=False) + [im_end]

    engine = FakeEngine(policy, delay_s=lambda ctx: 0.001 * (ctx.call_index % 7))
    cfg = RolloutConfig(max_turns=6, max_concurrency=n, turn_timeout_s=30)
    mgr = EpisodeManager(engine, FaultEnv, tok, cfg, env_id="fault")
    specs = [EpisodeSpec(f"p{i}", 0, i, options={"task": {"id": i, "fault": plan[i]}}) for i in range(n)]

    async def run():
        return await mgr.collect(specs)

    trajs = asyncio.run(asyncio.wait_for(run(), 120))
    assert len(trajs) == n
    assert len({t.episode_id for t in trajs}) == n  # none lost, none duplicated
    for t in trajs:
        fault = plan[t.task["id"]]
        assert t.outcome == EXPECTED[fault], (t.task, t.outcome, t.outcome_detail)
        t.validate()
        if fault == "malformed":
            assert t.info["tool_stats"]["malformed"] == 1 and t.reward == 1.0
        if fault == "unknown":
            assert t.info["tool_stats"]["unknown_tool"] == 1
        if not t.outcome.trainable:
            assert t.reward == 0.0 and t.outcome_detail
    s = mgr.metrics.summary()
    assert s["episodes"] == n
    assert s["outcomes"]["env_error"] == sum(f == "exception" for f in plan.values())
    assert s["outcomes"]["tool_timeout"] == sum(f == "timeout" for f in plan.values())
    assert s["outcomes"]["engine_error"] == 2
    assert s["tool"]["malformed"] == sum(f == "malformed" for f in plan.values())


# ---------------------------------------------------------------------------- limits
def _noop_manager(tok, policy, n_turns=4, **cfg):
    return EpisodeManager(FakeEngine(policy), lambda: NoopEnv(n_turns=n_turns), tok, RolloutConfig(**cfg))


def _fixed(tok, text, stop=True):
    ids = tok.encode(text, add_special_tokens=False) + ([tok.convert_tokens_to_ids("<|im_end|>")] if stop else [])
    return lambda p, params, ctx: ids


def test_max_turns_truncates(tiny_tokenizer):
    mgr = _noop_manager(tiny_tokenizer, _fixed(tiny_tokenizer, "hi"), n_turns=10, max_turns=3)
    t = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))
    assert t.outcome == Outcome.TRUNCATED_TURNS and t.num_turns == 3
    t.validate()


def test_length_cut_is_truncated_length(tiny_tokenizer):
    mgr = _noop_manager(tiny_tokenizer, _fixed(tiny_tokenizer, "word " * 50, stop=False), max_new_tokens=10)
    t = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))
    assert t.outcome == Outcome.TRUNCATED_LENGTH and t.num_sampled == 10


def test_context_budget_checked_before_request(tiny_tokenizer):
    seen = []

    def policy(p, params, ctx):
        seen.append((len(p), params.max_new_tokens))
        return _fixed(tiny_tokenizer, "x " * 30)(p, params, ctx)

    mgr = _noop_manager(tiny_tokenizer, policy, n_turns=100, max_turns=100, max_context=400, min_turn_tokens=8)
    t = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))
    assert t.outcome in (Outcome.CONTEXT_OVERFLOW, Outcome.TRUNCATED_LENGTH)
    assert len(t.token_ids) <= 400
    assert all(n + m <= 400 for n, m in seen)  # never asked for more than fits


def test_episode_deadline_and_turn_deadline(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = FakeEngine(_fixed(tok, "hi"), delay_s=0.5)
    mgr = EpisodeManager(engine, lambda: NoopEnv(n_turns=50), tok, RolloutConfig(max_turns=50, episode_timeout_s=0.8))
    t = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))
    assert t.outcome == Outcome.DEADLINE and 1 <= t.num_turns <= 2
    mgr = EpisodeManager(engine, lambda: NoopEnv(), tok, RolloutConfig(turn_timeout_s=0.1))
    t = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))
    assert t.outcome == Outcome.ENGINE_ERROR and "deadline" in t.outcome_detail


def test_streams_in_completion_order_and_cancel(tiny_tokenizer):
    tok = tiny_tokenizer

    def delay(ctx):
        return 0.3 if ctx.call_index == 0 else 0.0

    engine = FakeEngine(_fixed(tok, "hi"), delay_s=delay)
    mgr = EpisodeManager(engine, lambda: NoopEnv(n_turns=1), tok, RolloutConfig(max_concurrency=4))

    async def first_two():
        got = []
        async for t in mgr.stream([EpisodeSpec("slow", 0, 0), EpisodeSpec("fast", 0, 1)]):
            got.append(t.group_id)
        return got

    assert asyncio.run(first_two()) == ["fast", "slow"]

    slow = FakeEngine(_fixed(tok, "hi"), delay_s=5.0)
    mgr = EpisodeManager(slow, lambda: NoopEnv(n_turns=1), tok, RolloutConfig(max_concurrency=10))

    async def cancel_soon():
        async def later():
            await asyncio.sleep(0.2)
            mgr.cancel()

        asyncio.get_running_loop().create_task(later())
        return await mgr.collect(make_specs(5, 2))

    trajs = asyncio.run(asyncio.wait_for(cancel_soon(), 3))
    assert len(trajs) == 10 and {t.outcome for t in trajs} == {Outcome.CANCELLED}


def test_make_specs_groups_share_task():
    specs = make_specs(3, 4, seed=5)
    assert len(specs) == 12
    for k in range(3):
        group = specs[4 * k : 4 * k + 4]
        assert len({s.task_seed for s in group}) == 1 and len({s.group_id for s in group}) == 1
        assert len({s.sampling_seed for s in group}) == 4
    assert make_specs(3, 4, seed=5) == specs and make_specs(3, 4, seed=6) != specs


def test_make_specs_rerun_attempt_keeps_the_tasks_and_draws_new_samples():
    first, rerun = make_specs(2, 4, seed=5, start=7), make_specs(2, 4, seed=5, start=7, attempt=1)
    assert [(s.group_id, s.sample_index, s.task_seed) for s in rerun] == [
        (s.group_id, s.sample_index, s.task_seed) for s in first
    ]
    seeds = [s.sampling_seed for s in first]
    assert not {s.sampling_seed for s in rerun} & set(seeds)
    assert make_specs(2, 4, seed=5, start=7, attempt=2) not in (first, rerun)


def test_env_reset_failure_is_env_error(tiny_tokenizer):
    class Broken(NoopEnv):
        def reset(self, *, seed=None, options=None):
            raise KeyError("dataset row missing")

    mgr = EpisodeManager(FakeEngine(_fixed(tiny_tokenizer, "x")), Broken, tiny_tokenizer)
    t = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))
    assert t.outcome == Outcome.ENV_ERROR and "dataset row missing" in t.outcome_detail


def test_score_truncated_hands_the_cut_turn_to_the_env(tiny_tokenizer):
    class Scored(NoopEnv):
        def step(self, action):
            return "", 0.25, True, False, {"messages": []}

    pol = _fixed(tiny_tokenizer, "word " * 50, stop=False)
    for flag, reward in ((False, 0.0), (True, 0.25)):
        mgr = EpisodeManager(
            FakeEngine(pol), Scored, tiny_tokenizer, RolloutConfig(max_new_tokens=10, score_truncated=flag)
        )
        t = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, 0)))
        assert t.outcome == Outcome.TRUNCATED_LENGTH and t.reward == reward
