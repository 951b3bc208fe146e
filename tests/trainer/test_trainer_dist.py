"""Two trainer processes (gloo on CPU, launched with torchrun) match one process on the same data.

This file is also the worker: torchrun runs it as a script (see ``_worker``); the batch, config and
launch are tests/trainer_dist.py's. The run covers every collective path: policy + frozen reference
(KL in the loss) + critic, uneven micro-batch counts across ranks (one rank runs an empty
micro-batch), TIS, seq-mean aggregation, gathered logprobs / values, and a checkpoint written by 2
processes then resumed by 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from trainer_dist import MICRO_BATCH_TOKENS, STEPS, batch, config, run, torchrun

from agentrl.trainer import Trainer, pack
from agentrl.trainer import dist as D


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


def test_the_rendezvous_store_holds_its_port_until_the_ranks_join():
    """Ray trainer ranks meet on a store rank 0 opened on a port the OS chose and never released: a
    port picked, closed and bound again later can be taken in between (EADDRINUSE seen in CI)."""
    import socket

    store = D.listening_store(2)
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("0.0.0.0", store.port))
    peer = D.join_store("127.0.0.1", store.port, 2, timeout_s=10)
    peer.set("rank1", "here")
    assert store.get("rank1") == b"here"


def test_the_data_gives_ranks_uneven_micro_batch_counts():
    samples = batch(0)
    per_rank = D.assign([len(s.token_ids) for s in samples], 2)
    counts = [len(pack([samples[i] for i in idx], MICRO_BATCH_TOKENS)) for idx in per_rank]
    assert counts[0] != counts[1], counts


@pytest.mark.slow
def test_two_processes_match_one(model_dir, tmp_path):
    torchrun(__file__, [model_dir, str(tmp_path)], "2-process run")
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
