"""`agentrl rollout` drives the engine `engine.kind` names (it used to run the local engine whatever the
config said): with a recording stand-in for SGLangEngine here, and against a live SGLang server where
SGLang is installed (skips saying why elsewhere)."""

import json

import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.engine.fake import FakeEngine

SHORT = ["rollout.max_new_tokens=16", "rollout.max_turns=1", "model.device=cpu", "env.kwargs.difficulty=1"]


def _rollout(model_dir, out, *sets):
    args = ["rollout", "--env", "code_exec", "--model", str(model_dir), "-n", "2", "-g", "2", "-o", str(out), "-q"]
    res = CliRunner().invoke(app, args + [a for s in [*SHORT, *sets] for a in ("--set", s)], terminal_width=300)
    assert res.exit_code == 0, res.output + repr(res.exception)
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


class RecordingSGLang(FakeEngine):
    """Stands in for agentrl.engine.sglang.engine.SGLangEngine: records how it was built, answers every turn
    with one token and the stop token."""

    built: list = []

    def __init__(self, urls=None, max_context=None, **kw):
        super().__init__(lambda prompt, params, ctx: [5, params.stop_token_ids[0]], max_context=max_context)
        RecordingSGLang.built.append({"urls": urls, "max_context": max_context, **kw})

    @classmethod
    def launch(cls, model_path, **kw):
        return cls(launched=model_path, **kw)


@pytest.fixture
def recording(monkeypatch):
    import agentrl.engine.sglang.engine as sglang_mod

    RecordingSGLang.built = []
    monkeypatch.setattr(sglang_mod, "SGLangEngine", RecordingSGLang)
    return RecordingSGLang


def test_rollout_honours_engine_kind_sglang(recording, tiny_model_dir, tmp_path):
    trajs = _rollout(
        tiny_model_dir,
        tmp_path / "attach",
        "engine.kind=sglang",
        'engine.urls=["http://10.0.0.1:30000"]',
        "rollout.max_context=2048",
    )
    assert recording.built == [{"urls": ["http://10.0.0.1:30000"], "max_context": 2048}]
    assert len(trajs) == 4
    assert all(sum(t["loss_mask"]) == 2 for t in trajs)  # every turn came from the stand-in: one token + stop

    _rollout(
        tiny_model_dir,
        tmp_path / "launch",
        "engine.kind=sglang",
        "engine.num_servers=2",
        "engine.max_total_tokens=4096",
    )
    launched = recording.built[-1]
    assert launched["launched"] == str(tiny_model_dir) and launched["num_servers"] == 2
    assert (launched["device"], launched["max_total_tokens"]) == ("cpu", 4096)


def test_rollout_with_the_local_engine_does_not_touch_sglang(recording, tiny_model_dir, tmp_path):
    trajs = _rollout(tiny_model_dir, tmp_path / "local")
    assert recording.built == [] and len(trajs) == 4
    written = (tmp_path / "local" / "config.yaml").read_text()
    assert "kind: local" in written and "device: cpu" in written
    engine = json.loads((tmp_path / "local" / "metrics.json").read_text())["engine"]  # its counters
    assert engine["generated_tokens"] == sum(sum(t["loss_mask"]) for t in trajs)  # every sampled token is kept
    assert engine["prefilled_tokens"] > 0 and engine["prefills"] >= 1


@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_rollout_on_a_live_sglang_server(sglang_server, sglang_model_dir, tmp_path):
    trajs = _rollout(sglang_model_dir, tmp_path / "live", "engine.kind=sglang", f'engine.urls=["{sglang_server.url}"]')
    assert len(trajs) == 4 and all(sum(t["loss_mask"]) > 0 for t in trajs)
    metrics = json.loads((tmp_path / "live" / "metrics.json").read_text())
    assert metrics["episodes"] == 4 and metrics["config"]["engine"]["kind"] == "sglang"
    assert metrics["config"]["engine"]["urls"] == [sglang_server.url] and "engine" not in metrics
