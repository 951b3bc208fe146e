"""``agentrl run`` with ``engine.kind=sglang``: a shortened run on a real SGLang server that the run
launches (and stops), with weights pushed after every step. Skips, saying why, where SGLang cannot
run; engine config errors are checked without a server."""

import json

import components
import pytest
import short_run  # noqa: F401  (registers test/Short-v0)
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.config.plan import resolve
from agentrl.config.schema import load_config
from agentrl.errors import ConfigError

SHORT = [
    "rollout.max_new_tokens=6",
    "rollout.max_turns=1",
    "rollout.score_truncated=true",
    "rollout.group_size=4",
    "train.groups_per_step=2",
    "train.max_staleness=1",
    "eval.num_tasks=4",
    "eval.every=0",
    "eval.env_kwargs={}",
    "env.kwargs={}",
    "trainer.lr=1e-2",
    "trainer.loss_agg=token-mean",
    "logging.tensorboard=false",
]


@pytest.mark.parametrize(
    "sets, match",
    [
        (["engine.kind=sglang", "engine.weight_sync=inprocess"], "engine.weight_sync: 'inprocess'.*kind='sglang'"),
        (["engine.weight_sync=disk"], "engine.weight_sync: 'disk'.*kind='local'"),
        (['engine.urls=["http://127.0.0.1:1"]'], "engine.urls: .* needs engine.kind=sglang"),
        (["engine.kind=sglang", 'engine.urls=["localhost:30000"]'], "'localhost:30000' is not an http"),
        (["engine.kind=sglang", "engine.weight_sync=distributed"], "'nccl' needs GPUs"),
    ],
)
def test_engine_config_errors_name_the_bad_value(sets, match):
    with pytest.raises(ConfigError, match=match):
        resolve(load_config([], ["model.device=cpu", *sets]))


def test_engine_config_resolves_auto():
    def sync(*sets):
        return resolve(load_config([], ["model.device=cpu", *sets])).sync_kind

    assert sync() == "inprocess"
    assert sync("engine.kind=sglang") == "disk"
    assert sync("engine.kind=sglang", "engine.weight_sync=distributed", "engine.sync_backend=gloo") == "distributed"
    disk = resolve(load_config([], ["model.device=cpu", "engine.kind=sglang", "output_dir=runs/x"])).cfg.engine
    assert (disk.weight_sync, disk.weights_dir) == ("disk", "runs/x/weights")


@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_agentrl_run_on_sglang_syncs_weights(sglang_model_dir, tmp_path):
    from agentrl.engine.sglang.server import unavailable_reason

    reason = unavailable_reason()
    if reason:
        components.unavailable("sglang", reason)
    out = tmp_path / "run"
    sets = [x for s in ["engine.kind=sglang", *SHORT] for x in ("--set", s)]
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--env",
            "test/Short-v0",
            "--model",
            str(sglang_model_dir),
            "--steps",
            "2",
            "-o",
            str(out),
            "-q",
            *sets,
        ],
    )
    assert res.exit_code == 0, res.output + repr(res.exception)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    syncs = [r for r in rows if "time/weight_sync_s" in r]
    assert len(syncs) == 2 and all(r["time/weight_push_s"] > 0 for r in syncs)
    print("weight sync seconds per step:", [round(r["time/weight_sync_s"], 3) for r in syncs])
    # the disk sync wrote version 2 (the last step's) and removed version 1
    assert [p.name for p in (out / "weights").iterdir()] == ["v00000002"]
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
