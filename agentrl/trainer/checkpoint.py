"""Trainer checkpoints: an HF-loadable model directory plus everything needed to resume exactly.

Layout of a checkpoint directory::

    config.json, generation_config.json, model.safetensors (or shards + index), tokenizer files
    optimizer.pt, scheduler.pt          full (gathered) optimizer / LR-scheduler state
    critic/critic.safetensors, critic/optimizer.pt, critic/scheduler.pt    (PPO with a critic)
    adapter/adapter_config.json, adapter/adapter_model.safetensors   (LoRA: the adapters, peft format)
    rng/rank{r}.pt                      torch (+cuda), numpy and python RNG states of each rank
    trainer_state.json                  version, world size, LoRA rank, has a critic, caller's ``extra``
    <caller's files>                    e.g. rollouts.jsonl: the run's finished-but-untrained groups
    MANIFEST.json                       size and sha256 of every file above (agentrl.trainer.integrity)
    COMPLETE                            written last: a directory without it is not a checkpoint

Atomic: everything is written to ``PATH.tmp`` and renamed into place after the marker; a save that
fails removes its ``PATH.tmp`` (a full disk is reported as such) and leaves earlier checkpoints alone. All ranks
call save/load (gathering is collective); rank 0 writes, every rank reads (shared filesystem).

With LoRA (``trainer.lora.rank`` > 0) the HF files at the top are the *merged* weights, written only
with ``lora.export_merged``; the trainable state is the adapters (``adapter/``, loadable with
``peft.PeftModel.from_pretrained(base, PATH/adapter)``; with ``lora.train_norms`` the trained gains
are in it too, as peft's modules_to_save), the adapters' optimizer state and, for a
critic, its adapters + value head. Resuming rebuilds the frozen base from the trainer's model path.

Owns: writing/reading that layout and HF export of a full state dict. Does not: decide when to
checkpoint or what ``extra`` holds (the run loop does). Gathered state makes this O(model) on rank
0's CPU; torch.distributed.checkpoint (sharded) would be the next step for very large models.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import cast

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from agentrl.common.faults import fault_point
from agentrl.errors import CheckpointError, ConfigError
from agentrl.trainer import dist as D
from agentrl.trainer import lora as L
from agentrl.trainer.integrity import MARKER, failed_save_cleanup, layout_gap, write_manifest

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def gather_model(model) -> dict[str, torch.Tensor]:
    """Full state dict on rank 0 (CPU), {} elsewhere. Collective."""
    sd = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_FULL))  # full: tensors only
    if D.world() == 1:
        # With one rank the "gathered" tensors are the live parameters themselves; callers get a
        # snapshot, not views that the next optimizer step would change under them.
        sd = {k: v.detach().clone() for k, v in sd.items()}
    return sd if D.rank() == 0 else {}


def tied_keys(model) -> dict[str, str]:
    """{tied parameter name: the name it shares storage with}, e.g. lm_head -> embed_tokens."""
    tied = getattr(model, "_tied_weights_keys", None)
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if cfg is not None and hasattr(cfg, "get_text_config") else cfg
    if not isinstance(tied, dict) or not getattr(text, "tie_word_embeddings", False):
        return {}
    return dict(tied)


def write_hf(out: Path, sd: dict[str, torch.Tensor], model, tokenizer_src: str | None) -> None:
    """Write ``sd`` as a from_pretrained-loadable directory (sharded above 5 GB)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v for k, v in sd.items() if k not in tied_keys(model)}  # HF re-ties on load
    split = split_torch_state_dict_into_shards(sd, filename_pattern="model{suffix}.safetensors", max_shard_size="5GB")
    for fname, keys in split.filename_to_tensors.items():
        save_file({k: sd[k].contiguous() for k in keys}, str(out / fname), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg = model.config
    attn = getattr(cfg, "_attn_implementation_internal", None)
    try:  # our varlen backend exists only where agentrl is imported: do not persist it
        cfg._attn_implementation_internal = None
        cfg.save_pretrained(str(out))
    finally:
        cfg._attn_implementation_internal = attn
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(str(out))
    if tokenizer_src:
        for name in _TOKENIZER_FILES:
            src = Path(tokenizer_src) / name
            if src.is_file():
                shutil.copy2(src, out / name)


def read_hf(path: Path, model) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    files = ["model.safetensors"]
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(path / f)))
    for tgt, src in tied_keys(model).items():
        if tgt not in sd and src in sd:
            sd[tgt] = sd[src]
    return sd


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save(trainer, path: str | Path, extra: dict | None, files: dict[str, str] | None = None) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    model_sd = gather_model(trainer.model)
    optim_sd = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=_FULL)
    critic_sd = critic_optim_sd = None
    if trainer.critic is not None:
        critic_sd = gather_model(trainer.critic)
        if trainer.cfg.lora.rank:  # the critic's frozen base is rebuilt from the model path on resume
            critic_sd = L.trainable_state(trainer.critic, critic_sd)
        critic_optim_sd = get_optimizer_state_dict(trainer.critic, trainer.critic_optimizer, options=_FULL)
    rank = D.rank()
    if rank == 0:
        json.dumps(extra or {})  # fail before writing anything if extra is not JSON
        if tmp.exists():
            shutil.rmtree(tmp)
    with failed_save_cleanup(tmp, path):
        _write(trainer, tmp, rank, model_sd, optim_sd, critic_sd, critic_optim_sd, extra, files)
    if rank == 0:
        old = path.with_name(path.name + ".old")
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        if old.exists():
            shutil.rmtree(old)
    D.barrier()


