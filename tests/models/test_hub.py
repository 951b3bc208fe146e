"""Hub ids resolve to local model directories, all offline: a Hub-layout cache built here from the
built-in tiny model (HF_HUB_OFFLINE=1), and a local HTTP server standing in for the Hub (HF_ENDPOINT)
for downloads, 404s, gated repos and a Hub that is down. The token never shows up anywhere."""

import logging

import pytest
from fake_hub import FakeHub, build_hub_cache
from refused_port import refused_port
from typer.testing import CliRunner

from agentrl.errors import ConfigError
from agentrl.models.hub import HubRef, parse_ref, resolve_model, skip_patterns
from agentrl.warmstart.default_model import resolve_model_path

TOKEN = "hf_SecretTokenValue123"


@pytest.fixture
def hf_env(tmp_path, monkeypatch):
    """A private HF cache and no token, endpoint or offline switch from the outer environment."""
    cache = tmp_path / "hf" / "hub"
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return cache


def test_parse_ref_local_dir_hub_id_and_revision(tiny_model_dir):
    assert parse_ref(str(tiny_model_dir)) == tiny_model_dir
    assert parse_ref("Qwen/Qwen2.5-0.5B-Instruct") == HubRef("Qwen/Qwen2.5-0.5B-Instruct")
    assert parse_ref("org/name@v1.0") == HubRef("org/name", "v1.0")
    assert parse_ref("org/name", revision="abc") == HubRef("org/name", "abc")
    with pytest.raises(ConfigError, match="disagrees"):
        parse_ref("org/name@v1", revision="v2")
    with pytest.raises(ConfigError, match="applies to Hub ids"):
        parse_ref(str(tiny_model_dir), revision="main")
    for bad in ("/no/such/dir", "justaname", "a/b/c", "../x/y", "org/na me"):
        with pytest.raises(ConfigError, match="is not a Hub id"):
            parse_ref(bad)


def test_skip_patterns_drop_pickles_only_next_to_safetensors():
    assert "*.bin" in skip_patterns(["model.safetensors", "pytorch_model.bin"])
    assert "*.bin" not in skip_patterns(["pytorch_model.bin", "config.json"])
    assert "*.onnx" in skip_patterns([])


