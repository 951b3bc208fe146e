"""One place resolves the config: what `agentrl config --set ...` prints is exactly the config.yaml that
`agentrl run` / `agentrl rollout` write for the same overrides, and a config one rejects the other
rejects with the same message. Driven through the real CLI (typer's CliRunner); the jobs are stopped
right after they wrote their resolved config (where the model would be loaded)."""

import pytest
import yaml
from typer.testing import CliRunner

from agentrl.cli.main import JOB_BASES, app
from agentrl.config.plan import Plan, resolve
from agentrl.config.schema import load_config, to_dict
from agentrl.errors import AgentRLError, ConfigError

URL = '["http://127.0.0.1:1"]'

RUN_OK = [
    [],
    ["algo.name=dr_grpo", "trainer.lr=1e-3"],
    ["algo.name=ppo", "rollout.max_turns=3"],
    ["engine.kind=sglang", f"engine.urls={URL}"],
    ["env.kwargs.split=eval", "env.kwargs.difficulty=3"],
    ["rollout.temperature=0.7", "trainer.temperature=0.7"],
    ["engine.cpu_threads=3", "train.steps=7", "trainer.mini_batches=2"],
    ["model.path=/not/built/here", "trainer.loss_agg=seq-mean-token-sum-norm"],
    ["trainer.rollout_correction=seq_reject", "trainer.old_logprobs=current", "trainer.rollout_correction_high=1.05"],
    ["algo.name=dapo", "algo.reward_normalization=gdpo", "algo.reward_weights={correct: 1.0, format: 0.2}"],
    ["algo.name=opd", "algo.teacher=org/teacher"],
    ["algo.name=gspo", "algo.opd_coef=0.3", "algo.teacher=/not/built/here"],
]
RUN_REJECTED = [
    (["trainer.temperature=0.5"], "trainer.temperature (0.5) must equal rollout.temperature (1.0)"),
    (["engine.weight_sync=disk"], "engine.weight_sync: 'disk' does not work with engine.kind='local'"),
    ([f"engine.urls={URL}"], "needs engine.kind=sglang"),
    (["engine.kind=sglang", "engine.weight_sync=distributed"], "'nccl' needs GPUs"),
    (["monitor.pause_on=[kl_spik]"], "monitor.pause_on: ['kl_spik'] not among"),
    (["trainer.lr_schedule=cosine", "trainer.warmup_steps=500"], "trainer.warmup_steps: 500 must be below"),
    (["distributed=ray", "engine.kind=sglang", "engine.num_servers=2"], "engine.num_servers: 2 with distributed=ray"),
    (["rollout.group_size=0"], "rollout.group_size: 0 is below the minimum 1"),
    (["trainer.rollout_correction=icepop"], "trainer.rollout_correction: 'icepop' masks on pi_old / pi_engine"),
    (["trainer.rollout_correction=mis", "trainer.tis_cap=2"], "trainer.tis_cap: 2.0 applies only with"),
    (["algo.reward_normalization=gdpo", "algo.name=rloo"], "algo.reward_normalization: 'gdpo' normalises each"),
    (["algo.reward_normalization=gdpo", "algo.credit=gigpo"], "but algo.credit is 'gigpo'"),
    (["algo.reward_weights={format: 0.2}"], "algo.reward_weights: {'format': 0.2} weighs reward components"),
    (["algo.reward_normalization=gdpo", "algo.reward_weights={format: -1}"], "algo.reward_weights.format: -1 must"),
    (["algo.name=opd"], "algo.teacher: null, but on-policy distillation is on (algo.name='opd', algo.opd_coef=1.0)"),
    (["algo.opd_coef=0.5"], "algo.teacher: null, but on-policy distillation is on"),
    (["algo.teacher=x/y"], "algo.teacher: 'x/y' is only used by on-policy distillation, which is off"),
    (["algo.name=opd", "algo.teacher=x/y", "algo.opd_coef=0"], "algo.opd_coef: 0.0 with algo.name=opd"),
    (["algo.name=opd", "algo.teacher=x/y", "algo.credit=turn_return"], "algo.credit: 'turn_return' with algo.name=opd"),
    (["trainer.opd_coef=1.0"], "trainer.opd_coef / trainer.teacher_path: 1.0 / None are set by `agentrl run`"),
]
ROLLOUT_OK = [[], ["rollout.temperature=0.7"], ["engine.kind=sglang", f"engine.urls={URL}"]]
ROLLOUT_REJECTED = [
    ([f"engine.urls={URL}"], "needs engine.kind=sglang"),
    (["engine.kind=sglang", 'engine.urls=["localhost:30000"]'], "is not an http(s)://host:port URL"),
]


class Stop(AgentRLError):
    """Raised where the job would load the model: its resolved config is on disk by then."""


def _stop(*_a, **_k):
    raise Stop("stopped by the test after the config was written")


def _args(sets, out):
    return [a for s in [*sets, "model.device=cpu", f"output_dir={out}"] for a in ("--set", s)]


def _cli(args):
    res = CliRunner().invoke(app, args, terminal_width=500)
    return res.exit_code, res.output