def _write(trainer, tmp: Path, rank: int, model_sd, optim_sd, critic_sd, critic_optim_sd, extra, files) -> None:
    """Everything of one checkpoint into ``tmp``, then its manifest, then (after the crash-test
    fault point) its marker; nothing outside ``tmp`` is touched."""
    if rank == 0:
        _write_policy(trainer, tmp, model_sd)
        torch.save(optim_sd, tmp / "optimizer.pt")
        torch.save(trainer.scheduler.state_dict(), tmp / "scheduler.pt")
        if trainer.critic is not None:
            (tmp / "critic").mkdir()
            save_file({k: v.contiguous() for k, v in critic_sd.items()}, str(tmp / "critic" / "critic.safetensors"))
            torch.save(critic_optim_sd, tmp / "critic" / "optimizer.pt")
            torch.save(trainer.critic_scheduler.state_dict(), tmp / "critic" / "scheduler.pt")
        (tmp / "rng").mkdir()
        state = {
            "version": trainer.version,
            "world_size": D.world(),
            "lora_rank": trainer.cfg.lora.rank,
            "critic": trainer.critic is not None,
            "extra": extra or {},
        }
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        for name, text in (files or {}).items():
            if "/" in name or name in ("", ".", "..") or (tmp / name).exists():
                raise ValueError(f"checkpoint file name {name!r} is not a new plain file name")
            (tmp / name).write_text(text, encoding="utf-8")
    D.barrier()
    torch.save(_rng_state(), tmp / "rng" / f"rank{rank}.pt")
    D.barrier()
    if rank == 0:
        write_manifest(tmp)
    fault_point("checkpoint_write")
    if rank == 0:
        (tmp / MARKER).write_text("ok\n")


def _write_policy(trainer, tmp: Path, model_sd: dict[str, torch.Tensor]) -> None:
    lora = trainer.cfg.lora
    if not lora.rank:
        write_hf(tmp, model_sd, trainer.model, trainer.model_path)
        return
    L.save_adapter(tmp / "adapter", model_sd, lora, trainer.model_path, L.trained_gains(trainer.model))
    if lora.export_merged:
        write_hf(tmp, L.merged_state_dict(model_sd, lora.scaling), trainer.model, trainer.model_path)


def _load_policy(trainer, path: Path, opts: StateDictOptions) -> None:
    """The policy's weights: the whole model, or (LoRA) its adapters (and trained gains) on the base
    it was built from."""
    if not trainer.cfg.lora.rank:
        set_model_state_dict(trainer.model, read_hf(path, trainer.model), options=opts)  # pyright: ignore[reportArgumentType]  torch types it dict[str, ValueType], an invariant dict of a union
        return
    sd = L.load_adapter(path / "adapter", trainer.cfg.lora)
    ours = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    if set(sd) != ours:
        diff = sorted(set(sd) ^ ours)
        raise ConfigError(
            f"{path}: its adapters do not match this trainer's (trainer.lora.target_modules); "
            f"{len(diff)} differ, e.g. {diff[:3]}"
        )
    set_model_state_dict(trainer.model, sd, options=opts)  # pyright: ignore[reportArgumentType]  torch types it dict[str, ValueType], an invariant dict of a union


def load(trainer, path: str | Path) -> dict:
    path = Path(path)
    if not (path / MARKER).exists():
        raise FileNotFoundError(f"{path} is not a complete trainer checkpoint (no {MARKER} marker)")
    if gap := layout_gap(path):  # before reading anything: a clear error, not the first open() that fails
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {gap}")
    state = json.loads((path / "trainer_state.json").read_text())
    lora = trainer.cfg.lora
    if int(state.get("lora_rank", 0)) != lora.rank:
        raise ConfigError(
            f"{path}: written with trainer.lora.rank={state.get('lora_rank', 0)}, this trainer has "
            f"{lora.rank}: resume with the rank the checkpoint was trained with"
        )
    opts = StateDictOptions(full_state_dict=True, strict=not lora.rank)
    _load_policy(trainer, path, opts)
    optim_sd = torch.load(path / "optimizer.pt", weights_only=False)
    saved, ours = len(optim_sd.get("param_groups", ())), len(trainer.optimizer.param_groups)
    if saved != ours:  # torch would load it, mix up the groups' lrs and fail at the next step
        raise ConfigError(
            f"{path}: its optimizer has {saved} parameter group(s), this trainer {ours}: resume with the "
            f"trainer.norm_lr_scale the checkpoint was trained with (1 = one group, as every checkpoint from "
            f"before the option; `agentrl run` picks 300 for the built-in model when it is null)"
        )
    set_optimizer_state_dict(trainer.model, trainer.optimizer, optim_sd, options=opts)
    trainer.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    if trainer.critic is not None:
        if not (path / "critic").exists():
            raise FileNotFoundError(f"{path} has no critic state, but this trainer has a critic")
        set_model_state_dict(trainer.critic, load_file(str(path / "critic" / "critic.safetensors")), options=opts)  # pyright: ignore[reportArgumentType]  torch types it dict[str, ValueType], an invariant dict of a union
        critic_optim = torch.load(path / "critic" / "optimizer.pt", weights_only=False)
        set_optimizer_state_dict(trainer.critic, trainer.critic_optimizer, critic_optim, options=opts)
        trainer.critic_scheduler.load_state_dict(torch.load(path / "critic" / "scheduler.pt", weights_only=False))
    # A resumed run with a different world size still gets a deterministic RNG per rank.
    rng_file = path / "rng" / f"rank{D.rank() % int(state['world_size'])}.pt"
    _set_rng_state(torch.load(rng_file, weights_only=False))
    trainer.version = int(state["version"])
    D.barrier()
    return state["extra"]
