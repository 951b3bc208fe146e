"""Training samples and how they are laid out into micro-batches: packed rows or padded rows.

Owns: ``TrainSample`` (one sequence after credit assignment, with its validation), ``MicroBatch``
(the tensors one forward/backward pass consumes), ``pack`` (first-fit-decreasing bin packing of
whole sequences into rows of at most ``max_tokens`` tokens, no padding) and ``pad`` (the padded
baseline: ``[b, T_max]`` rows with an attention mask), and the explicit block-diagonal causal mask
for attention implementations that cannot see packing through ``position_ids``.

Alignment convention (shared with the engine and the trainer): every per-token array is indexed by
token position; ``logprob[t]`` is log p(token t | tokens < t) and a model predicts it from position
``t - 1``. Position 0 of a sequence has nothing to be predicted from, so its loss mask must be 0.

Does not: run models, compute losses, or decide which rank gets which sample (see ``dist``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class TrainSample:
    """One sequence (a Trajectory after credit assignment); all lists have len(token_ids)."""

    token_ids: list[int]
    loss_mask: list[int]  # 1 = sampled by the policy: trained on; 0 = prompt/glue/tool output
    behaviour_logprobs: list[float]  # the engine's logprobs (0.0 where the mask is 0)
    advantages: list[float]
    returns: list[float] | None = None  # critic targets where value_mask is 1
    value_mask: list[int] | None = None  # where the critic is trained (default: loss_mask)
    old_values: list[float] | None = None  # critic values at rollout time, for value clipping
    # The ratio's denominator, when the run loop fixed it (e.g. several optimizer steps on one
    # rollout batch). None = TrainerConfig.old_logprobs decides.
    old_logprobs: list[float] | None = None

    def validate(self, index: int = 0) -> None:
        n = len(self.token_ids)
        if n == 0:
            raise ValueError(f"sample {index}: token_ids is empty")
        for name in (
            "loss_mask",
            "behaviour_logprobs",
            "advantages",
            "returns",
            "value_mask",
            "old_values",
            "old_logprobs",
        ):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"sample {index}: len({name})={len(v)} != len(token_ids)={n}")
        for name in ("loss_mask", "value_mask"):
            v = getattr(self, name)
            if v is None:
                continue
            if any(m not in (0, 1) for m in v):
                raise ValueError(f"sample {index}: {name} must hold only 0/1")
            if v[0]:
                raise ValueError(
                    f"sample {index}: {name}[0] is 1, but the first token has no context to be predicted from"
                )


@dataclass
class MicroBatch:
    """Tensors for one forward/backward pass; every per-token tensor is ``[R, T]``.

    Packed: R = 1, several sequences back to back, ``position_ids`` restart at 0 for each, no
    ``attention_mask``. Padded: R rows of one sequence each, right-padded, 2-D ``attention_mask``.
    ``seq_index`` maps a token to its sample's index in the list given to pack/pad (-1 = padding).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    seq_index: torch.Tensor
    loss_mask: torch.Tensor  # float 0/1
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor  # NaN where the sample carries none
    returns: torch.Tensor
    value_mask: torch.Tensor  # float 0/1
    old_values: torch.Tensor  # NaN where the sample carries none
    seq_ntokens: torch.Tensor  # loss-mask tokens in the token's sequence (for seq-mean aggregation)
    seq_nvalue: torch.Tensor  # value-mask tokens in the token's sequence
    samples: list[int] = field(default_factory=list)  # sample indices, in layout order
    packed: bool = True

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int((self.seq_index >= 0).sum())

    @property
    def num_slots(self) -> int:
        """Tokens the model computes on, padding included."""
        return self.input_ids.numel()

    def to(self, device: torch.device | str) -> MicroBatch:
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return MicroBatch(**kw)

    def block_causal_mask(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[R, 1, T, T]`` mask: token q sees token k iff same sequence and k <= q.

        Boolean (True = attend) by default; with a float ``dtype`` an additive mask (0 / -inf-ish),
        which is what eager attention implementations expect.
        """
        seq = self.seq_index
        T = seq.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=seq.device).tril()
        same = (seq[:, :, None] == seq[:, None, :]) & (seq[:, None, :] >= 0)
        allowed = (same & causal)[:, None]
        # A padding query would see nothing and give NaN rows; let it see itself (its output is unused).
        allowed = allowed | torch.eye(T, dtype=torch.bool, device=seq.device)[None, None]
        if dtype is None or dtype == torch.bool:
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=seq.device).masked_fill(~allowed, torch.finfo(dtype).min)


def check_samples(samples: list[TrainSample], max_tokens: int) -> None:
    """Validate every sample and that each fits one micro-batch row; ValueError names the sample."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    for i, s in enumerate(samples):
        s.validate(i)
        if len(s.token_ids) > max_tokens:
            raise ValueError(
                f"sample {i} has {len(s.token_ids)} tokens, more than max_tokens={max_tokens} "
                "(trainer.micro_batch_tokens); raise it or cap rollout.max_context"
            )


def _row(samples: list[TrainSample], order: list[int], width: int | None) -> dict[str, list]:
    """Concatenate samples ``order`` into one row, right-padded to ``width`` if given."""
    nan = math.nan
    cols: dict[str, list] = {
        k: []
        for k in (
            "input_ids",
            "position_ids",
            "seq_index",
            "loss_mask",
            "behaviour_logprobs",
            "advantages",
            "old_logprobs",
            "returns",
            "value_mask",
            "old_values",
            "seq_ntokens",
            "seq_nvalue",
            "attention_mask",
        )
    }
    for i in order:
        s = samples[i]
        n = len(s.token_ids)
        vmask = s.value_mask if s.value_mask is not None else s.loss_mask
        cols["input_ids"] += s.token_ids
        cols["position_ids"] += range(n)
        cols["seq_index"] += [i] * n
        cols["loss_mask"] += s.loss_mask
        cols["behaviour_logprobs"] += s.behaviour_logprobs
        cols["advantages"] += s.advantages
        cols["old_logprobs"] += s.old_logprobs if s.old_logprobs is not None else [nan] * n
        cols["returns"] += s.returns if s.returns is not None else [0.0] * n
        cols["value_mask"] += vmask
        cols["old_values"] += s.old_values if s.old_values is not None else [nan] * n
        cols["seq_ntokens"] += [sum(s.loss_mask)] * n
        cols["seq_nvalue"] += [sum(vmask)] * n
        cols["attention_mask"] += [1] * n
    if width is not None:
        extra = width - len(cols["input_ids"])
        cols["position_ids"] += range(len(cols["input_ids"]), width)
        for k, fill in (
            ("input_ids", 0),
            ("seq_index", -1),
            ("loss_mask", 0),
            ("behaviour_logprobs", 0.0),
            ("advantages", 0.0),
            ("old_logprobs", nan),
            ("returns", 0.0),
            ("value_mask", 0),
            ("old_values", nan),
            ("seq_ntokens", 0),
            ("seq_nvalue", 0),
            ("attention_mask", 0),
        ):
            cols[k] += [fill] * extra
    return cols


_LONG = ("input_ids", "position_ids", "seq_index", "attention_mask")


def _micro_batch(rows: list[dict[str, list]], order: list[int], packed: bool) -> MicroBatch:
    t = {k: torch.tensor([r[k] for r in rows], dtype=torch.long if k in _LONG else torch.float32) for k in rows[0]}
    att = t.pop("attention_mask")
    return MicroBatch(**t, attention_mask=None if packed else att, samples=order, packed=packed)


def pack(samples: list[TrainSample], max_tokens: int) -> list[MicroBatch]:
    """First-fit-decreasing: each micro-batch is one ``[1, T <= max_tokens]`` row of whole sequences.

    Deterministic: ties in length keep the input order.
    """
    check_samples(samples, max_tokens)
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].token_ids), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(samples[i].token_ids)
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max_tokens - n)
    return [_micro_batch([_row(samples, b, None)], b, packed=True) for b in bins]


