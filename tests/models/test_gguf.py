"""GGUF files as model.path: found, keyed by content, converted once and atomically, errors named.

Every conversion here is of a tiny llama-shaped GGUF written by the test (``tiny_gguf``), in seconds.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from tiny_gguf import SMOLLM2_TEMPLATE, write_tiny_gguf
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.errors import ConfigError
from agentrl.models import gguf as G
from agentrl.models.hub import resolve_model
from agentrl.models.local_dir import check_model_dir


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One agentrl cache for the module's conversions (each test that needs a cold cache sets its own)."""
    cache = tmp_path_factory.mktemp("agentrl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTRL_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="module")
def tiny(shared_cache, tmp_path_factory):
    """(the GGUF file, its converted directory), converted once for the module."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf")
    return path, G.converted_dir(path)


def test_find_gguf(tmp_path):
    one = write_tiny_gguf(tmp_path / "one" / "m.gguf")
    assert G.find_gguf(one) == one
    assert G.find_gguf(one.parent) == one  # a directory holding exactly one
    (tmp_path / "notes.txt").write_text("x")
    assert G.find_gguf(tmp_path / "notes.txt") is None
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    shutil.copy(one, hf / "export.gguf")
    assert G.find_gguf(hf) is None  # an HF directory with a GGUF export beside it stays an HF directory
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(one, two / "a.Q4_1.gguf")
    shutil.copy(one, two / "b.Q8_0.gguf")
    with pytest.raises(ConfigError, match="holds 2 GGUF files") as e:
        G.find_gguf(two)
    assert "a.Q4_1.gguf, b.Q8_0.gguf" in str(e.value) and "the file itself" in str(e.value)


def test_content_key_is_the_sha256_streamed_and_remembered(tmp_path, monkeypatch):
    f = tmp_path / "blob.gguf"
    data = bytes(range(256)) * 40_000  # 10 MB: more than one read chunk
    f.write_bytes(data)
    cache = tmp_path / "cache"
    assert G.content_key(f, cache) == hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(G, "sha256_of", lambda p: pytest.fail("re-hashed an unchanged file"))
    assert G.content_key(f, cache) == hashlib.sha256(data).hexdigest()  # remembered
    monkeypatch.undo()
    f.write_bytes(data[:-1] + b"x")  # new content (size, mtime): hashed again
    assert G.content_key(f, cache) == hashlib.sha256(data[:-1] + b"x").hexdigest()


def test_conversion_is_a_plain_hf_directory_equal_to_the_gguf(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, out = tiny
    assert check_model_dir(out) == out
    assert out.parent.name == "gguf" and out.name == hashlib.sha256(src.read_bytes()).hexdigest()
    meta = json.loads((out / G.META).read_text())
    assert meta["sha256"] == out.name and meta["architecture"] == "llama"
    # no quantization_config: SGLang would take the plain weights for GGUF blocks and refuse them (issue 32)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert meta["tensor_types"] == ["F32 x19", "Q8_0 x1"] and meta["chat_template"] is True
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert not getattr(model, "is_quantized", False) and model.config.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(str(out))
    ref_tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    text = "<|im_start|>user\nthe cat in the hat ünï 42<|im_end|>\n"
    assert tok.encode(text) == ref_tok.encode(text)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert tok.chat_template == SMOLLM2_TEMPLATE and tok.eos_token == "<|im_end|>"


def test_converted_once_per_content(tiny, tmp_path, capfd):
    src, out = tiny
    capfd.readouterr()
    copy = tmp_path / "renamed.gguf"
    shutil.copy(src, copy)
    assert G.converted_dir(copy) == out  # same bytes, another name: the same entry
    assert resolve_model(str(src.parent)) == out  # the directory holding it, through the one resolver
    assert "converting" not in capfd.readouterr().err


def test_one_line_says_it_converts_and_where(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    src = write_tiny_gguf(tmp_path / "m.gguf", seed=1)
    out = G.converted_dir(src)
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("agentrl:")]
    assert len(err) == 1 and "converting m.gguf" in err[0] and str(out) in err[0]


def test_an_interrupted_conversion_is_never_used(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    src = write_tiny_gguf(tmp_path / "m.gguf", seed=2)
    key = G.content_key(src)
    dest = tmp_path / "cache" / "gguf" / key

    def dies(src, out, what):  # half the files written, then interrupted (Ctrl-C)
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(G, "convert", dies)
    with pytest.raises(KeyboardInterrupt):
        G.converted_dir(src)
    assert not dest.exists() and not list(dest.parent.glob(f".{key}-*"))
    # a SIGKILLed conversion cannot clean up: its temporary directory is never used, and goes next time
    leftover = dest.parent / f".{key}-killed"
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")
    monkeypatch.undo()
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    assert G.converted_dir(src) == dest and check_model_dir(dest) == dest
    assert not leftover.exists() and json.loads((dest / G.META).read_text())["sha256"] == key


def test_an_architecture_transformers_cannot_read_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    src = write_tiny_gguf(tmp_path / "odd.gguf", arch="agentrl-nonesuch")
    with pytest.raises(ConfigError) as e:
        resolve_model(str(src))
    msg = str(e.value)
    assert msg.startswith("model.path: transformers") and "odd.gguf" in msg
    assert "'agentrl-nonesuch'" in msg and "F32 x19, Q8_0 x1" in msg and "not supported" in msg
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.startswith(".")] == ["hashes"]


def test_a_file_that_is_not_gguf_and_a_missing_one(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConfigError, match="not a readable GGUF file"):
        resolve_model(str(bad))
    with pytest.raises(ConfigError, match="GGUF file 'models/missing.gguf' does not exist"):
        resolve_model("models/missing.gguf")  # never taken for the Hub id 'models/missing.gguf'


def test_serve_takes_a_gguf(tiny):
    from agentrl.jobs.serve import resolve_target

    src, out = tiny
    assert resolve_target(src).model_dir == out
    with pytest.raises(ConfigError, match="--follow needs a run directory"):
        resolve_target(src, follow=True)


def test_check_template_on_a_gguf_prints_how_tools_reach_the_model(tiny):
    res = CliRunner().invoke(app, ["check-template", "--model", str(tiny[0])])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "OK for token-exact multi-turn" in out and "[PASS] renders_tools" in out
    assert "agentrl's tool block" in out and "model.tool_prompt=auto" in out
    res = CliRunner().invoke(app, ["check-template", "--model", str(tiny[0]), "--set", "model.tool_prompt=template"])
    assert res.exit_code == 1 and "[FAIL] renders_tools" in res.output


def test_a_gguf_without_a_chat_template_names_the_field(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    src = write_tiny_gguf(tmp_path / "bare.gguf", chat_template=None, seed=3)
    res = CliRunner().invoke(app, ["check-template", "--model", str(src)])
    assert res.exit_code == 2
    msg = " ".join(res.output.split())
    assert "model.chat_template" in msg and "has no chat template" in msg and "chatml" in msg
    res = CliRunner().invoke(app, ["check-template", "--model", str(src), "--set", "model.chat_template=chatml"])
    assert res.exit_code == 0, res.output
    assert "model.chat_template 'chatml'" in " ".join(res.output.split())


def test_rollout_on_a_gguf(tiny, tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        ["rollout", "--model", str(tiny[0]), "-n", "1", "-g", "2", "-o", str(out), "-q"]
        + ["--set", "rollout.max_new_tokens=8", "--set", "rollout.max_turns=1"],
    )
    assert res.exit_code == 0, res.output
    assert "agentrl's tool block" in " ".join(res.output.split())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == str(tiny[1]) and metrics["episodes"] == 2
    from transformers import AutoTokenizer

    from agentrl.trajectory import load

    traj = load(out / "trajectories.jsonl")[0]
    prompt = AutoTokenizer.from_pretrained(str(tiny[1])).decode(traj.token_ids[: traj.prompt_len])
    assert "<tools>" in prompt and '"name": "python"' in prompt and "<tool_call>" in prompt  # the tool block
