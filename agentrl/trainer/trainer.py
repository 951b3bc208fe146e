"""The FSDP2 trainer: one optimizer step over a batch of TrainSamples, on 1 or N processes.

Owns: the Trainer (policy + optional frozen reference + optional frozen distillation teacher
(``opd_coef``) + optional critic, the AdamW optimizers and LR schedules of the trained ones from
``agentrl.trainer.optim``; with ``lora.rank`` > 0 only LoRA adapters train: ``agentrl.trainer.lora``),
the step loop (shard samples across ranks, lay them out in micro-batches, build each one's loss,
accumulate gradients, clip, step) and its metrics, no-grad inference (logprobs, reference and
teacher logprobs, values) and the public face of weight export/checkpoints.

Algorithm-blind: the per-token advantages come from the run loop (agentrl.algos.credit); the policy
loss, the aggregation, the KL estimator, TIS, the distillation term and the value loss are looked up
by the names in TrainerConfig (``agentrl.trainer.objective``). There is no branch on an algorithm name here.

Exactness across world sizes: every rank gets the same full sample list and takes a deterministic
slice; aggregation denominators (loss tokens, sequences) are all-reduced, so each rank's loss is its
share of the *global* loss, and FSDP's gradient averaging is undone by scaling by the world size.
Ranks with fewer micro-batches run empty ones so every rank joins every collective.

Does not: compute advantages, talk to engines (weight sync takes ``full_state_dict()``), or launch
processes (use torchrun; without it the trainer makes a 1-process group).
"""

from __future__ import annotations

import functools
import importlib
import math
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.distributed.device_mesh import init_device_mesh

from agentrl.trainer import checkpoint as C
from agentrl.trainer import dist as D
from agentrl.trainer import lora as L
from agentrl.trainer.attention import VARLEN_SDPA
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.models import (
    all_targets,
    load_causal_lm,
    load_value_model,
    model_inputs,
    scatter_per_sample,
    shard,
    token_logprobs,
    token_values,
)
from agentrl.trainer.objective import Objective
from agentrl.trainer.optim import build_optimizer, clip_and_step
from agentrl.trainer.packing import MicroBatch, TrainSample, check_samples, dummy_micro_batch, pack, pad


def _algos():
    """agentrl.algos, imported when first needed (the trainer only needs it to train)."""
    try:
        return importlib.import_module("agentrl.algos")
    except ImportError as e:
        raise ImportError(f"the trainer needs agentrl.algos for its losses: {e}") from e


class StepInterrupted(Exception):
    """``train_step`` gave up at its ``interrupt`` before any optimizer step: the weights, the
    optimizer state, the schedules and ``version`` are as they were before the call."""


