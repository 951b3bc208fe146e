"""skyrl-gym envs through ``agentrl.envs.adapters.skyrl_gym``.

Unit tests use fake skyrl envs (``FakeCounterEnv`` and friends: ``BaseTextEnv`` subclasses defined
here and registered in the real ``skyrl_gym`` registry); the end-to-end tests run skyrl-gym's own
``gsm8k`` / ``gsm8k_multi_turn`` envs (no network) through ``agentrl rollout`` and ``agentrl run``
with the tiny model, which will not solve them: they check the trajectories' shape, not skill."""

from __future__ import annotations

import asyncio
import json

import components
import pytest

skyrl_gym = pytest.importorskip(
    "skyrl_gym", reason=components.reason("skyrl", "skyrl-gym is not installed (pip install 'agentrl[skyrl]')")
)
from gymnasium.error import ResetNeeded  # noqa: E402
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

from agentrl.engine.fake import FakeEngine  # noqa: E402
from agentrl.envs.adapters.skyrl_gym import SkyRLGymEnv, in_eval  # noqa: E402
from agentrl.envs.registry import make  # noqa: E402
from agentrl.episodes.config import RolloutConfig  # noqa: E402
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec  # noqa: E402
from agentrl.errors import ConfigError, DatasetError, EnvError, RewardError  # noqa: E402
from agentrl.trajectory import Outcome  # noqa: E402


class FakeCounterEnv(BaseTextEnv):
    """A fake skyrl env: ``extras["target"]`` turns; each step pays 0.25, the last one 1.0; the
    observation asks for the next turn; the action's text after ``</x>`` is cut in
    ``postprocessed_action`` (as skyrl's tag envs do)."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        extras = extras or {}
        self.target = int(extras["target"])
        self.config = env_config
        self.closed = False

    def init(self, prompt):
        return [{"role": "system", "content": "count"}, *prompt], {"target": self.target}

    def step(self, action):
        self.turns += 1
        done = self.turns >= self.target
        obs = [] if done else [{"role": "user", "content": f"turn {self.turns + 1} please"}]
        return BaseTextEnvStepOutput(
            observations=obs,
            reward=1.0 if done else 0.25,
            done=done,
            metadata={"turn": self.turns},
            postprocessed_action=action.split("</x>")[0],
        )

    def get_metrics(self):
        return {"steps": self.turns}


class FakeBadEnv(BaseTextEnv):
    """A fake skyrl env misbehaving as ``extras["how"]`` says."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        extras = extras or {}
        self.how = extras["how"]

    def step(self, action):
        if self.how == "raise":
            raise ValueError("no <tool> block")
        if self.how == "nan":
            return BaseTextEnvStepOutput(observations=[], reward=float("nan"), done=True, metadata={})
        return BaseTextEnvStepOutput(
            observations=[{"role": "assistant", "content": "x"}], reward=0.0, done=False, metadata={}
        )


skyrl_gym.register(id="fake_counter", entry_point=FakeCounterEnv)
skyrl_gym.register(id="fake_bad", entry_point=FakeBadEnv)


def _rows(n: int, env_class: str = "fake_counter") -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"count to {1 + i % 3}"}],
            "env_class": env_class,
            "target": 1 + i % 3,
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]


