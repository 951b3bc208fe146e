"""Two trainer processes against one: what the torchrun checks (tests/trainer/test_trainer_dist.py,
test_lora_dist.py) and the Ray one (tests/distributed/test_ray.py) share.

Owns the batch whose samples give two ranks uneven micro-batch counts (``batch``), the trainer config
of the full check (``config``: policy + frozen reference + critic, TIS, seq-mean aggregation), the
steps compared (``run``), and ``torchrun``: a test file run as a 2-process torchrun job (the file's
``__main__`` is the worker; it imports from tests/ like the tests do), killed as a whole process
group when it passes its deadline.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.trainer import Trainer, TrainerConfig, TrainSample

STEPS = 3
MICRO_BATCH_TOKENS = 48
TIMEOUT_S = 300
TESTS = str(Path(__file__).resolve().parent)


def batch(seed: int) -> list[TrainSample]:
    # Lengths chosen so the two ranks get different numbers of micro-batches (test_trainer_dist checks it).
    rng = random.Random(seed)
    out = []
    for i, n in enumerate([45, 20, 20, 20, 3]):
        p = 4 if i != 4 else n  # the last sample has no loss tokens at all
        mask = [0] * p + [1] * (n - p)
        out.append(
            TrainSample(
                token_ids=[rng.randrange(5, 1000) for _ in range(n)],
                loss_mask=mask,
                behaviour_logprobs=[rng.uniform(-7.5, -6.5) * m for m in mask],
                advantages=[rng.choice([-1.0, 0.5, 1.0]) * m for m in mask],
                returns=[rng.uniform(-1, 1) * m for m in mask],
            )
        )
    return out


def config() -> TrainerConfig:
    return TrainerConfig(
        lr=1e-3,
        micro_batch_tokens=MICRO_BATCH_TOKENS,
        kl_coef=0.05,
        entropy_coef=0.01,
        tis_cap=2.0,
        loss_agg="seq-mean-token-mean",
        critic_lr=1e-3,
        dist_timeout_s=120,
    )


def run(t: Trainer, steps: int = STEPS) -> dict:
    """``steps`` train steps on ``batch(0..steps-1)``, then the policy's logprobs and the critic's values."""
    metrics = [t.train_step(batch(s)) for s in range(steps)]
    return {"metrics": metrics, "logprobs": t.logprobs(batch(0)), "values": t.values(batch(0))}


def torchrun(script: str, args: list[str], what: str, timeout_s: float = TIMEOUT_S) -> None:
    """Run ``script args`` on 2 local processes with torchrun; fail the test (with the log's tail)
    when it fails or passes ``timeout_s``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # the launcher's store listens on a port it chose and holds: no port race
        "--nproc_per_node=2",
        script,
        *args,
    ]
    path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both workers
        log, _ = proc.communicate()
        pytest.fail(f"{what} did not finish in {timeout_s}s:\n{log[-4000:]}")
    assert proc.returncode == 0, log[-6000:]
