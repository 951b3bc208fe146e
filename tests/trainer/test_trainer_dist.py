"""Two trainer processes (gloo on CPU, launched with torchrun) match one process on the same data.

This file is also the worker: torchrun runs it as a script (see ``_worker``). The run covers every
collective path: policy + frozen reference (KL in the loss) + critic, uneven micro-batch counts
across ranks (one rank runs an empty micro-batch), TIS, seq-mean aggregation, gathered logprobs /
values, and a checkpoint written by 2 processes then resumed by 1.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig, TrainSample, pack
from agentrl.trainer import dist as D

STEPS = 3
MICRO_BATCH_TOKENS = 48
TIMEOUT_S = 300


def batch(seed: int) -> list[TrainSample]:
    # Lengths chosen so the two ranks get different numbers of micro-batches (checked below).
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


def run(t: Trainer) -> dict:
    metrics = [t.train_step(batch(s)) for s in range(STEPS)]
    return {"metrics": metrics, "logprobs": t.logprobs(batch(0)), "values": t.values(batch(0))}


def _worker(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    with Trainer(model_dir, config(), critic=True) as t:
        assert t.world == 2
        res = run(t)
        sd = t.full_state_dict()
        t.save(out / "ck", extra={"written_by": t.world})
        if t.rank == 0:
            torch.save(sd, out / "params.pt")
            (out / "result.json").write_text(json.dumps(res))
        else:
            assert sd == {}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("dist-model"), hidden_size=64, num_layers=2))


def test_the_data_gives_ranks_uneven_micro_batch_counts():
    samples = batch(0)
    per_rank = D.assign([len(s.token_ids) for s in samples], 2)
    counts = [len(pack([samples[i] for i in idx], MICRO_BATCH_TOKENS)) for idx in per_rank]
    assert counts[0] != counts[1], counts


def _torchrun(model_dir: str, out_dir: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={D.free_port()}",
        __file__,
        model_dir,
        str(out_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both workers
        log, _ = proc.communicate()
        pytest.fail(f"2-process run did not finish in {TIMEOUT_S}s:\n{log[-4000:]}")
    assert proc.returncode == 0, log[-6000:]


@pytest.mark.slow
def test_two_processes_match_one(model_dir, tmp_path):
    _torchrun(model_dir, tmp_path)
    two = json.loads((tmp_path / "result.json").read_text())
    p2 = torch.load(tmp_path / "params.pt")

    with Trainer(model_dir, config(), critic=True) as t:
        one = run(t)
        p1 = t.full_state_dict()
        t.train_step(batch(7))
        p1_next = t.full_state_dict()

    diff = max((p1[k] - p2[k]).abs().max().item() for k in p1)
    print(f"\nmax |param(1 proc) - param(2 procs)| after {STEPS} steps: {diff:.3g}")
    assert p1.keys() == p2.keys() and diff < 1e-5
    for m1, m2 in zip(one["metrics"], two["metrics"]):
        for k in (
            "loss",
            "pg_loss",
            "kl",
            "entropy",
            "value_loss",
            "tokens",
            "loss_tokens",
            "tis_weight",
            "mismatch/abs_diff_mean",
            "mismatch/abs_diff_max",
        ):
            assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-6), k
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    for key in ("logprobs", "values"):
        worst = max(abs(a - b) for r1, r2 in zip(one[key], two[key]) for a, b in zip(r1, r2))
        assert worst < 1e-5, (key, worst)

    # The checkpoint written by 2 processes resumes in 1 and continues like the 1-process run.
    with Trainer(model_dir, config(), critic=True) as u:
        assert u.load(tmp_path / "ck") == {"written_by": 2} and u.version == STEPS
        u.train_step(batch(7))
        resumed = u.full_state_dict()
    diff_next = max((resumed[k] - p1_next[k]).abs().max().item() for k in resumed)
    print(f"max diff after resuming the 2-process checkpoint for one more step: {diff_next:.3g}")
    assert diff_next < 1e-5


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
