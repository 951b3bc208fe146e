"""The trainer's process group and the data-parallel bookkeeping around it.

Owns: creating (or joining) the default torch.distributed group - a 1-rank group when the process
was not launched by torchrun, so one code path (FSDP2 always applied) serves 1 and N processes -
with reference counting so several Trainers in one process share it; choosing the device and
backend (gloo on CPU, NCCL on CUDA); the deterministic assignment of samples to ranks; and small
collectives (sums, max, gathering Python objects).

Every rank must call the trainer with the *same* full list of samples: each takes its own slice.

Also refuses a job that must run as one process when a launcher started several
(``refuse_launcher``). Does not: shard parameters (``models``) or launch processes (torchrun / the
caller does).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed import HashStore, Store, TCPStore  # pyright: ignore[reportPrivateImportUsage]  (not in its __all__)

from agentrl.errors import ConfigError
from agentrl.models.device import choose

_owned_refs = 0  # Trainers holding a group this module created


def pick_device(name: str) -> torch.device:
    """This rank's device for trainer.device ``name`` (``auto``: cuda when visible, by
    ``agentrl.models.device.choose``); bare ``cuda`` is this rank's LOCAL_RANK GPU."""
    name, _ = choose(name, "auto", torch.cuda.is_available(), what="trainer")
    if name == "cuda":
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def refuse_launcher(job: str, environ: dict | None = None) -> None:
    """ConfigError if this process is one of several a launcher (torchrun) started for ``job``.

    ``agentrl run`` drives rollouts and training from one process: under torchrun every rank would
    build its own engine and its own copy of the run. Several trainer ranks come from Ray instead."""
    env = os.environ if environ is None else environ
    raw = env.get("WORLD_SIZE", "1")
    try:
        world_size = int(raw)
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={raw!r} in the environment is not an integer") from None
    if world_size > 1:
        raise ConfigError(
            f"{job}: started as rank {env.get('RANK', '?')} of WORLD_SIZE={world_size} (torchrun or another "
            f"launcher); {job} is one process that drives rollouts and trains, and every rank would build its own "
            "engine. Start it once, without torchrun; for several GPUs set `distributed: ray` with "
            "ray.trainer_ranks / ray.num_engines (e.g. -c configs/gpu_1node_8x_sglang.yaml)."
        )


def acquire(device: torch.device, timeout_s: float, store: Store | None = None) -> bool:
    """Join the default group, creating it if needed. True if this module owns it.

    ``store``: the rendezvous store of a multi-process group whose ranks were not started by a
    launcher (Ray trainer ranks; RANK and WORLD_SIZE in the environment); rank 0 created it
    listening, so no port is released and re-bound between choosing it and using it."""
    global _owned_refs
    if dist.is_initialized():
        if _owned_refs:
            _owned_refs += 1
            return True
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is not None:
        store.set_timeout(timeout)
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    elif "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)  # env:// (torchrun)
    else:
        dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1, timeout=timeout)
    _owned_refs = 1
    return True


def release(owned: bool) -> None:
    global _owned_refs
    if not owned or not dist.is_initialized():
        return
    _owned_refs -= 1
    if _owned_refs == 0:
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank()


def world() -> int:
    return dist.get_world_size()


def assign(lengths: list[int], n_ranks: int) -> list[list[int]]:
    """Longest-processing-time-first: sample indices per rank, balanced by token count.

    Deterministic (ties broken by index), so every rank computes the same assignment.
    """
    out: list[list[int]] = [[] for _ in range(n_ranks)]
    load = [0] * n_ranks
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(n_ranks), key=lambda r: (load[r], r))
        out[r].append(i)
        load[r] += lengths[i]
    return [sorted(x) for x in out]


def all_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if world() > 1:
        dist.all_reduce(t)
    return t.tolist()


def all_max_int(value: int, device: torch.device) -> int:
    t = torch.tensor([value], dtype=torch.long, device=device)
    if world() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_objects(obj) -> list:
    if world() == 1:
        return [obj]
    out: list = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def listening_store(world_size: int) -> TCPStore:
    """A rendezvous store for ``world_size`` ranks, listening on a port the OS chose (``.port``).

    Held open from the start: choosing a free port, closing it and binding it again later (what
    env:// with a picked MASTER_PORT does) lets another process take it in between (EADDRINUSE)."""
    return TCPStore("0.0.0.0", 0, world_size, is_master=True, wait_for_workers=False)


def join_store(host: str, port: int, world_size: int, timeout_s: float) -> TCPStore:
    """A client of the store :func:`listening_store` made on ``host``."""
    timeout = datetime.timedelta(seconds=timeout_s)
    return TCPStore(host, port, world_size, is_master=False, timeout=timeout)