def test_offline_cached_hub_id_resolves_and_loads(tiny_model_dir, hf_env, monkeypatch):
    snap = build_hub_cache(hf_env, "org/tiny", tiny_model_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: any network call would fail
    path = resolve_model_path("org/tiny")
    assert path == snap
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert model.config.hidden_size > 0 and AutoTokenizer.from_pretrained(str(path)).encode("hi")
    assert resolve_model_path("org/tiny@main") == snap  # the ref names the same snapshot


def test_offline_and_not_cached_is_a_clear_error(hf_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as e:
        resolve_model_path("org/absent")
    msg = str(e.value)
    assert "'org/absent'" in msg and "HF_HUB_OFFLINE=1" in msg and "not in the HF cache" in msg


def test_download_from_a_stand_in_hub_lands_in_the_cache(tiny_model_dir, hf_env, monkeypatch):
    with FakeHub({"org/tiny": tiny_model_dir}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        path = resolve_model("org/tiny")
        assert path == hf_env / "models--org--tiny" / "snapshots" / hub.commit
        assert (hf_env / "models--org--tiny" / "refs" / "main").read_text() == hub.commit
        got = sorted(p.name for p in path.iterdir())
        assert got == sorted(p.name for p in tiny_model_dir.iterdir() if p.is_file())
        assert (path / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
        assert any(m == "GET" and "/resolve/" in p for m, p, _ in hub.requests)
        n = len(hub.requests)
        # now cached: offline needs no server at all
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert resolve_model("org/tiny") == path and len(hub.requests) == n


def test_pinned_revision_is_sent_to_the_hub(tiny_model_dir, hf_env, monkeypatch):
    with FakeHub({"org/tiny": tiny_model_dir}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        resolve_model_path("org/tiny", revision="v1.0")
        assert any(p == "/api/models/org/tiny/revision/v1.0" for _, p, _ in hub.requests)
        assert (hf_env / "models--org--tiny" / "refs" / "v1.0").read_text() == hub.commit


def test_missing_id_is_a_404_error(tiny_model_dir, hf_env, monkeypatch):
    with FakeHub({"org/tiny": tiny_model_dir}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(ConfigError) as e:
            resolve_model_path("org/nope")
    msg = str(e.value)
    assert "'org/nope'" in msg and "not found" in msg and "404" in msg


def test_gated_repo_needs_hf_token_and_the_token_never_leaks(tiny_model_dir, hf_env, monkeypatch, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    with FakeHub({"org/gated": tiny_model_dir}, gated={"org/gated": TOKEN}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(ConfigError) as e:  # no token: 401
            resolve_model_path("org/gated")
        assert "'org/gated'" in str(e.value) and "gated" in str(e.value) and "HF_TOKEN" in str(e.value)
        monkeypatch.setenv("HF_TOKEN", "hf_WrongToken999")
        with pytest.raises(ConfigError) as wrong:  # a token the Hub refuses: 403
            resolve_model_path("org/gated")
        assert "HF_TOKEN" in str(wrong.value) and "hf_WrongToken999" not in str(wrong.value)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        path = resolve_model_path("org/gated")
        assert (path / "config.json").is_file()
        assert any(a == f"Bearer {TOKEN}" for _, _, a in hub.requests)  # the token is what opened it
    out, err = capfd.readouterr()
    assert TOKEN not in out + err + caplog.text + str(e.value)


def test_hub_down_is_a_clear_error(hf_env, monkeypatch):
    with refused_port() as port, pytest.raises(ConfigError) as e:  # the hub is down
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        resolve_model_path("org/tiny")
    msg = str(e.value)
    assert "'org/tiny'" in msg and "not reachable" in msg and "HF_HUB_OFFLINE" in msg


def test_cli_rollout_with_a_hub_id_from_the_offline_cache(tiny_model_dir, hf_env, monkeypatch, tmp_path):
    from agentrl.cli.main import app

    build_hub_cache(hf_env, "org/tiny", tiny_model_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # set, unused offline, and never written anywhere
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "rollout",
            "--model",
            "org/tiny",
            "-n",
            "1",
            "-g",
            "2",
            "-o",
            str(out),
            "--set",
            "rollout.max_new_tokens=8",
            "--set",
            "rollout.max_turns=1",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "device: cpu, dtype float32" in res.output
    written = (out / "config.yaml").read_text()
    assert "path: org/tiny" in written and "device: cpu" in written and "dtype: float32" in written
    assert TOKEN not in written + res.output + (out / "metrics.json").read_text()
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("source", ["offline_cache", "stand_in_endpoint"])
def test_cli_run_with_a_hub_id(source, tiny_model_dir, hf_env, monkeypatch, tmp_path):
    """`agentrl run --model org/name`, the way users type it: from a Hub cache with HF_HUB_OFFLINE=1, and
    downloaded from a local server standing in for the Hub (HF_ENDPOINT)."""
    from agentrl.cli.main import app

    out = tmp_path / "run"
    args = ["run", "--model", "org/tiny", "--env", "code_exec", "-o", str(out), "-q"]
    for s in (
        "train.steps=1",
        "train.groups_per_step=1",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "rollout.max_turns=1",
        "eval.num_tasks=0",
        "logging.tensorboard=false",
    ):
        args += ["--set", s]
    if source == "offline_cache":
        build_hub_cache(hf_env, "org/tiny", tiny_model_dir)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        res = CliRunner().invoke(app, args)
    else:
        with FakeHub({"org/tiny": tiny_model_dir}) as hub:
            monkeypatch.setenv("HF_ENDPOINT", hub.url)
            res = CliRunner().invoke(app, args)
        assert any(m == "GET" and "/resolve/" in p for m, p, _ in hub.requests)
    assert res.exit_code == 0, res.output
    assert "path: org/tiny" in (out / "config.yaml").read_text()
    assert (out / "summary.json").is_file() and (out / "metrics.jsonl").read_text().strip()


def test_serve_resolves_a_hub_id_and_refuses_follow(tiny_model_dir, hf_env, monkeypatch):
    from agentrl.jobs.serve import resolve_target

    snap = build_hub_cache(hf_env, "org/tiny", tiny_model_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_target("org/tiny").model_dir == snap
    with pytest.raises(ConfigError, match="--follow needs a run directory"):
        resolve_target("org/tiny", follow=True)
    with pytest.raises(ConfigError, match="does not exist and is not a Hub id"):
        resolve_target("no_such_dir")