def _jsonl(tmp_path, rows, name="data.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


# ------------------------------------------------------------------ the adapter, on fake skyrl envs
def test_reset_and_steps_map_the_skyrl_contract(tmp_path):
    env = SkyRLGymEnv("fake_counter", dataset=str(_jsonl(tmp_path, _rows(30))), env_config={"level": 3})
    task = next(t for t in env.tasks if t["row"]["target"] == 3)
    obs, info = env.reset(seed=0, options={"task": task})
    assert info["messages"] == [{"role": "system", "content": "count"}, {"role": "user", "content": "count to 3"}]
    assert obs == "count\n\ncount to 3" and info["tools"] == [] and info["skyrl_metadata"] == {"target": 3}
    assert info["task"]["id"] == task["id"] and env._inner.config.level == 3  # env_config read as attributes
    assert "prompt" not in info["task"]["row"] or info["task"]["row"]["prompt"]  # the row travels whole
    obs, r, term, trunc, sinfo = env.step("one</x> trailing")
    assert (obs, r, term, trunc) == ("turn 2 please", 0.25, False, False)
    assert sinfo["messages"] == [{"role": "user", "content": "turn 2 please"}]
    assert sinfo["postprocessed_action"] == "one" and sinfo["skyrl_metadata"] == {"turn": 1}
    env.step("two")
    obs, r, term, trunc, sinfo = env.step("three")
    assert (obs, r, term, trunc, sinfo["messages"]) == ("", 1.0, True, False, [])
    assert sinfo["skyrl_metrics"] == {"steps": 3}
    with pytest.raises(ResetNeeded):
        env.step("four")
    inner = env._inner
    env.reset(seed=1)
    assert env._inner is not inner  # a fresh skyrl env per episode, as skyrl-train makes them
    env.close()


def test_skyrl_env_failures_are_named(tmp_path):
    path = str(_jsonl(tmp_path, [{"prompt": "hi", "how": h} for h in ("raise", "nan", "role")]))
    env = SkyRLGymEnv("fake_bad", dataset=path, eval_dataset=path)  # an eval_dataset: train keeps every row
    by_how = {t["row"]["how"]: t for t in env.tasks}
    env.reset(options={"task": by_how["raise"]})
    with pytest.raises(EnvError, match=r"FakeBadEnv.step raised ValueError: no <tool> block"):
        env.step("x")
    env.reset(options={"task": by_how["nan"]})
    with pytest.raises(RewardError, match="nan"):
        env.step("x")
    env.reset(options={"task": by_how["role"]})
    with pytest.raises(EnvError, match="role 'assistant'"):
        env.step("x")


def test_dataset_rows_and_their_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(_rows(5)), tmp_path / "d.parquet")
    env = SkyRLGymEnv("fake_counter", dataset=str(tmp_path / "d.parquet"), eval_fraction=0.5)
    assert {t["id"] for t in env.tasks} <= {f"d-{i}" for i in range(5)}
    with pytest.raises(DatasetError, match=r"line 2: the row's env_class is 'gsm8k', but this env runs 'fake_counter'"):
        SkyRLGymEnv("fake_counter", dataset=str(_jsonl(tmp_path, [_rows(1)[0], _rows(1, "gsm8k")[0]], "mix.jsonl")))
    with pytest.raises(DatasetError, match=r"line 1: 'prompt' must be"):
        SkyRLGymEnv("fake_counter", dataset=str(_jsonl(tmp_path, [{"prompt": [], "target": 1}], "bad.jsonl")))
    with pytest.raises(DatasetError, match="cannot open dataset"):
        SkyRLGymEnv("fake_counter", dataset=str(tmp_path / "missing.jsonl"))
    with pytest.raises(DatasetError, match="no env_class"):
        make("skyrl", dataset=str(_jsonl(tmp_path, [{"prompt": "hi"}], "noclass.jsonl")))
    # `skyrl` without env_id: each row names its env
    env = make("skyrl", dataset=str(_jsonl(tmp_path, _rows(12), "classes.jsonl")))
    _, info = env.reset(seed=0)
    assert info["task"]["env_class"] == "fake_counter"
    with pytest.raises(ConfigError, match=r"skyrl-gym has no env 'nope'.*fake_counter"):
        make("skyrl", env_id="nope")