def _printed(job, sets, out):
    code, output = _cli(["config", "--job", job, *_args(sets, out)])
    return code, (yaml.safe_load(output) if code == 0 else output)


def _job(job, sets, out, monkeypatch):
    """Run `agentrl JOB` through the CLI, stopped at the model; (exit code, output, written config)."""
    import agentrl.jobs.rollout as rollout_mod
    import agentrl.jobs.run.parts as run_mod  # where the run builds its pieces

    monkeypatch.setattr(run_mod if job == "run" else rollout_mod, "model_dir", _stop)
    monkeypatch.setattr(run_mod, "env_factory", lambda cfg: _stop())  # run: nothing is built either
    monkeypatch.setattr(rollout_mod, "env_factory", lambda cfg: _stop())
    code, output = _cli([job, "-q", *_args(sets, out)])
    written = out / "config.yaml"
    return code, output, yaml.safe_load(written.read_text()) if written.exists() else None


def _message(job, sets, out) -> str:
    with pytest.raises(ConfigError) as e:
        resolve(load_config([], [*sets, "model.device=cpu", f"output_dir={out}"], base=JOB_BASES[job]()), job)
    return " ".join(str(e.value).split())


@pytest.mark.parametrize("job, sets", [("run", s) for s in RUN_OK] + [("rollout", s) for s in ROLLOUT_OK])
def test_config_prints_exactly_what_the_job_writes(job, sets, tmp_path, monkeypatch):
    out = tmp_path / "out"
    code, printed = _printed(job, sets, out)
    assert code == 0, printed
    code, output, written = _job(job, sets, out, monkeypatch)
    assert "stopped by the test" in output, output  # the job got as far as the model, no further
    assert written == printed
    direct = resolve(load_config([], [*sets, "model.device=cpu", f"output_dir={out}"], base=JOB_BASES[job]()), job)
    assert to_dict(direct.cfg) == printed  # the code path the CLI takes, called directly


@pytest.mark.parametrize(
    "job, sets, needle", [("run", s, n) for s, n in RUN_REJECTED] + [("rollout", s, n) for s, n in ROLLOUT_REJECTED]
)
def test_a_rejection_is_the_same_message_in_config_and_in_the_job(job, sets, needle, tmp_path, monkeypatch):
    out = tmp_path / "out"
    message = _message(job, sets, out)
    assert needle in message
    code, printed = _printed(job, sets, out)
    assert code == 2 and f"error: {message}" in printed, printed
    code, output, written = _job(job, sets, out, monkeypatch)
    assert code == 2 and f"error: {message}" in output, output
    assert written is None  # rejected before anything was written


def test_rollout_does_not_apply_the_training_checks():
    cfg = load_config([], ["model.device=cpu", "rollout.temperature=0.7", "engine.weight_sync=disk"])
    plan = resolve(cfg, "rollout")
    assert plan.cfg.rollout.temperature == 0.7 and plan.cfg.engine.weight_sync == "disk" and plan.preset is None
    with pytest.raises(ConfigError, match="engine.weight_sync: 'disk' does not work"):
        resolve(cfg, "run")
    with pytest.raises(ConfigError, match="trainer.temperature"):
        resolve(load_config([], ["model.device=cpu", "rollout.temperature=0.7"]), "run")


def test_resolving_fills_every_auto_field_and_is_idempotent():
    plan = resolve(load_config([], ["model.device=cpu", "algo.name=dr_grpo"]), cores=4)
    cfg = plan.cfg
    assert (cfg.model.device, cfg.model.dtype, cfg.trainer.device) == ("cpu", "float32", "cpu")
    assert (cfg.engine.weight_sync, cfg.engine.cpu_threads, cfg.algo.credit) == ("inprocess", 2, "outcome")
    assert cfg.trainer.loss_agg == "seq-mean-token-sum-norm" and cfg.trainer.loss_norm_len == 2048
    assert None not in (cfg.trainer.lr, cfg.trainer.lr_schedule, cfg.trainer.total_steps, cfg.trainer.min_lr_ratio)
    assert resolve(cfg, cores=64).cfg == cfg  # a resolved config resolves to itself (even on another machine)
    assert resolve(plan) is plan and isinstance(plan, Plan)
    assert plan.eval_env_kwargs == {"split": "eval"}
    with pytest.raises(ConfigError, match="job: 'serve' is not one of"):
        resolve(cfg, "serve")


def test_a_printed_config_feeds_back_unchanged(tmp_path):
    code, printed = _printed("run", ["engine.kind=sglang", f"engine.urls={URL}"], tmp_path / "o")
    f = tmp_path / "printed.yaml"
    f.write_text(yaml.safe_dump(printed))
    assert to_dict(resolve(load_config([f])).cfg) == printed


def test_the_plan_hands_gdpo_and_its_weights_to_credit():
    plan = resolve(
        load_config([], ["model.device=cpu", "algo.reward_normalization=gdpo", "algo.reward_weights={a: 2}"])
    )
    assert (plan.shaping.reward_normalization, dict(plan.shaping.reward_weights)) == ("gdpo", {"a": 2})
    default = resolve(load_config([], ["model.device=cpu"])).shaping
    assert (default.reward_normalization, dict(default.reward_weights)) == ("sum", {})
