"""``auto`` device/dtype: cuda + bfloat16 where CUDA is visible (mocked here), cpu + float32 on this
CPU machine, for the engine and the trainer alike; and `agentrl run` under torchrun refuses cleanly."""

import os
import subprocess
import sys

import components
import pytest
import torch

from agentrl.config.schema import RunConfig, load_config
from agentrl.errors import ConfigError
from agentrl.models.device import Accelerators, choose, compute_dtype, device_line, resolve_device

GPUS = Accelerators(True, 8, ("NVIDIA H100 80GB HBM3",) * 8)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch reports 8 CUDA devices (nothing is ever placed on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)


def test_choose_rule():
    assert choose("auto", "auto", cuda=True) == ("cuda", "bfloat16")
    assert choose("auto", "auto", cuda=False) == ("cpu", "float32")
    assert choose("cuda:1", "auto", cuda=True) == ("cuda:1", "bfloat16")
    assert choose("cpu", "auto", cuda=True) == ("cpu", "float32")  # explicit wins
    assert choose("auto", "float16", cuda=True) == ("cuda", "float16")
    with pytest.raises(ConfigError, match="model.device: 'cuda' but no CUDA GPU"):
        choose("cuda", "auto", cuda=False)
    with pytest.raises(ConfigError, match="model.device: 'tpu9' is not a torch device"):
        choose("tpu9", "auto", cuda=False)
    with pytest.raises(ConfigError, match="model.dtype: 'int4'"):
        choose("cpu", "int4", cuda=False)
    assert compute_dtype("auto", "cuda") == "bfloat16" and compute_dtype("auto", "cpu") == "float32"


def test_auto_is_cpu_float32_on_this_machine():
    if torch.cuda.is_available():
        components.unavailable("no-gpu", "this machine has a GPU")
    cfg = resolve_device(RunConfig())
    assert (cfg.model.device, cfg.model.dtype) == ("cpu", "float32")
    assert (cfg.trainer.device, cfg.trainer.param_dtype) == ("cpu", "float32")
    assert resolve_device(cfg) == cfg  # idempotent
    assert device_line(cfg).startswith("device: cpu, dtype float32; trainer cpu / float32 compute")


def test_resolve_device_with_gpus_and_the_written_config(tmp_path):
    cfg = resolve_device(RunConfig(), GPUS)
    assert (cfg.model.device, cfg.model.dtype) == ("cuda", "bfloat16")
    assert (cfg.trainer.device, cfg.trainer.param_dtype) == ("cuda", "bfloat16")
    assert "cuda (8 x NVIDIA H100 80GB HBM3), dtype bfloat16" in device_line(cfg, GPUS)
    from agentrl.config.schema import save_config

    save_config(cfg, tmp_path / "config.yaml")
    import yaml

    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert written["model"]["device"] == "cuda" and written["model"]["dtype"] == "bfloat16"
    assert written["trainer"]["device"] == "cuda" and written["trainer"]["param_dtype"] == "bfloat16"
    # explicit choices survive
    mine = resolve_device(load_config([], ["model.dtype=float32", "trainer.param_dtype=float16"]), GPUS)
    assert (mine.model.dtype, mine.trainer.param_dtype) == ("float32", "float16")


def test_ray_auto_follows_the_layouts_gpus_not_the_driver():
    on_gpus = load_config([], ["distributed=ray", "ray.engine_gpus=1", "ray.trainer_gpus=1"])
    assert resolve_device(on_gpus, Accelerators(False)).model.device == "cuda"
    on_cpus = load_config([], ["distributed=ray"])
    assert resolve_device(on_cpus, GPUS).model.device == "cpu"


def test_engine_and_trainer_choose_cuda_bf16_when_cuda_is_visible(fake_cuda):
    from agentrl.engine.local.engine import placement
    from agentrl.trainer.dist import pick_device
    from agentrl.trainer.models import mixed_precision

    assert placement("auto", "auto") == ("cuda", torch.bfloat16)
    assert placement("cpu", torch.float32) == ("cpu", torch.float32)
    assert pick_device("auto") == torch.device("cuda", 0)
    mp = mixed_precision("auto", "cuda")
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.float32  # fp32 reductions
    cfg = resolve_device(RunConfig())  # probes the (mocked) machine
    assert (cfg.model.device, cfg.model.dtype, cfg.trainer.param_dtype) == ("cuda", "bfloat16", "bfloat16")


def test_engine_and_trainer_stay_on_cpu_float32_here():
    if torch.cuda.is_available():
        components.unavailable("no-gpu", "this machine has a GPU")
    from agentrl.engine.local.engine import placement
    from agentrl.trainer.dist import pick_device
    from agentrl.trainer.models import mixed_precision

    assert placement("auto", "auto") == ("cpu", torch.float32)
    assert pick_device("auto") == torch.device("cpu")
    assert mixed_precision("auto", "cpu").param_dtype == torch.float32


def test_local_engine_loads_with_auto_on_cpu(tiny_model_dir):
    from agentrl.engine.local.engine import LocalEngine

    eng = LocalEngine(str(tiny_model_dir))  # defaults: auto / auto
    assert eng.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert eng.model.dtype == (torch.bfloat16 if torch.cuda.is_available() else torch.float32)


def test_refuse_launcher():
    from agentrl.trainer.dist import refuse_launcher

    refuse_launcher("agentrl run", {})
    refuse_launcher("agentrl run", {"WORLD_SIZE": "1", "RANK": "0"})
    with pytest.raises(ConfigError, match=r"rank 1 of WORLD_SIZE=2.*distributed: ray.*gpu_1node_8x_sglang"):
        refuse_launcher("agentrl run", {"WORLD_SIZE": "2", "RANK": "1"})
    with pytest.raises(ConfigError, match="WORLD_SIZE='two'"):
        refuse_launcher("agentrl run", {"WORLD_SIZE": "two"})


def test_agentrl_run_under_torchrun_env_refuses_before_building_anything(tmp_path):
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511",
        "AGENTRL_CACHE": str(tmp_path / "cache"),
    }
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl", "run", "--steps", "1", "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "WORLD_SIZE=2" in text and "distributed: ray" in text
    assert not (tmp_path / "cache").exists() and not (out / "checkpoints").exists()  # refused before any work
