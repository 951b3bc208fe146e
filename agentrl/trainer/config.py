"""TrainerConfig: every knob of the FSDP2 trainer, one documented field each.

Owns: the field list, defaults and ranges (checked by agentrl.config.schema when the tree is loaded) and
``check()``, the cross-field rules a single field cannot express. Does not know which algorithm
runs: loss, aggregation and KL estimator are registry names looked up in ``agentrl.algos``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.common.fields import doc
from agentrl.errors import ConfigError

#: The policy learning rate when trainer.lr is null and nothing else chose one.
DEFAULT_LR = 1e-6
#: What the null ("auto") optimisation fields mean for the Trainer API and for `agentrl run` with a
#: --model (`agentrl run` with the built-in model uses ``agentrl.warmstart.default_model.BUILTIN_RL``;
#: ``total_steps`` there is the run's optimizer steps).
#: ``policy_loss``/``clip_low``/``clip_high`` null: `agentrl run` takes the --algo preset's where it
#: sets them (``agentrl.batches.samples.ALGOS``: dapo, gspo, cispo), else these.
AUTO = dict(
    lr=DEFAULT_LR,
    norm_lr_scale=1.0,
    lr_schedule="constant",
    min_lr_ratio=0.0,
    total_steps=1000,
    policy_loss="ppo_clip",
    clip_low=0.2,
    clip_high=0.2,
)


#: The attention and MLP projections of Qwen2/Qwen3/Llama decoder layers (peft matches name suffixes).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraConfig:
    rank: int = doc(
        0,
        "LoRA rank r of every adapted projection (0 = off: full-parameter training). On: the base weights are "
        "frozen, only the adapters (fp32) train and sit in the optimizer; engines still receive merged weights.",
        min=0,
    )
    alpha: float = doc(32.0, "LoRA alpha: the adapter update B @ A is scaled by alpha / rank.", min=0.0)
    dropout: float = doc(0.0, "Dropout on the adapters' input while training (0 = none).", min=0.0, max=0.99)
    target_modules: list = doc(
        LORA_TARGETS,
        "Module-name suffixes that get adapters (default: the attention and MLP projections of "
        "Qwen2/Qwen3/Llama). A PPO critic's body gets the same adapters; its value head trains fully.",
    )
    train_norms: bool = doc(
        False,
        "Also train the normalization gains (the 1-D RMSNorm/LayerNorm weights, a few thousand parameters) "
        "beside the adapters, at trainer.lr * trainer.norm_lr_scale. Checkpoints save them in the adapter "
        "(peft's modules_to_save), so PeftModel.from_pretrained restores them. For a model whose RL moves "
        "mostly its gains (the built-in tiny one: its recipe trains them at 300x the lr); with a larger "
        "trainer.lr for the adapters, lower norm_lr_scale to keep the gains' rate.",
    )
    export_merged: bool = doc(
        True,
        "Checkpoints also hold the merged weights as an HF model directory (what `agentrl serve` and "
        "from_pretrained load). false: only the adapters (adapter/, peft format) and the optimizer state.",
    )

    def check(self) -> None:
        if self.rank and not self.target_modules:
            raise ConfigError(
                f"trainer.lora.target_modules: empty, but trainer.lora.rank={self.rank} asks for adapters"
            )
        bad = [m for m in self.target_modules if not isinstance(m, str) or not m]
        if bad:
            raise ConfigError(f"trainer.lora.target_modules: {bad!r} are not module names")

    @property
    def scaling(self) -> float:
        """alpha / rank: the factor on B @ A (0 when LoRA is off)."""
        return self.alpha / self.rank if self.rank else 0.0


@dataclass
class TrainerConfig:
    # -- optimisation ---------------------------------------------------------------------------
    lr: float | None = doc(
        None,
        "AdamW peak learning rate of the policy. null: `agentrl run` picks 2e-4 for the built-in tiny model "
        "and 1e-6 for a --model (a common RL rate for 1-10B models); the Trainer API alone uses 1e-6.",
        min=0.0,
    )
    weight_decay: float = doc(0.0, "AdamW decoupled weight decay.", min=0.0)
    adam_betas: list = doc([0.9, 0.999], "AdamW (beta1, beta2).")
    adam_eps: float = doc(1e-8, "AdamW epsilon.", min=0.0)
    lr_schedule: Literal["constant", "cosine"] | None = doc(
        None,
        "'constant' (after warmup) or 'cosine' decay to min_lr_ratio*lr at total_steps. null: `agentrl run` "
        "picks cosine for the built-in tiny model (its sharpening would otherwise grow unstable late in the "
        "run, BENCHMARKS.md P7) and constant for a --model; the Trainer API alone uses constant.",
    )
    warmup_steps: int = doc(0, "Optimizer steps of linear warmup from lr/warmup_steps to lr.", min=0)
    total_steps: int | None = doc(
        None,
        "Optimizer steps the cosine schedule spans (warmup included). null: `agentrl run` uses the run's "
        "optimizer steps (train.steps x ppo_epochs x mini_batches); the Trainer API alone uses 1000.",
        min=1,
    )
    min_lr_ratio: float | None = doc(
        None,
        "Cosine floor as a fraction of lr. null: `agentrl run` picks 0.1 for the built-in tiny model and "
        "0 for a --model; the Trainer API alone uses 0.",
        min=0.0,
        max=1.0,
    )
    norm_lr_scale: float | None = doc(
        None,
        "Learning-rate multiplier for the policy's normalization gains (1-D weights of *norm* modules, "
        "e.g. the final RMSNorm; the critic's keep its lr). RL sharpens the policy largely by raising "
        "these gains (~1), while Adam moves every parameter at most ~lr per step: gains move ~30x slower "
        "in relative terms than weights (~0.03). null: `agentrl run` picks 300 for the built-in tiny model "
        "(agentrl.warmstart.default_model.BUILTIN_RL) and 1 for a --model; the Trainer API alone uses 1.",
        min=0.0,
    )
    max_grad_norm: float = doc(
        1.0, "Clip the global gradient norm to this (0 = no clipping, norm still reported).", min=0.0
    )
    ppo_epochs: int = doc(
        1, "Passes over each train_step's samples (PPO epochs); each pass is mini_batches optimizer steps.", min=1
    )
    mini_batches: int = doc(
        1,
        "Optimizer steps per pass: the samples are split into this many shuffled mini-batches (1 = one step "
        "over the whole batch). With ppo_epochs * mini_batches > 1 the ratio is taken against the policy at "
        "the start of the train_step, so the PPO clip bounds the drift.",
        min=1,
    )
    # -- batching -------------------------------------------------------------------------------
    micro_batch_tokens: int = doc(
        4096, "Tokens per micro-batch (one forward/backward); gradients accumulate over a step's micro-batches.", min=1
    )
    batching: Literal["pack", "pad"] = doc(
        "pack", "'pack': sequences back to back in [1, T] rows (no padding); 'pad': the padded [b, T_max] baseline."
    )
    attn_implementation: str = doc(
        "varlen_sdpa",
        "'varlen_sdpa' (one causal SDPA call per packed sequence; any device) or an HF implementation "
        "('sdpa', 'eager', 'flash_attention_2'), which sees packing through position_ids or packed_mask.",
    )
    share_prefix_tokens: int = doc(
        32,
        "Sequences of a step that begin with the same >= this many tokens outside the loss (a GRPO group's "
        "prompt) are trained with that prefix computed once: the other sequences' own tokens attend to one shared "
        "copy, and its gradient gathers theirs (the same loss and gradients as training each whole). "
        "0 = train every sequence whole. Applies with batching='pack' and attn_implementation='varlen_sdpa' "
        "(without packed_mask); other layouts train every sequence whole.",
        min=0,
    )
    packed_mask: bool = doc(
        False, "Give packed rows an explicit [T, T] block-diagonal causal mask instead of relying on position_ids."
    )
    activation_checkpointing: bool = doc(
        False, "Recompute each decoder layer in backward instead of storing activations."
    )
    param_dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "auto",
        "Compute dtype of forward/backward (FSDP2 mixed precision); master weights and grad reduction stay fp32. "
        "auto: model.dtype in `agentrl run`; bfloat16 on CUDA and float32 on CPU for the Trainer API alone.",
    )
    # -- loss -----------------------------------------------------------------------------------
    policy_loss: str | None = doc(
        None,
        "Name in agentrl.algos.POLICY_LOSSES: 'ppo_clip' (clipped ratio), 'gspo' (one length-normalised "
        "sequence ratio per episode, clipped per sequence; use loss_agg seq-mean-token-mean), 'cispo' "
        "(REINFORCE with a clipped, stop-gradient importance weight; every token keeps a gradient), "
        "'vanilla_pg', 'sft'. null: the --algo preset's (gspo, cispo; dapo: ppo_clip), else ppo_clip.",
    )
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None = (
        doc(
            None,
            "How per-token losses become the step loss (agentrl.algos.aggregate mode). null: the --algo preset's "
            "(`agentrl run`), token-mean (Trainer API).",
        )
    )
    loss_norm_len: int | None = doc(
        None, "Constant length divisor for 'seq-mean-token-sum-norm' (required there; e.g. max response length).", min=1
    )
    clip_low: float | None = doc(
        None,
        "Lower clip: ppo_clip clips the token ratio at 1 - clip_low; gspo the sequence's length-normalised "
        "ratio (GSPO paper: 3e-4); cispo caps the importance weight below at 1 - clip_low (>= 1: no lower "
        "bound, the paper's choice). null: the --algo preset's (gspo 3e-4, cispo 1.0, dapo 0.2), else 0.2.",
        min=0.0,
    )
    clip_high: float | None = doc(
        None,
        "Upper clip: ppo_clip clips the token ratio at 1 + clip_high (DAPO clip-higher: 0.28); gspo the "
        "sequence ratio (GSPO paper: 4e-4); cispo caps the importance weight at 1 + clip_high (0.2). "
        "null: the --algo preset's (dapo 0.28, gspo 4e-4, cispo 0.2), else 0.2.",
        min=0.0,
    )
    dual_clip_c: float | None = doc(
        None,
        "ppo_clip's dual-clip bound c > 1 for negative advantages (null = off; gspo and cispo have none).",
        min=1.0,
    )
    temperature: float = doc(
        1.0, "Sampling temperature the rollouts used; logits are divided by it (0 = greedy: unscaled).", min=0.0
    )
    old_logprobs: Literal["behaviour", "current"] = doc(
        "behaviour",
        "Ratio denominator when a sample carries no old_logprobs: the engine's 'behaviour' logprobs, "
        "or the training model's own at the start of the step ('current', ratio starts at 1).",
    )
    tis_cap: float | None = doc(
        None,
        "Truncated importance sampling: weight the policy loss by min(pi_old/pi_engine, cap) (null = off). "
        "Only with rollout_correction tis.",
        min=0.0,
    )
    rollout_correction: Literal["tis", "icepop", "mis", "seq_reject", "none"] = doc(
        "tis",
        "What the policy loss does about the engine's probabilities differing from the trainer's, on the "
        "ratio rho = pi_old/pi_engine of each action token (agentrl.algos.ROLLOUT_CORRECTIONS): 'tis' "
        "weights it by min(rho, tis_cap) (tis_cap null: nothing, the default); 'icepop' (IcePop, Ring-1T) "
        "masks both tails: weight rho inside [low, high], 0 outside (no gradient); 'mis' is TRL's token_mask, "
        "the same weight with no lower bound unless rollout_correction_low is set; 'seq_reject' gives a whole "
        "episode no gradient when the geometric mean of its action tokens' ratios leaves [low, high] (SkyRL, "
        "verl), and weight 1 otherwise; 'none': nothing. The masked share of loss tokens is logged as "
        "train/rollout_masked_frac. pi_old is the trainer's policy at the start of the step only with "
        "old_logprobs=current (with 'behaviour' rho is 1: `agentrl run` rejects a mask there).",
    )
    rollout_correction_low: float | None = doc(
        None,
        "Lower bound of the ratio band of icepop / mis / seq_reject (0 = none). null: the mode's default, "
        "icepop 0.5 (IcePop's), mis none (TRL's), seq_reject 0.99 (SkyRL's).",
        min=0.0,
        max=1.0,
    )
    rollout_correction_high: float | None = doc(
        None,
        "Upper bound of the ratio band of icepop / mis / seq_reject. null: the mode's default, icepop 5 "
        "(IcePop's), mis 3 (TRL's vllm_importance_sampling_clip_max), seq_reject 1.01 (SkyRL's).",
        min=1.0,
    )
    kl_coef: float = doc(
        0.0, "Weight of KL(policy || reference) in the loss (> 0 loads a frozen reference model).", min=0.0
    )
    kl_estimator: str = doc(
        "k3",
        "KL estimator of kl_coef's loss term, a name in agentrl.algos.KL_ESTIMATORS: 'k1' (logp - ref; "
        "unbiased, high variance), 'k2' (0.5 (logp - ref)^2; biased, low variance), 'k3' (exp(ref - logp) "
        "- (ref - logp) - 1; unbiased, low variance, >= 0).",
    )
    reference: bool = doc(
        False,
        "Load the reference model even with kl_coef = 0 (for KL in the reward via ref_logprobs(); "
        "`agentrl run` turns it on when algo.kl_in_reward > 0).",
    )
    entropy_coef: float = doc(
        0.0, "Entropy bonus: loss -= entropy_coef * entropy (token entropy of the scaled logits)."
    )
    opd_coef: float = doc(
        0.0,
        "Weight of the on-policy distillation term added to the per-token loss: the teacher's log-probs of "
        "the student's own sampled tokens give the sampled-token reverse KL k = logp - teacher_logp, trained "
        "as REINFORCE on the advantage -k (agentrl.algos.opd_reverse_kl); only action tokens count. > 0 loads "
        "teacher_path frozen beside the policy. `agentrl run` sets it from algo.opd_coef / algo.name=opd.",
        min=0.0,
    )
    teacher_path: str | None = doc(
        None,
        "The distillation teacher: a local HF model directory sharing the policy's tokenizer, loaded in eval "
        "mode with no gradient on the trainer's device and scored in the trainer's own micro-batches "
        "(opd_coef > 0). `agentrl run` sets it from algo.teacher (a GGUF converted, a Hub id fetched).",
    )
    # -- critic (PPO) ---------------------------------------------------------------------------
    critic_model_path: str | None = doc(None, "Initial critic weights (HF dir); null = the policy's model_path.")
    critic_lr: float | None = doc(None, "Critic AdamW learning rate (null = lr).", min=0.0)
    vf_coef: float = doc(0.5, "Weight of the value loss.", min=0.0)
    value_clip: float | None = doc(
        0.2, "Clip values to old_values +- value_clip in the value loss (null = off).", min=0.0
    )
    # -- runtime --------------------------------------------------------------------------------
    device: str = doc("auto", "'auto' (cuda if available, else cpu), 'cpu' or 'cuda' (this rank's LOCAL_RANK GPU).")
    dist_timeout_s: float = doc(
        600.0, "Timeout of every collective; a stuck peer fails the step instead of hanging.", min=1.0
    )
    seed: int = doc(0, "Seeds torch/numpy/python RNGs at trainer start.")
    # -- LoRA -----------------------------------------------------------------------------------
    lora: LoraConfig = field(default_factory=LoraConfig)

    def check(self) -> None:
        """Cross-field validation (ranges are checked by the config loader)."""
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"trainer.adam_betas: {self.adam_betas!r} must be two numbers in [0, 1)")
        if self.lr_schedule == "cosine" and self.total_steps is not None and self.warmup_steps >= self.total_steps:
            raise ConfigError(
                f"trainer.warmup_steps: {self.warmup_steps} must be below trainer.total_steps={self.total_steps}"
            )
        self.lora.check()
        if self.batching == "pad" and self.packed_mask:
            raise ConfigError("trainer.packed_mask: only meaningful with trainer.batching='pack'")
        if self.loss_agg == "seq-mean-token-sum-norm" and self.loss_norm_len is None:
            raise ConfigError(
                "trainer.loss_norm_len: null, but loss_agg 'seq-mean-token-sum-norm' needs a constant length"
            )
        self._check_rollout_correction()
        if self.opd_coef and not self.teacher_path:
            raise ConfigError(
                f"trainer.opd_coef: {self.opd_coef} distills from a teacher, but trainer.teacher_path is null "
                "(`agentrl run`: set algo.teacher)"
            )

    def _check_rollout_correction(self) -> None:
        mode = self.rollout_correction
        if self.tis_cap and mode != "tis":
            raise ConfigError(
                f"trainer.tis_cap: {self.tis_cap} applies only with rollout_correction 'tis', got {mode!r} "
                "(leave tis_cap null)"
            )
        for name, v in (("low", self.rollout_correction_low), ("high", self.rollout_correction_high)):
            if v is None:
                continue
            if mode in ("tis", "none"):
                raise ConfigError(
                    f"trainer.rollout_correction_{name}: {v} is a bound of the icepop / mis / seq_reject band, "
                    f"but rollout_correction is {mode!r}"
                )
            if (name == "low" and not 0.0 <= v <= 1.0) or (name == "high" and not v >= 1.0):
                raise ConfigError(
                    f"trainer.rollout_correction_{name}: {v} leaves ratio 1 outside the band (low must be in "
                    "[0, 1], high >= 1: an on-policy token is never masked)"
                )

    def resolved(self) -> TrainerConfig:
        """A copy with the Trainer API's choices for the null ("auto") fields."""
        import dataclasses

        return dataclasses.replace(
            self, loss_agg=self.loss_agg or "token-mean", **{k: v for k, v in AUTO.items() if getattr(self, k) is None}
        )
