"""Every --algo preset resolves (through the plan) to what it is defined as; explicit fields win;
what cannot go together is rejected naming the field; the CLI lists every preset."""

import pytest
from typer.testing import CliRunner

from agentrl.batches.samples import ALGOS
from agentrl.cli.main import app
from agentrl.config.plan import resolve
from agentrl.config.schema import AlgoConfig, load_config
from agentrl.errors import ConfigError

# preset: (advantage, credit, aggregation, critic, policy_loss, clip_low, clip_high, dynamic, overlong, kl, whiten)
TABLE = {
    "dapo": ("grpo", "outcome", "token-mean", False, "ppo_clip", 0.2, 0.28, True, 256 // 5, 0.0, False),
    "gspo": ("grpo", "outcome", "seq-mean-token-mean", False, "gspo", 3e-4, 4e-4, False, None, 0.0, False),
    "cispo": ("grpo", "outcome", "token-mean", False, "cispo", 1.0, 0.2, False, None, 0.0, False),
    "reinforce_pp_baseline": (
        "reinforce_pp_baseline",
        "outcome",
        "token-mean",
        False,
        "ppo_clip",
        0.2,
        0.2,
        False,
        None,
        0.0,
        False,
    ),
    "reinforce_pp": ("reinforce_pp", "outcome", "token-mean", False, "ppo_clip", 0.2, 0.2, False, None, 0.001, False),
    "ppo": ("gae", "turn_gae", "token-mean", True, "ppo_clip", 0.2, 0.2, False, None, 0.0, True),
    "grpo": ("grpo", "outcome", "seq-mean-token-mean", False, "ppo_clip", 0.2, 0.2, False, None, 0.0, False),
}


def _plan(*sets):
    return resolve(load_config([], ["model.device=cpu", "rollout.max_new_tokens=256", *sets]))


@pytest.mark.parametrize("name", sorted(TABLE))
def test_preset_resolves_to_its_table_row(name):
    plan = _plan(f"algo.name={name}")
    a, t, p = plan.cfg.algo, plan.cfg.trainer, plan.preset
    got = (
        p.advantage,
        a.credit,
        t.loss_agg,
        p.critic,
        t.policy_loss,
        t.clip_low,
        t.clip_high,
        a.dynamic_sampling,
        a.overlong_cache_len,
        a.kl_in_reward,
        a.whiten_advantages,
    )
    assert got == TABLE[name]
    assert t.reference == (a.kl_in_reward > 0)  # the KL in the reward needs the reference model
    assert resolve(plan.cfg).cfg == plan.cfg  # idempotent


def test_every_preset_is_a_config_choice_and_in_the_help():
    import typing

    assert set(typing.get_args(typing.get_type_hints(AlgoConfig)["name"])) == set(ALGOS)
    wide = {"COLUMNS": "2000"}
    run_help = CliRunner().invoke(app, ["run", "--help"], env=wide).output
    docs = CliRunner().invoke(app, ["config", "--docs"], env=wide).output
    for name in ALGOS:
        assert name in run_help and name in docs, name
    for f in (
        "algo.kl_in_reward",
        "algo.dynamic_sampling",
        "algo.overlong_cache_len",
        "algo.whiten_advantages",
        "algo.turn_return_std",
        "algo.kl_target",
        "algo.max_draw_batches",
    ):
        assert f in docs


def test_explicit_fields_win_over_the_preset():
    plan = _plan(
        "algo.name=dapo",
        "trainer.clip_high=0.3",
        "algo.dynamic_sampling=false",
        "algo.overlong_cache_len=16",
        "algo.name=dapo",
    )
    assert plan.cfg.trainer.clip_high == 0.3 and plan.cfg.trainer.clip_low == 0.2
    assert plan.cfg.algo.dynamic_sampling is False and plan.cfg.algo.overlong_cache_len == 16
    plan = _plan("algo.name=reinforce_pp", "algo.kl_in_reward=0")
    assert plan.cfg.algo.kl_in_reward == 0.0 and plan.cfg.trainer.reference is False
    plan = _plan("algo.name=ppo", "algo.whiten_advantages=false")
    assert plan.cfg.algo.whiten_advantages is False
    plan = _plan("algo.name=grpo", "algo.kl_in_reward=0.01", "algo.kl_target=2.0")
    assert plan.cfg.trainer.reference and plan.shaping.kl_coef == 0.01 and plan.shaping.kl_estimator == "k1"


@pytest.mark.parametrize(
    "sets, needle",
    [
        (
            ["algo.name=gspo", "trainer.loss_agg=token-mean"],
            "trainer.loss_agg: 'token-mean' with algo.name='gspo', which is defined with 'seq-mean-token-mean'",
        ),
        (["algo.name=gspo", "trainer.dual_clip_c=3"], "trainer.dual_clip_c: 3.0 with policy_loss='gspo'"),
        (["algo.name=cispo", "trainer.dual_clip_c=3"], "trainer.dual_clip_c: 3.0 with policy_loss='cispo'"),
        (["trainer.policy_loss=cispo", "trainer.dual_clip_c=2"], "trainer.dual_clip_c: 2.0 with policy_loss='cispo'"),
        (["algo.kl_target=1.0"], "algo.kl_target: 1.0 adapts the KL-in-reward coefficient, but algo.kl_in_reward is 0"),
        (["algo.overlong_cache_len=300"], "algo.overlong_cache_len: 300 exceeds rollout.max_new_tokens=256"),
        (["algo.name=dapo2"], "algo.name"),
    ],
)
def test_rejected_naming_the_field(sets, needle):
    with pytest.raises(ConfigError, match=None) as e:
        _plan(*sets)
    assert needle in str(e.value)


def test_dapo_keeps_dual_clip():
    assert _plan("algo.name=dapo", "trainer.dual_clip_c=3").cfg.trainer.dual_clip_c == 3.0