def pad(samples: list[TrainSample], max_tokens: int, *, sort: bool = False) -> list[MicroBatch]:
    """The padded baseline: consecutive samples (in the given order, or longest first with
    ``sort``) fill ``[b, T_max]`` rows while ``b * T_max <= max_tokens``."""
    check_samples(samples, max_tokens)
    order = list(range(len(samples)))
    if sort:
        order.sort(key=lambda i: (-len(samples[i].token_ids), i))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = max([len(samples[j].token_ids) for j in cur] + [len(samples[i].token_ids)])
        if cur and (len(cur) + 1) * width > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    out = []
    for g in groups:
        width = max(len(samples[i].token_ids) for i in g)
        out.append(_micro_batch([_row(samples, [i], width) for i in g], g, packed=False))
    return out


def dummy_micro_batch(packed: bool = True) -> MicroBatch:
    """A one-token micro-batch with nothing to train on: lets a rank with fewer micro-batches than
    its peers still join every FSDP collective (forward all-gathers, backward reduce-scatters)."""
    s = TrainSample(token_ids=[0], loss_mask=[0], behaviour_logprobs=[0.0], advantages=[0.0], returns=[0.0])
    mb = _micro_batch([_row([s], [0], None)], [], packed=packed)
    mb.seq_index.fill_(-1)
    if not packed:
        mb.attention_mask = torch.ones_like(mb.input_ids)
    return mb
