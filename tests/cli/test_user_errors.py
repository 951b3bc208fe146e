"""Every bad input a careless user can type (issue 20, "clear errors at the user surface"): config files,
``--set`` values, datasets, model directories, sandbox CLI arguments. Each must end in ONE line naming the
file, field or row and the problem, exit code 2 and no traceback; ``--debug`` shows the traceback.

``CASES`` is the table: id -> (argv builder, words the error line must contain).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app

runner = CliRunner()
DEEP = 5000
BIG = "9" * 5000


def _model(tmp: Path, src: Path, mutate) -> str:
    d = tmp / "model"
    shutil.copytree(src, d)
    mutate(d)
    return str(d)


def _truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


def _write(p: Path, data) -> str:
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return str(p)


def _rollout_with(model: str, *sets: str) -> list:
    argv = ["rollout", "--env", "code_exec", "--model", model, "-n", "1", "-g", "1", "-q"]
    for s in sets:
        argv += ["--set", s]
    return argv


def _dataset(tmp: Path, tiny: Path, name: str, data) -> list:
    path = tmp / name
    if data is None:
        path.mkdir()
    else:
        _write(path, data)
    return _rollout_with(str(tiny), f"env.kwargs={{dataset: {path}}}", f"output_dir={tmp / 'out'}")


def _bad_model(cmd: str, mutate):
    def build(tmp, tiny):
        model = _model(tmp, tiny, mutate)
        if cmd == "rollout":
            return _rollout_with(model, f"output_dir={tmp / 'out'}")
        if cmd == "run":
            return ["run", "--model", model, "-o", str(tmp / "out"), "-q", "--steps", "1"]
        if cmd == "sft":
            return ["sft", "--model", model, "-o", str(tmp / "out"), "-q", "--steps", "1"]
        return ["serve", model, "--backend", "local", "--port", "0"]

    return build


def _rm(*names):
    return lambda d: [os.remove(d / n) for n in names]


RANDOM = bytes((i * 7919 + 13) % 256 for i in range(4096))  # deterministic "random" bytes, invalid UTF-8
NOTOK = _rm("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

CASES = {
    # -- config files and --set values ------------------------------------------------------------
    "config_is_directory": (lambda t, m: ["config", "-c", str(t)], ["config file", "is a directory"]),
    "config_is_binary": (lambda t, m: ["config", "-c", _write(t / "c.yaml", RANDOM)], ["c.yaml", "UTF-8"]),
    "config_deep_list": (
        lambda t, m: ["config", "-c", _write(t / "c.yaml", "a: " + "[" * DEEP + "]" * DEEP)],
        ["c.yaml", "nested"],
    ),
    "config_deep_map": (
        lambda t, m: ["config", "-c", _write(t / "c.yaml", "a: " + "{a: " * DEEP + "1" + "}" * DEEP)],
        ["c.yaml", "nested"],
    ),
    "config_huge_int": (
        lambda t, m: ["config", "-c", _write(t / "c.yaml", f"rollout:\n  seed: {BIG}\n")],
        ["c.yaml", "digits"],
    ),
    "config_nan_value": (
        lambda t, m: ["config", "-c", _write(t / "c.yaml", "rollout:\n  temperature: .nan\n")],
        ["rollout.temperature", "finite"],
    ),
    "set_huge_int": (lambda t, m: ["config", "--set", f"rollout.seed={BIG}"], ["rollout.seed", "digits"]),
    "set_huge_int_in_kwargs": (lambda t, m: ["config", "--set", f"env.kwargs={{x: {BIG}}}"], ["env.kwargs", "digits"]),
    "set_int_beyond_int64": (
        lambda t, m: ["config", "--set", "rollout.max_turns=" + "9" * 30],
        ["rollout.max_turns", "too large"],
    ),
    "set_temperature_nan": (
        lambda t, m: ["config", "--set", "rollout.temperature=.nan"],
        ["rollout.temperature", "finite"],
    ),
    "set_temperature_inf": (
        lambda t, m: ["config", "--set", "rollout.temperature=.inf"],
        ["rollout.temperature", "finite"],
    ),
    "set_eval_temperature_nan": (
        lambda t, m: ["config", "--set", "eval.temperature=nan"],
        ["eval.temperature", "finite"],
    ),
    "set_top_p_nan": (lambda t, m: ["config", "--set", "rollout.top_p=.NaN"], ["rollout.top_p", "finite"]),
    "set_lr_overflow": (lambda t, m: ["config", "--set", "trainer.lr=1e999"], ["trainer.lr", "finite"]),
    "set_timeout_inf": (
        lambda t, m: ["config", "--set", "rollout.turn_timeout_s=.inf"],
        ["rollout.turn_timeout_s", "finite"],
    ),
    "set_float_from_huge_int": (lambda t, m: ["config", "--set", "algo.gamma=" + "9" * 400], ["algo.gamma", "finite"]),
    "set_deep_kwargs": (
        lambda t, m: ["config", "--set", "env.kwargs=" + "{a: " * DEEP + "1" + "}" * DEEP],
        ["env.kwargs", "nested"],
    ),
    "set_deep_list": (
        lambda t, m: ["config", "--set", "engine.urls=" + "[" * DEEP + "]" * DEEP],
        ["engine.urls", "nested"],
    ),
    "set_empty_key": (lambda t, m: ["config", "--set", "rollout..seed=1"], ["rollout..seed", "empty"]),
    # -- datasets (code_exec's dataset=PATH) --------------------------------------------------------
    "dataset_binary_jsonl": (lambda t, m: _dataset(t, m, "d.jsonl", RANDOM), ["d.jsonl", "line", "UTF-8"]),
    "dataset_binary_json": (lambda t, m: _dataset(t, m, "d.json", RANDOM), ["d.json", "UTF-8"]),
    "dataset_deep_row": (
        lambda t, m: _dataset(t, m, "d.jsonl", "[" * DEEP + "]" * DEEP + "\n"),
        ["d.jsonl", "line 1", "nested"],
    ),
    "dataset_deep_json": (lambda t, m: _dataset(t, m, "d.json", "[" * DEEP + "]" * DEEP), ["d.json", "nested"]),
    "dataset_deep_extra_info": (
        lambda t, m: _dataset(
            t,
            m,
            "d.jsonl",
            json.dumps({"prompt": "q", "answer": "1", "extra_info": {}})[:-3]
            + '{"a": ' * 500
            + "1"
            + "}" * 500
            + "}\n",
        ),
        ["d.jsonl", "line 1", "nested"],
    ),
    "dataset_huge_number": (
        lambda t, m: _dataset(t, m, "d.jsonl", '{"prompt": "q", "answer": ' + BIG + "}\n"),
        ["d.jsonl", "line 1", "digits"],
    ),
    "dataset_inf_answer": (
        lambda t, m: _dataset(t, m, "d.jsonl", '{"prompt": "q", "answer": 1e999}\n'),
        ["d.jsonl", "line 1", "finite"],
    ),
    "dataset_nan_answer": (
        lambda t, m: _dataset(t, m, "d.jsonl", '{"prompt": "q", "answer": NaN}\n'),
        ["d.jsonl", "line 1", "finite"],
    ),
    "dataset_directory": (lambda t, m: _dataset(t, m, "d.jsonl", None), ["d.jsonl", "is a directory"]),
    # -- model directories ------------------------------------------------------------------------
    "model_missing": (lambda t, m: _rollout_with(str(t / "nope"), f"output_dir={t / 'out'}"), ["model.path", "nope"]),
    "model_is_file": (
        lambda t, m: _rollout_with(_write(t / "m.bin", b"x"), f"output_dir={t / 'out'}"),
        ["model.path", "m.bin"],
    ),
    "model_no_weights": (_bad_model("rollout", _rm("model.safetensors")), ["model.path", "weights"]),
    "model_empty_weights": (
        _bad_model("rollout", lambda d: (d / "model.safetensors").write_bytes(b"")),
        ["model.safetensors", "empty"],
    ),
    "model_truncated_weights": (
        _bad_model("rollout", lambda d: _truncate(d / "model.safetensors")),
        ["model.safetensors", "truncated"],
    ),
    "model_random_weights": (
        _bad_model("rollout", lambda d: (d / "model.safetensors").write_bytes(RANDOM)),
        ["model.safetensors", "not a safetensors file"],
    ),
    "model_missing_shard": (
        _bad_model(
            "rollout",
            lambda d: (
                (d / "model.safetensors").rename(d / "x"),
                (d / "model.safetensors.index.json").write_text(
                    json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
                ),
            ),
        ),
        ["model-00001-of-00002.safetensors", "missing"],
    ),
    "model_no_tokenizer": (_bad_model("rollout", NOTOK), ["model.path", "tokenizer"]),
    "model_config_not_json": (
        _bad_model("rollout", lambda d: (d / "config.json").write_text("{oops")),
        ["config.json", "not valid JSON"],
    ),
    "model_config_not_object": (
        _bad_model("rollout", lambda d: (d / "config.json").write_text("[1]")),
        ["config.json", "object"],
    ),
    "model_config_bad_type": (
        _bad_model("rollout", lambda d: (d / "config.json").write_text('{"model_type": "nope"}')),
        ["config.json", "nope"],
    ),
    "model_config_binary": (
        _bad_model("rollout", lambda d: (d / "config.json").write_bytes(RANDOM)),
        ["config.json", "UTF-8"],
    ),
    "run_model_truncated_weights": (
        _bad_model("run", lambda d: _truncate(d / "model.safetensors")),
        ["model.safetensors", "truncated"],
    ),
    "run_model_no_tokenizer": (_bad_model("run", NOTOK), ["model.path", "tokenizer"]),
    "sft_model_random_weights": (
        _bad_model("sft", lambda d: (d / "model.safetensors").write_bytes(RANDOM)),
        ["model.safetensors", "not a safetensors file"],
    ),
    "serve_model_no_tokenizer": (_bad_model("serve", NOTOK), ["tokenizer"]),
    "serve_model_empty_weights": (
        _bad_model("serve", lambda d: (d / "model.safetensors").write_bytes(b"")),
        ["model.safetensors", "empty"],
    ),
    # -- sandbox CLI arguments --------------------------------------------------------------------
    "sandbox_timeout_inf": (lambda t, m: ["sandbox", "exec", "--timeout", "inf", "--", "true"], ["--timeout", "inf"]),
    "sandbox_timeout_nan": (lambda t, m: ["sandbox", "exec", "--timeout", "nan", "--", "true"], ["--timeout", "nan"]),
    "sandbox_timeout_negative": (
        lambda t, m: ["sandbox", "exec", "--timeout", "-1", "--", "true"],
        ["--timeout", "-1"],
    ),
    "sandbox_timeout_zero": (lambda t, m: ["sandbox", "exec", "--timeout", "0", "--", "true"], ["--timeout", "0"]),
    "sandbox_timeout_huge": (
        lambda t, m: ["sandbox", "exec", "--timeout", "1e300", "--", "true"],
        ["--timeout", "1e+300"],
    ),
    "sandbox_memory_zero": (lambda t, m: ["sandbox", "exec", "--memory", "0", "--", "true"], ["--memory", "0"]),
    "sandbox_memory_negative": (lambda t, m: ["sandbox", "exec", "--memory", "-5", "--", "true"], ["--memory", "-5"]),
    "sandbox_stdin_directory": (
        lambda t, m: ["sandbox", "exec", "--stdin", str(t), "--", "true"],
        ["--stdin", "directory"],
    ),
    "sandbox_file_missing": (
        lambda t, m: ["sandbox", "exec", "--file", f"a={t / 'nope'}", "--", "true"],
        ["--file", "nope"],
    ),
    "sandbox_bad_backend": (lambda t, m: ["sandbox", "exec", "--backend", "bogus", "--", "true"], ["bogus"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_clear_line_and_exit_2(case, tmp_path, tiny_model_dir):
    build, words = CASES[case]
    argv = build(tmp_path, Path(tiny_model_dir))
    res = runner.invoke(app, argv)
    out = res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), f"{case}: raised {res.exception!r}\n{out}"
    assert res.exit_code == 2, f"{case}: exit {res.exit_code}\n{out}"
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"{case}: expected one 'error:' line\n{out}"
    assert all(w.lower() in errors[0].lower() for w in words), f"{case}: {words} not all in {errors[0]!r}"
    assert "Traceback" not in out and len(errors[0]) < 600, errors[0]


def test_a_utf8_bom_is_accepted_in_jsonl_and_json(tmp_path):
    from agentrl.envs.datasets import load_tasks

    row = {"prompt": "q", "answer": 1}
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    (tmp_path / "a.json").write_bytes(b"\xef\xbb\xbf" + json.dumps([row]).encode())
    assert load_tasks(tmp_path / "a.jsonl")[0]["answer"] == "1"
    assert load_tasks(tmp_path / "a.json")[0]["answer"] == "1"


def test_as_a_process_no_traceback_and_debug_shows_it(tmp_path):
    bad = [sys.executable, "-m", "agentrl"]
    args = ["config", "--set", "rollout.temperature=.nan"]
    p = subprocess.run(bad + args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr
    assert "rollout.temperature" in p.stdout + p.stderr
    p = subprocess.run(bad + ["--debug"] + args, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" in p.stdout + p.stderr and "ConfigError" in p.stdout + p.stderr


def test_an_unexpected_exception_is_one_line_exit_1_and_debug_shows_it(monkeypatch):
    import agentrl.config.schema as config_mod

    def boom(*a, **k):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(config_mod, "load_config", boom)
    res = runner.invoke(app, ["config"])
    assert res.exit_code == 1 and "internal error" in res.output and "planted" in res.output and "--debug" in res.output
    res = runner.invoke(app, ["--debug", "config"])
    assert isinstance(res.exception, ZeroDivisionError)


# -- a run that cannot work stops with the reason instead of "finishing" ----------------------------
def _register_broken_env():
    import agentrl
    from agentrl.envs.base import AgentEnv, join_messages

    class AlwaysBrokenSandbox(AgentEnv):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            msgs = [{"role": "user", "content": "Say a number."}]
            return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

        def step(self, action):
            from agentrl.errors import SandboxError

            raise SandboxError("planted: the sandbox is down")

    agentrl.register("test/AlwaysBrokenSandbox-v0", entry_point=AlwaysBrokenSandbox, override=True)


@pytest.mark.parametrize("num_eval, what", [(8, "the first evaluation"), (0, "the first training step")])
def test_a_run_whose_every_episode_fails_alike_stops_with_the_reason(tiny_model_dir, tmp_path, num_eval, what):
    _register_broken_env()
    out = tmp_path / "run"
    sets = [
        "rollout.max_new_tokens=4",
        "rollout.max_turns=1",
        "rollout.score_truncated=true",
        "rollout.group_size=4",
        "train.groups_per_step=2",
        "train.max_staleness=0",
        f"eval.num_tasks={num_eval}",
        "eval.env_kwargs={}",
        "env.kwargs={}",
        "logging.tensorboard=false",
        "train.checkpoint_every=1",
    ]
    argv = [
        "run",
        "--env",
        "test/AlwaysBrokenSandbox-v0",
        "--model",
        str(tiny_model_dir),
        "--steps",
        "2",
        "-o",
        str(out),
        "-q",
    ] + [a for s in sets for a in ("--set", s)]
    res = runner.invoke(app, argv)
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.output
    assert what in errors[0] and "sandbox_error" in errors[0] and "planted: the sandbox is down" in errors[0]
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
