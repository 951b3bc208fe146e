"""On-policy distillation (OPD): a teacher scores the student's own sampled tokens.

Owns the ``DISTILLATION`` registry. Its one entry, ``reverse_kl``, is the per-token loss term of
on-policy distillation with the sampled-token reverse KL, a pure function over FLAT packed tokens
``[N]``::

    (logp [N], teacher_logp [N], old_logp [N] | None) -> (loss [N], metrics {"opd_reverse_kl": [N]})

``logp`` are the student's log-probabilities of the tokens it sampled, at the parameters being
trained (with gradient), ``teacher_logp`` the frozen teacher's log-probabilities of the same tokens
in the same context (no gradient), ``old_logp`` those of the policy that sampled them (the step's
ratio denominator: the engine's behaviour log-probs, or the trainer's at the start of the step)::

    k_t   = sg(logp_t) - teacher_logp_t          sampled-token estimate of KL(pi_student || pi_teacher)
                                                  at token t (the k1 estimator; its mean over the
                                                  student's own tokens is the per-token reverse KL)
    A_t   = -k_t                                  the OPD advantage (a dense per-token reward)
    rho_t = exp(logp_t - sg(old_logp_t))          importance ratio (log clamped to [-20, 20]); 1 in
                                                  value on-policy, and the carrier of the gradient
    loss_t = -A_t * rho_t = k_t * rho_t           grad: (log pi_s - log pi_t)(x_t) * rho_t * grad log pi_s(x_t)

This is REINFORCE with the reward ``-(log p_student(x_t) - log p_teacher(x_t))`` on each sampled
token and discount 0 (no reward-to-go across tokens), importance-weighted from the sampling
policy: the formula of Thinking Machines' "On-Policy Distillation" (Lu et al., 2025:
``advantage = -(sampled logprob - teacher logprob)``, trained with an importance-sampling policy
gradient), which slime's OPD (``A_t - lambda_opd * KL_t`` beside any estimator), SkyRL's on-policy
distillation example and Trinity-RFT's ``kl_coef * (teacher - student)`` advantage also use. Both
log-probs are of the logits divided by the sampling temperature.

One choice differs from the post: ``k_t`` uses the student's log-prob at the current parameters
(the trainer's ``logp``, detached), not the sampler's, so an async run (tokens some versions old)
and numerics that differ between engine and trainer do not bias it: it is the reverse KL of the
policy being trained, and exactly 0 when the teacher is the student. At each position the gradient
is an unbiased estimate of ``grad KL(pi_s(.|prefix) || pi_t(.|prefix))`` at the current parameters
from a token drawn by ``old`` and reweighted by ``rho_t`` (the ``E[grad log pi_s] = 0`` term dropped),
the prefix held fixed: a token's effect on the later positions' KL is not credited to it (discount 0,
as in the post).

Only action tokens (loss mask 1, sampled by the student) are ever passed in or counted: prompt,
template glue and tool output are not the student's choices and carry no distillation signal.
The trainer adds ``opd_coef * loss_t`` (times the rollout correction's weights, as the policy loss)
to the per-token RL loss (``algo.name: opd`` is the pure form: the RL advantage is 0) and
aggregates the sum as configured.

Does not: run the teacher (the trainer does, on its own micro-batches), aggregate, or check that
the teacher shares the student's tokenizer (``agentrl.models.teacher``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from agentrl.algos.losses import _LOG_RATIO_CLAMP

__all__ = ["DISTILLATION", "opd_reverse_kl"]


def opd_reverse_kl(
    logp: Tensor, teacher_logp: Tensor, old_logp: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The OPD loss term ``k_t * rho_t`` (module docstring); ``old_logp`` None: on-policy,
    ``rho_t = exp(logp - sg(logp))``. Metric ``opd_reverse_kl`` = ``k_t``. All ``[N]``."""
    if teacher_logp.shape != logp.shape:
        raise ValueError(f"opd_reverse_kl: teacher_logp shape {tuple(teacher_logp.shape)} != logp {tuple(logp.shape)}")
    k = logp.detach() - teacher_logp.detach()
    old = logp.detach() if old_logp is None else old_logp.detach()
    rho = torch.exp((logp - old).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    return k * rho, {"opd_reverse_kl": k}


DISTILLATION: dict[str, Callable[..., tuple[Tensor, dict[str, Tensor]]]] = {"reverse_kl": opd_reverse_kl}