def test_eval_split_is_held_out(tmp_path):
    path = str(_jsonl(tmp_path, _rows(60)))
    train = SkyRLGymEnv("fake_counter", dataset=path, split="train", eval_fraction=0.2)
    held = SkyRLGymEnv("fake_counter", dataset=path, split="eval", eval_fraction=0.2)
    ids_t, ids_e = {t["id"] for t in train.tasks}, {t["id"] for t in held.tasks}
    assert ids_t.isdisjoint(ids_e) and len(ids_t | ids_e) == 60 and 3 <= len(ids_e) <= 25
    assert all(in_eval(i, 0.2) for i in ids_e)
    other = str(_jsonl(tmp_path, _rows(4), "eval.jsonl"))
    assert len(SkyRLGymEnv("fake_counter", dataset=path, eval_dataset=other, split="eval").tasks) == 4
    assert len(SkyRLGymEnv("fake_counter", dataset=path, eval_dataset=other, split="train").tasks) == 60
    with pytest.raises(ConfigError, match="eval split of .* is empty"):
        SkyRLGymEnv(
            "fake_counter", dataset=str(_jsonl(tmp_path, _rows(1), "one.jsonl")), split="eval", eval_fraction=0.01
        )
    with pytest.raises(ConfigError, match="split must be one of"):
        SkyRLGymEnv("fake_counter", dataset=path, split="test")
    # the built-in sample's splits, through the registry (the eval-split rule of `make`)
    tr, ev = make("skyrl/gsm8k", split="train"), make("skyrl/gsm8k", split="eval")
    questions = lambda e: {t["row"]["prompt"][0]["content"] for t in e.tasks}  # noqa: E731
    assert questions(tr).isdisjoint(questions(ev)) and len(tr.tasks) == 12 and len(ev.tasks) == 4
    with pytest.raises(ConfigError, match="needs dataset="):
        make("skyrl/text2sql")


@pytest.mark.parametrize("env_id", ["skyrl/gsm8k", "skyrl/gsm8k_multi_turn"])
def test_skyrl_envs_pass_the_agent_env_checker(env_id):
    from agentrl.envs.checker import check_agent_env

    assert check_agent_env(env_id) == []


def test_stop_strings_default_and_override(tmp_path):
    path = str(_jsonl(tmp_path, [{"prompt": "q", "env_class": "search", "reward_spec": {"ground_truth": "x"}}]))
    assert SkyRLGymEnv("search", dataset=path).stop_strings == ("</search>", "</answer>")
    assert SkyRLGymEnv("search", dataset=path, stop=["</answer>"]).stop_strings == ("</answer>",)
    assert make("skyrl/gsm8k").stop_strings == ()
    with pytest.raises(ConfigError, match="stop must be a list of non-empty strings"):
        SkyRLGymEnv("gsm8k", stop="</answer>")


def test_the_episode_manager_samples_with_the_env_and_run_stop_strings(tiny_tokenizer, tmp_path):
    """``rollout.stop`` and the env's ``stop_strings`` reach the engine (FakeEngine records them); a
    turn that ends on a string (not on <|im_end|>) gets the template's closing glue and the episode
    goes on to the next turn."""
    tok = tiny_tokenizer
    seen = []

    def policy(prompt, params, ctx):
        seen.append(params.stop)
        return tok.encode(f"step {ctx.call_index}</x>", add_special_tokens=False)  # no <|im_end|>

    class StopEngine(FakeEngine):  # a fake that ends on the stop string, as the real engines do
        async def generate(self, prompt_ids, params, *, session=None):
            g = await super().generate(prompt_ids, params, session=session)
            g.finish_reason = "stop" if any(s in tok.decode(g.token_ids) for s in params.stop) else g.finish_reason
            return g

    path = str(_jsonl(tmp_path, [_rows(3)[2]]))
    cfg = RolloutConfig(max_turns=5, max_context=4096, max_new_tokens=64, stop=["</y>"])
    mgr = EpisodeManager(
        StopEngine(policy),
        lambda: SkyRLGymEnv("fake_counter", dataset=path, eval_dataset=path, stop=["</x>"]),
        tok,
        cfg,
        env_id="skyrl",
    )
    traj = asyncio.run(mgr.run_episode(EpisodeSpec("g", 0, task_seed=0)))
    assert traj.outcome == Outcome.OK, traj.outcome_detail
    assert seen == [("</y>", "</x>")] * 3
    assert [r.reward for r in traj.turns] == [0.25, 0.25, 1.0] and traj.reward == 1.0
    assert [r.finish_reason for r in traj.turns] == ["stop"] * 3
    traj.validate()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    first, second = traj.turns[0], traj.turns[1]
    glue = traj.token_ids[first.start + first.n_sampled]
    assert glue == im_end and traj.loss_mask[first.start + first.n_sampled] == 0  # closing glue, not trained
    assert tok.decode(traj.token_ids[second.start : second.start + second.n_sampled]) == "step 1</x>"


