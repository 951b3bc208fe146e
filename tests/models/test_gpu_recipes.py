"""The GPU recipes in configs/ resolve, on a (described) 8-GPU machine, to the layout they promise."""

from pathlib import Path

import pytest

from agentrl.config.schema import load_config
from agentrl.models.device import Accelerators

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GPUS = Accelerators(True, 8, ("NVIDIA H100 80GB HBM3",) * 8)


@pytest.mark.parametrize(
    "name, engine, sync, gpus",
    [
        ("gpu_1x_colocated.yaml", "local", "inprocess", 1),
        ("gpu_1node_8x_sglang.yaml", "sglang", "distributed", 8),
        ("gpu_multinode_ray.yaml", "sglang", "object_store", 16),
    ],
)
def test_gpu_recipe_resolves_to_cuda_bf16(name, engine, sync, gpus):
    from agentrl.config.plan import resolve

    cfg = resolve(load_config([CONFIGS / name]), "run", found=GPUS).cfg
    assert (cfg.model.device, cfg.model.dtype) == ("cuda", "bfloat16")
    assert (cfg.trainer.device, cfg.trainer.param_dtype) == ("cuda", "bfloat16")
    assert cfg.engine.kind == engine and cfg.engine.weight_sync == sync
    if cfg.distributed == "ray":
        r = cfg.ray
        assert r.placement == "split" and r.trainer_gpus == 1 and r.engine_gpus == 1
        assert r.trainer_ranks + r.num_engines == gpus  # every GPU used, none twice
    else:
        assert gpus == 1 and cfg.distributed == "local"


def test_colocated_recipe_runs_on_cpu_where_there_is_no_gpu():
    from agentrl.config.plan import resolve

    # the colocated recipe on a CPU machine runs on CPU (auto); the Ray ones ask Ray for GPUs
    cpu = resolve(load_config([CONFIGS / "gpu_1x_colocated.yaml"]), "run", found=Accelerators(False)).cfg
    assert (cpu.model.device, cpu.model.dtype) == ("cpu", "float32")
