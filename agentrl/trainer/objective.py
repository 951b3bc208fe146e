"""The training objective of one micro-batch, from the names in TrainerConfig.

Owns :class:`Objective`: the policy loss, KL estimator, rollout correction and their options looked
up once in ``agentrl.algos`` (errors list the choices), and per micro-batch the per-token loss (policy
gradient times the rollout correction's weights: TIS or a ratio mask; KL to a frozen reference,
on-policy distillation from a frozen teacher (``opd_coef``: the teacher scores the micro-batch's own
sampled tokens in one no-grad forward, timed as ``teacher_s``), entropy bonus, critic value loss),
aggregated to this rank's share of the global loss, with the token sums the step's metrics are
built from; and the trainer-vs-engine logprob mismatch of a whole step.

Algorithm-blind: the per-token advantages are given; there is no branch on an algorithm name.
Does not run backward, step optimizers or lay out micro-batches (``agentrl.trainer.trainer``).
"""

from __future__ import annotations

import inspect
import time
from types import ModuleType
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.trainer import dist as D
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.models import token_logprobs, token_values
from agentrl.trainer.optim import scalar
from agentrl.trainer.packing import MicroBatch


class Objective:
    """The configured loss; ``A`` is the ``agentrl.algos`` module."""

    def __init__(self, cfg: TrainerConfig, A: ModuleType) -> None:
        if cfg.policy_loss not in A.POLICY_LOSSES:
            raise ConfigError(f"trainer.policy_loss: {cfg.policy_loss!r} is not one of {sorted(A.POLICY_LOSSES)}")
        if cfg.kl_estimator not in A.KL_ESTIMATORS:
            raise ConfigError(f"trainer.kl_estimator: {cfg.kl_estimator!r} is not one of {sorted(A.KL_ESTIMATORS)}")
        self.cfg, self.A = cfg, A
        self.loss_fn = A.POLICY_LOSSES[cfg.policy_loss]
        # Pass the clip settings only to losses that take them (sft takes none).
        params = inspect.signature(self.loss_fn).parameters
        offered = {"clip_low": cfg.clip_low, "clip_high": cfg.clip_high, "dual_clip_c": cfg.dual_clip_c}
        takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
        self.loss_kw = {k: v for k, v in offered.items() if takes_all or k in params}
        # Sequence-level losses (gspo) group tokens by sequence: they get each token's sample index.
        self.seq_index = "seq_index" in params
        # The rollout correction (TIS or a ratio mask) gets the bounds it takes that are set (a null
        # bound: the function's default) and, if it works per sequence (seq_reject), the sample index.
        if cfg.rollout_correction not in A.ROLLOUT_CORRECTIONS:
            raise ConfigError(
                f"trainer.rollout_correction: {cfg.rollout_correction!r} is not one of {sorted(A.ROLLOUT_CORRECTIONS)}"
            )
        self.correction = A.ROLLOUT_CORRECTIONS[cfg.rollout_correction]
        rc_params = inspect.signature(self.correction).parameters
        bounds = {"cap": cfg.tis_cap, "low": cfg.rollout_correction_low, "high": cfg.rollout_correction_high}
        self.correction_kw = {k: v for k, v in bounds.items() if k in rc_params and v is not None}
        self.correction_seq = "seq_index" in rc_params

    def loss(
        self,
        policy: Any,
        ref: Any,
        critic: Any,
        inputs: dict,
        mb: MicroBatch,
        glob: dict,
        acc: dict,
        teacher: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's share of the global loss over ``mb`` (``glob``: the global token and sequence
        counts the aggregation divides by); adds the metric sums to ``acc``. ``teacher``: the frozen
        distillation teacher (with ``opd_coef`` > 0). Returns (loss, the policy's logprobs of the loss
        tokens, their behaviour logprobs)."""
        A, cfg = self.A, self.cfg
        sel = mb.loss_mask > 0
        logp, logits = token_logprobs(policy, inputs, mb, sel, cfg.temperature)
        beh, adv, ntok = mb.behaviour_logprobs[sel], mb.advantages[sel], mb.seq_ntokens[sel]
        old_in = mb.old_logprobs[sel]
        fallback = beh if cfg.old_logprobs == "behaviour" else logp.detach()
        old = torch.where(torch.isnan(old_in), fallback, old_in)
        # A micro-batch holds whole sequences, so a per-sequence quantity is complete within it.
        seq_kw = {"seq_index": mb.seq_index[sel]} if self.seq_index else {}
        pg_tok, pg_metrics = self.loss_fn(logp, old, adv, **self.loss_kw, **seq_kw)
        rc_seq = {"seq_index": mb.seq_index[sel]} if self.correction_seq else {}
        w, rc_metrics = self.correction(old, beh, **self.correction_kw, **rc_seq)
        if w is not None:
            pg_tok = pg_tok * w.detach()
        for k, v in rc_metrics.items():  # token sums -> means over the step's loss tokens (tis_weight, ...)
            acc[f"{k}_sum"] += float(v.detach().sum())
        tok = pg_tok
        if ref is not None:
            with torch.no_grad():
                ref_lp, _ = token_logprobs(ref, inputs, mb, sel, cfg.temperature)
            kl_tok = A.KL_ESTIMATORS[cfg.kl_estimator](logp, ref_lp)
            if cfg.kl_coef:
                tok = tok + cfg.kl_coef * kl_tok
            acc["kl_sum"] += float(kl_tok.detach().sum())
        if teacher is not None and cfg.opd_coef:
            opd_tok = self._distill(teacher, inputs, mb, sel, logp, old, acc)
            tok = tok + cfg.opd_coef * (opd_tok if w is None else opd_tok * w.detach())
        if cfg.entropy_coef:
            ent = A.entropy_from_logits(logits)
            tok = tok - cfg.entropy_coef * ent
        else:
            with torch.no_grad():
                ent = A.entropy_from_logits(logits.detach())
        acc["entropy_sum"] += float(ent.detach().sum())
        ones = torch.ones_like(tok)

        def agg(x: torch.Tensor) -> torch.Tensor:
            return A.aggregate(
                cfg.loss_agg,
                x,
                ones,
                ntok,
                global_tokens=glob["tok"],
                global_seqs=glob["seq"],
                norm_len=cfg.loss_norm_len,
            )

        loss = agg(tok)
        with torch.no_grad():
            acc["pg_loss"] += float(agg(pg_tok.detach()))
        for k, v in pg_metrics.items():  # every rank must add the same keys (they are all-reduced)
            v = torch.as_tensor(v).detach().float()
            if tok.numel():
                acc[f"{k}_sum"] += float(v.sum()) if v.numel() == tok.numel() else float(v) * tok.numel()
            else:
                acc[f"{k}_sum"] += 0.0
        if critic is not None:
            loss = loss + cfg.vf_coef * self._value_loss(critic, inputs, mb, glob, acc)
        acc["loss"] += float(loss.detach())
        return loss, logp, beh

    def _distill(
        self, teacher: Any, inputs: dict, mb: MicroBatch, sel: torch.Tensor, logp: torch.Tensor, old, acc: dict
    ) -> torch.Tensor:
        """The per-token OPD term over ``mb``'s loss tokens (``agentrl.algos.opd_reverse_kl``): the
        teacher's logprobs of the tokens the student sampled, from the same packed inputs, at the
        sampling temperature (so a teacher equal to the student gives exactly 0)."""
        t0 = time.perf_counter()
        with torch.no_grad():
            teacher_lp, _ = token_logprobs(teacher, inputs, mb, sel, self.cfg.temperature)
            if teacher_lp.is_cuda:  # kernels run asynchronously: time the forward, not its launch
                torch.cuda.synchronize(teacher_lp.device)
        acc["teacher_s"] += time.perf_counter() - t0
        opd_tok, metrics = self.A.opd_reverse_kl(logp, teacher_lp, old)
        acc["opd_reverse_kl_sum"] += float(metrics["opd_reverse_kl"].sum())
        return opd_tok

    def _value_loss(self, critic: Any, inputs: dict, mb: MicroBatch, glob: dict, acc: dict) -> torch.Tensor:
        """The critic's share of the global value loss over ``mb``'s value tokens."""
        vsel = mb.value_mask > 0
        values = token_values(critic, inputs, vsel, mb.prev_index)
        old_v = mb.old_values[vsel]
        old_v = torch.where(torch.isnan(old_v), values.detach(), old_v)
        vl_tok = self.A.value_loss(values, old_v, mb.returns[vsel], clip=self.cfg.value_clip)
        vloss = self.A.aggregate(
            "token-mean",
            vl_tok,
            torch.ones_like(vl_tok),
            mb.seq_nvalue[vsel],
            global_tokens=glob["vtok"],
            global_seqs=glob["vseq"],
        )
        acc["value_loss"] += float(vloss.detach())
        acc["value_sum"] += float(values.detach().sum())
        return vloss

    def mismatch(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], world: int) -> dict[str, float]:
        """Trainer-vs-engine logprob mismatch over the whole step's loss tokens (all ranks):
        ``pairs`` holds (trainer logprobs, behaviour logprobs) of each micro-batch. Collective."""
        train = torch.cat([p[0] for p in pairs]) if pairs else torch.zeros(0)
        beh = torch.cat([p[1] for p in pairs]) if pairs else torch.zeros(0)
        if world > 1:
            parts = D.gather_objects((train, beh))
            train, beh = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        if train.numel() == 0:
            return {}
        m = self.A.mismatch_metrics(train, beh, torch.ones_like(train), cap=self.cfg.tis_cap or None)
        return {(k if k.startswith("mismatch") else f"mismatch/{k}"): scalar(v) for k, v in m.items()}