class Trainer:
    """See the module docstring. All ranks must make the same calls with the same arguments."""

    def __init__(
        self,
        model_path: str,
        cfg: TrainerConfig | None = None,
        *,
        ref_model_path: str | None = None,
        critic: bool = False,
        store: D.Store | None = None,
    ) -> None:
        self.cfg = cfg = (cfg or TrainerConfig()).resolved()
        cfg.check()
        self.model_path = str(model_path)
        self.device = D.pick_device(cfg.device)
        self._owns_group = D.acquire(self.device, cfg.dist_timeout_s, store)
        self._closed = False
        #: called in the training thread before each micro-batch (e.g. to resize its torch thread team
        #: when an in-process engine starts or stops computing); None: nothing
        self.before_micro_batch: Callable[[], None] | None = None
        try:
            self._build(ref_model_path, critic)
        except BaseException:
            self.close()
            raise

    def _build(self, ref_model_path: str | None, critic: bool) -> None:
        cfg = self.cfg
        self.rank, self.world = D.rank(), D.world()
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        mesh = init_device_mesh(self.device.type, (self.world,))
        wrap = functools.partial(
            shard, mesh=mesh, param_dtype=cfg.param_dtype, checkpointing=cfg.activation_checkpointing
        )
        lr = cfg.lr
        assert lr is not None  # resolved() fills it
        policy = load_causal_lm(self.model_path, cfg.attn_implementation)
        if cfg.lora.rank:  # adapters go in before sharding, so FSDP2 shards them with their layer
            L.apply(policy, cfg.lora)
        self.model = wrap(policy.to(self.device), trainable=True)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, lr, cfg.norm_lr_scale)
        self.ref = None
        if cfg.kl_coef > 0 or cfg.reference or ref_model_path is not None:
            ref = load_causal_lm(ref_model_path or self.model_path, cfg.attn_implementation).to(self.device)
            self.ref = wrap(ref, trainable=False)
        self.teacher = None
        if cfg.opd_coef > 0:  # frozen, eval mode, no grad; scored in the trainer's own micro-batches
            assert cfg.teacher_path is not None  # check() demands it with opd_coef
            teacher = load_causal_lm(cfg.teacher_path, cfg.attn_implementation).to(self.device)
            self.teacher = wrap(teacher, trainable=False)
        self.critic = self.critic_optimizer = self.critic_scheduler = None
        if critic:
            crit = load_value_model(cfg.critic_model_path or self.model_path, cfg.attn_implementation)
            if cfg.lora.rank:  # the critic's body gets the same adapters; its value head trains fully
                L.apply(crit, cfg.lora, keep_trainable=("value_head.",))
            self.critic = wrap(crit.to(self.device), trainable=True)
            critic_lr = cfg.critic_lr if cfg.critic_lr is not None else lr
            self.critic_optimizer, self.critic_scheduler = build_optimizer(self.critic, cfg, critic_lr)
        self.version = 0
        self._objective: Objective | None = None
        try:
            self._objective = Objective(cfg, _algos())
        except ImportError:
            pass  # inference works without it; train_step raises the import error

    # -- layout ----------------------------------------------------------------------------------
    def _local(self, samples: list[TrainSample]) -> list[int]:
        return D.assign([len(s.token_ids) for s in samples], self.world)[self.rank]

    def _layout(self, samples: list[TrainSample], *, share: bool = False) -> tuple[list[int], list[MicroBatch]]:
        """This rank's sample indices and micro-batches, padded with empty ones to the ranks' max.
        ``share``: lay out common prompt prefixes once (training only: inference reports every
        sequence's every token, so it lays each one out whole)."""
        cfg = self.cfg
        check_samples(samples, cfg.micro_batch_tokens)  # on every rank, so all raise the same error
        local = self._local(samples)
        mine = [samples[i] for i in local]
        if cfg.batching == "pad":
            mbs = pad(mine, cfg.micro_batch_tokens) if local else []
        else:
            share_min = cfg.share_prefix_tokens if share and self._can_share else 0
            mbs = pack(mine, cfg.micro_batch_tokens, share_min=share_min) if local else []
        n = D.all_max_int(len(mbs), self.device)
        mbs += [dummy_micro_batch(packed=self.cfg.batching == "pack") for _ in range(n - len(mbs))]
        return local, mbs

    @property
    def _can_share(self) -> bool:
        """Shared-prefix rows need varlen_sdpa (it reads branches from position_ids) and no dense mask."""
        return self.cfg.attn_implementation == VARLEN_SDPA and not self.cfg.packed_mask

    def _inputs(self, mb: MicroBatch) -> dict:
        return model_inputs(mb, packed_mask=self.cfg.packed_mask, attn_implementation=self.cfg.attn_implementation)

    # -- training --------------------------------------------------------------------------------
    def train_step(self, samples: list[TrainSample], interrupt: threading.Event | None = None) -> dict[str, float]:
        """One policy version from ``samples``: ``ppo_epochs`` passes over them, each split into
        ``mini_batches`` optimizer steps (1 x 1 = one step over all, the default); returns metrics.

        ``interrupt`` (set from another thread: a stop request) is looked at before each micro-batch
        of the call's first optimizer step: once set, the gradients are dropped and the call raises
        :class:`StepInterrupted` with nothing changed, so a stop waits at most one micro-batch. After
        the first optimizer step, and with more than one process (every rank would have to agree),
        the call runs to its end.

        With more than one optimizer step the ratio's denominator is fixed before the first one
        (``old_logprobs='current'``: the policy's logprobs at the start of this call; 'behaviour': the
        engine's), and so are the critic's old values, so clipping bounds the whole call's drift.
        With a distillation teacher, every micro-batch runs one more (no-grad) forward through it.
        Mini-batches are drawn by a permutation seeded by (seed, version, epoch), the same on every
        rank. The LR schedules advance once per call. Metrics are means over the optimizer steps
        (``tokens``/``computed_tokens``/``loss_tokens``/``seqs``/``micro_batches``/``step_time_s`` are totals;
        ``computed_tokens`` < ``tokens`` when shared prompt prefixes were computed once)."""
        if self._closed:
            raise RuntimeError("this Trainer is closed")
        if not samples:
            raise ValueError("train_step needs at least one sample")
        cfg = self.cfg
        n_mb = min(cfg.mini_batches, len(samples))
        interrupt = interrupt if self.world == 1 else None
        if cfg.ppo_epochs * n_mb == 1:
            return self._finish([self._update(samples, interrupt)])
        samples = self._fix_denominators(samples)
        outs = []
        for epoch in range(cfg.ppo_epochs):
            order = list(range(len(samples)))
            random.Random(f"{cfg.seed}/{self.version}/{epoch}").shuffle(order)
            for k in range(n_mb):
                outs.append(self._update([samples[i] for i in order[k::n_mb]], None if outs else interrupt))
        return self._finish(outs)

    def _fix_denominators(self, samples: list[TrainSample]) -> list[TrainSample]:
        import dataclasses

        need_old = self.cfg.old_logprobs == "current" and any(s.old_logprobs is None for s in samples)
        need_vals = self.critic is not None and any(s.old_values is None for s in samples)
        old = self.logprobs(samples) if need_old else [None] * len(samples)
        vals = self.values(samples) if need_vals else [None] * len(samples)
        return [
            dataclasses.replace(
                s,
                old_logprobs=s.old_logprobs if s.old_logprobs is not None else o,
                old_values=s.old_values if s.old_values is not None else v,
            )
            for s, o, v in zip(samples, old, vals)
        ]

    def _finish(self, outs: list[dict[str, float]]) -> dict[str, float]:
        """Advance the schedules and the version once; fold the optimizer steps' metrics."""
        self.scheduler.step()
        if self.critic_scheduler is not None:  # set with the critic
            self.critic_scheduler.step()
        self.version += 1
        totals = {"tokens", "computed_tokens", "loss_tokens", "seqs", "micro_batches", "step_time_s", "teacher_s"}
        keys = set().union(*outs)
        out = {k: (sum if k in totals else lambda v: sum(v) / len(v))([o[k] for o in outs if k in o]) for k in keys}
        out.update(
            version=float(self.version),
            optimizer_steps=float(len(outs)),
            tokens_per_s=out["tokens"] / max(out["step_time_s"], 1e-9),
        )
        return out

    def _update(self, samples: list[TrainSample], interrupt: threading.Event | None = None) -> dict[str, float]:
        """One optimizer step over all ``samples`` (see the module docstring); returns metrics.
        ``interrupt``: see ``train_step``."""
        if self._objective is None:
            self._objective = Objective(self.cfg, _algos())
        objective = self._objective
        if self.critic is not None:
            missing = [i for i, s in enumerate(samples) if s.returns is None]
            if missing:
                raise ValueError(f"samples {missing[:5]} have no returns, but this trainer trains a critic")
        t0 = time.perf_counter()
        local, mbs = self._layout(samples, share=True)
        mine = [samples[i] for i in local]
        vmasks = [s.value_mask if s.value_mask is not None else s.loss_mask for s in mine]
        g_tok, g_seq, g_vtok, g_vseq, g_real, g_computed, g_slots = D.all_sum(
            [
                sum(sum(s.loss_mask) for s in mine),
                sum(1 for s in mine if any(s.loss_mask)),
                sum(sum(v) for v in vmasks),
                sum(1 for v in vmasks if any(v)),
                sum(len(s.token_ids) for s in mine),
                sum(mb.num_tokens for mb in mbs),
                sum(mb.num_slots for mb in mbs if mb.num_tokens),
            ],
            self.device,
        )
        glob = {"tok": max(g_tok, 1.0), "seq": max(g_seq, 1.0), "vtok": max(g_vtok, 1.0), "vseq": max(g_vseq, 1.0)}
        self.model.train()
        if self.critic is not None:
            self.critic.train()
        acc: dict[str, float] = defaultdict(float)
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, mb in enumerate(mbs):
            if interrupt is not None and interrupt.is_set():
                self._drop_gradients()
                raise StepInterrupted(f"stopped before micro-batch {i + 1} of {len(mbs)}; nothing was updated")
            if self.before_micro_batch is not None:
                self.before_micro_batch()
            self._micro_step(mb.to(self.device), glob, acc, pairs)
        grad_norm = clip_and_step(self.model, self.optimizer, self.cfg.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        out: dict[str, float] = {}
        if self.critic is not None and self.critic_optimizer is not None:  # set together
            out["critic_grad_norm"] = clip_and_step(self.critic, self.critic_optimizer, self.cfg.max_grad_norm)
        keys = sorted(acc)
        sums = dict(zip(keys, D.all_sum([acc[k] for k in keys], self.device)))
        dt = time.perf_counter() - t0
        out.update(
            {
                "loss": sums.pop("loss"),
                "pg_loss": sums.pop("pg_loss"),
                "grad_norm": grad_norm,
                "skipped": float(not math.isfinite(grad_norm)),
                "lr": float(lr),
                "tokens": g_real,
                "computed_tokens": g_computed,
                "loss_tokens": g_tok,
                "seqs": float(len(samples)),
                "micro_batches": float(len(mbs)),
                "padding_frac": 1.0 - g_computed / max(g_slots, 1.0),
                "step_time_s": dt,
            }
        )
        if "teacher_s" in sums:  # seconds of teacher forwards, the ranks' mean
            out["teacher_s"] = sums.pop("teacher_s") / self.world
        if "value_loss" in sums:
            out["value_loss"] = sums.pop("value_loss")
            out["values_mean"] = sums.pop("value_sum") / glob["vtok"]
        for k, v in sums.items():  # token sums -> token means (kl, entropy, clipfrac, tis_weight, ...)
            out[k.removesuffix("_sum")] = v / glob["tok"]
        out.update(objective.mismatch(pairs, self.world))
        return out

    def _drop_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)

    def _micro_step(self, mb: MicroBatch, glob: dict, acc: dict, pairs: list) -> None:
        inputs = self._inputs(mb)
        assert self._objective is not None  # _update builds it first
        loss, logp, beh = self._objective.loss(
            self.model, self.ref, self.critic, inputs, mb, glob, acc, teacher=self.teacher
        )
        # Each rank's loss is its share of the global loss; FSDP averages gradients over ranks.
        (loss * self.world).backward()
        pairs.append((logp.detach().cpu(), beh.detach().cpu()))

    # -- inference -------------------------------------------------------------------------------
    @torch.no_grad()
    def _infer(self, samples: list[TrainSample], model, fn) -> list[list[float]]:
        if not samples:
            return []
        local, mbs = self._layout(samples)
        was_training = model.training
        model.eval()
        found: dict[int, list[float]] = {}
        try:
            for mb in mbs:
                mb = mb.to(self.device)
                sel = all_targets(mb)
                for i, vals in scatter_per_sample(mb, sel, fn(model, self._inputs(mb), mb, sel)).items():
                    found[local[i]] = vals
        finally:
            model.train(was_training)
        for part in D.gather_objects(found):
            found.update(part)
        return [found[i] for i in range(len(samples))]

    def _logprob_fn(self, model, inputs: dict, mb: MicroBatch, sel: torch.Tensor) -> torch.Tensor:
        return token_logprobs(model, inputs, mb, sel, self.cfg.temperature)[0]

    def logprobs(self, samples: list[TrainSample]) -> list[list[float]]:
        """Per-token logprobs of the current policy (temperature-scaled; 0.0 at position 0)."""
        return self._infer(samples, self.model, self._logprob_fn)

    def ref_logprobs(self, samples: list[TrainSample]) -> list[list[float]]:
        """Per-token logprobs of the frozen reference (for KL in the reward)."""
        if self.ref is None:
            raise RuntimeError("no reference model: set trainer.kl_coef > 0 or trainer.reference = true")
        return self._infer(samples, self.ref, self._logprob_fn)

    def teacher_logprobs(self, samples: list[TrainSample]) -> list[list[float]]:
        """Per-token logprobs of the frozen distillation teacher (temperature-scaled; 0.0 at position 0)."""
        if self.teacher is None:
            raise RuntimeError("no distillation teacher: set trainer.opd_coef > 0 and trainer.teacher_path")
        return self._infer(samples, self.teacher, self._logprob_fn)

    def values(self, samples: list[TrainSample]) -> list[list[float]]:
        """Critic values per token: values[t] = V(state before token t); 0.0 at position 0."""
        if self.critic is None:
            raise RuntimeError("no critic: construct the Trainer with critic=True")
        return self._infer(samples, self.critic, lambda m, x, mb, sel: token_values(m, x, sel))

    # -- weights and checkpoints -----------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Gathered full policy weights on CPU, HF names (rank 0; other ranks get {}). Collective.
        With LoRA: the merged weights (base + B @ A * alpha / rank) under the base model's names."""
        sd = C.gather_model(self.model)
        return L.merged_state_dict(sd, self.cfg.lora.scaling) if self.cfg.lora.rank and sd else sd

    def save(self, path: str | Path, *, extra: dict | None = None, files: dict[str, str] | None = None) -> None:
        """Atomic checkpoint (HF dir + optimizer + scheduler + RNG + ``extra`` + the caller's text
        ``files``, name -> content). Collective."""
        C.save(self, path, extra, files)

    def load(self, path: str | Path) -> dict:
        """Restore a checkpoint written by ``save``; returns its ``extra``. Collective."""
        return C.load(self, path)

    def close(self) -> None:
        """Destroy the process group if this Trainer created it (after the last sharer closes)."""
        if not self._closed:
            self._closed = True
            D.release(self._owns_group)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
