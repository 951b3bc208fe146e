"""On-policy distillation's per-token reverse-KL term against numbers worked by hand, its gradient,
and the zero advantage of pure distillation."""

import math

import pytest
import torch

import agentrl.algos as algos
from agentrl.algos import ADVANTAGES, DISTILLATION, opd_reverse_kl
from agentrl.errors import ConfigError


def close(actual, expected, atol=1e-9):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


def t(*x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def test_registry_holds_reverse_kl():
    assert sorted(DISTILLATION) == ["reverse_kl"]
    assert algos.lookup("distillation", "reverse_kl") is opd_reverse_kl
    with pytest.raises(ConfigError, match="unknown distillation 'reverse'.*did you mean 'reverse_kl'"):
        algos.lookup("distillation", "reverse")


def test_on_policy_loss_is_the_sampled_token_reverse_kl():
    # student logp -1, -2, -0.5; teacher -1, -1, -2:
    # k = logp - teacher = 0, -1, 1.5 (the teacher likes token 2 more, token 3 less);
    # on policy rho = 1, so loss = k and d loss / d logp = k (the advantage -k, negated)
    logp = t(-1.0, -2.0, -0.5, grad=True)
    loss, m = opd_reverse_kl(logp, t(-1.0, -1.0, -2.0))
    close(loss, [0.0, -1.0, 1.5])
    close(m["opd_reverse_kl"], [0.0, -1.0, 1.5])
    loss.sum().backward()
    close(logp.grad, [0.0, -1.0, 1.5])


def test_off_policy_tokens_are_importance_weighted():
    # old (sampling policy) -1, -2.5, -0.5: rho = exp(logp - old) = 1, e^0.5, 1;
    # loss = k * rho = 0, -e^0.5, 1.5; gradient k * rho as well (d rho / d logp = rho)
    logp = t(-1.0, -2.0, -0.5, grad=True)
    loss, m = opd_reverse_kl(logp, t(-1.0, -1.0, -2.0), t(-1.0, -2.5, -0.5))
    e = math.exp(0.5)
    close(loss, [0.0, -e, 1.5])
    close(m["opd_reverse_kl"], [0.0, -1.0, 1.5])  # the KL itself is not reweighted
    loss.sum().backward()
    close(logp.grad, [0.0, -e, 1.5])


def test_teacher_equal_to_student_gives_zero_loss_and_zero_gradient():
    logp = t(-0.3, -4.0, -1.25, grad=True)
    loss, m = opd_reverse_kl(logp, logp.detach().clone(), t(-0.5, -3.0, -1.0))
    close(loss, [0.0, 0.0, 0.0])
    close(m["opd_reverse_kl"], [0.0, 0.0, 0.0])
    loss.sum().backward()
    close(logp.grad, [0.0, 0.0, 0.0])


def test_no_gradient_reaches_the_teacher_and_shapes_must_match():
    teacher = t(-1.0, -2.0, grad=True)
    loss, _ = opd_reverse_kl(t(-1.5, -1.0, grad=True), teacher)
    loss.sum().backward()
    assert teacher.grad is None
    with pytest.raises(ValueError, match=r"teacher_logp shape \(2,\) != logp \(3,\)"):
        opd_reverse_kl(t(-1.0, -1.0, -1.0), t(-1.0, -1.0))


def test_none_advantage_is_zero_for_every_sequence():
    adv = ADVANTAGES["none"](torch.tensor([1.0, 0.0, 3.0]), torch.tensor([0, 0, 1]))
    close(adv, [0.0, 0.0, 0.0])
    assert adv.dtype == torch.float32
