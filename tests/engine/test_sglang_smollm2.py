"""The SGLang launcher on a directory whose config.json declares GGUF quantization over plain weights (issue 32's
refusal), without SGLang."""

from __future__ import annotations

import json

from agentrl.engine.sglang_server import SGLangServer, config_overrides


def test_a_gguf_quantization_config_over_plain_weights_is_dropped_for_sglang(tmp_path):
    """A directory saved by hand from a model transformers loaded from a .gguf keeps its ``quantization_config``
    (quant_method gguf) over plain safetensors weights. SGLang 0.5.23 took it for GGUF weights and refused the
    first plain one ("No module or parameter named 'model.layers.0.mlp.down_proj.weight' in
    TransformersForCausalLM"); the launcher has SGLang read the config without it, as transformers does. Measured
    on SmolLM2 saved that way: served, logprobs within 3.0e-5 of the trainer's. Any other config is left alone."""
    plain = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    quant = {**plain, "quantization_config": {"quant_method": "gguf", "gguf_file": "m.gguf", "dequantize": False}}
    for name, cfg in (
        ("plain", plain),
        ("gguf", quant),
        ("awq", {**plain, "quantization_config": {"quant_method": "awq"}}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert config_overrides(tmp_path / "gguf") == {"quantization_config": None}
    assert config_overrides(tmp_path / "plain") == config_overrides(tmp_path / "awq") == {}
    assert config_overrides(tmp_path / "broken") == {}  # SGLang names what is wrong with it
    cmd = SGLangServer(tmp_path / "gguf", port=1234, python="py").command()
    i = cmd.index("--json-model-override-args")
    assert json.loads(cmd[i + 1]) == {"quantization_config": None} and cmd.count("--json-model-override-args") == 1
    assert "--json-model-override-args" not in SGLangServer(tmp_path / "plain", port=1234, python="py").command()
    mine = SGLangServer(tmp_path / "gguf", port=1234, python="py", extra_args=["--json-model-override-args", "{}"])
    assert mine.command()[-2:] == ["--json-model-override-args", "{}"]  # the caller's own comes last: it wins