# ------------------------------------------------------------------ real skyrl-gym envs, tiny model
def test_agentrl_rollout_on_skyrl_gsm8k_multi_turn(tiny_model_dir, tmp_path):
    """``agentrl rollout --env skyrl/gsm8k_multi_turn`` on the tiny model: skyrl-gym's own env and
    the built-in sample. A one-character stop string the random model writes often makes turns end
    on the string, so the multi-turn path after a string stop runs for real."""
    from typer.testing import CliRunner

    from agentrl.cli.main import app
    from agentrl.trajectory import read_jsonl

    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "rollout",
            "--env",
            "skyrl/gsm8k_multi_turn",
            "--model",
            str(tiny_model_dir),
            "-n",
            "2",
            "-g",
            "2",
            "-o",
            str(out),
            "-q",
            "--set",
            "rollout.max_new_tokens=24",
            "--set",
            "rollout.max_turns=3",
            "--set",
            "rollout.stop=[e]",
            "--set",
            "rollout.score_truncated=true",
        ],
    )
    assert res.exit_code == 0, res.output
    trajs = list(read_jsonl(out / "trajectories.jsonl"))
    assert len(trajs) == 4
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    string_stops = multi_turn = 0
    for t in trajs:
        t.validate()
        assert t.outcome in (Outcome.OK, Outcome.TRUNCATED_TURNS, Outcome.TRUNCATED_LENGTH), t.outcome_detail
        assert t.env_id == "skyrl/gsm8k_multi_turn" and t.task["env_class"] == "gsm8k_multi_turn"
        assert isinstance(t.reward, float) and 0.0 <= t.reward <= 1.0
        assert all(isinstance(r.reward, float) for r in t.turns)
        assert t.messages[0]["role"] == "user" and "####" in t.messages[0]["content"]
        for r in t.turns:
            ids = t.token_ids[r.start : r.start + r.n_sampled]
            assert all(t.loss_mask[r.start : r.start + r.n_sampled])  # sampled tokens are trained on
            if r.finish_reason == "stop" and "e" in tok.decode(ids):
                assert "e" not in tok.decode(ids[:-1])  # cut at the token that completed the string
                string_stops += 1
        if len(t.turns) > 1:  # the env's follow-up is an observation (mask 0)
            gap = t.loss_mask[t.turns[0].start + t.turns[0].n_sampled : t.turns[1].start]
            assert gap and not any(gap)
            multi_turn += 1
    assert string_stops >= 1, "no turn ended on the stop string"
    assert multi_turn >= 1, "no episode reached a second turn: the follow-up observation went unchecked"


@pytest.mark.slow
def test_agentrl_run_on_skyrl_gsm8k(tiny_model_dir, tmp_path):
    """``agentrl run --env skyrl/gsm8k``, shortened: 2 steps of 2 groups x 2 on the tiny model, with
    the held-out eval drawn from the sample's eval split."""
    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner

    out = tmp_path / "run"
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={tiny_model_dir}",
            "env.id=skyrl/gsm8k",
            "algo.name=grpo",
            "rollout.max_new_tokens=16",
            "rollout.group_size=2",
            "train.groups_per_step=2",
            "train.steps=2",
            "train.max_staleness=0",
            "eval.num_tasks=2",
            "logging.tensorboard=false",
        ],
    )
    summary = asyncio.run(Runner(cfg, progress=False).run())
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "rollout/episodes" in r or "step" in r]) >= 2
