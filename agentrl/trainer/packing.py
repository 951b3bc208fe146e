"""Training samples and how they are laid out into micro-batches: packed rows or padded rows.

Owns: ``TrainSample`` (one sequence after credit assignment, with its validation), ``MicroBatch``
(the tensors one forward/backward pass consumes), ``pack`` (first-fit-decreasing bin packing of
whole sequences into rows of at most ``max_tokens`` tokens, no padding) and ``pad`` (the padded
baseline: ``[b, T_max]`` rows with an attention mask), and the explicit block-diagonal causal mask
for attention implementations that cannot see packing through ``position_ids``.

Shared prompts (``pack(..., share_min=N)``): sequences that begin with the same N+ tokens outside the
loss (a GRPO group's prompt) can be laid out as one *unit*: the first sequence whole, then only the
other sequences' own tokens ("branches"), whose ``position_ids`` continue from the prefix length. A
branch is recognised by its positions jumping back without restarting at 0; it attends to the shared
prefix plus itself (``agentrl.trainer.attention``), and its first token is predicted from the prefix's
last position (``MicroBatch.prev_index``). The prefix is computed once and its gradient accumulates
from every branch: the same loss and gradients as laying each sequence out whole.

Alignment convention (shared with the engine and the trainer): every per-token array is indexed by
token position; ``logprob[t]`` is log p(token t | tokens < t) and a model predicts it from position
``t - 1``. Position 0 of a sequence has nothing to be predicted from, so its loss mask must be 0.

Does not: run models, compute losses, or decide which rank gets which sample (see ``dist``).
"""

from __future__ import annotations

import dataclasses
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
    # [R, T] the position whose output predicts each token (None: the one before it, t - 1). Differs
    # from t - 1 only at a branch's first token, which is predicted from its shared prefix's last one.
    prev_index: torch.Tensor | None = None

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
        return dataclasses.replace(self, **kw)

    @property
    def shares_prefixes(self) -> bool:
        """True when some sequence of this micro-batch is laid out as a branch of a shared prefix."""
        return self.prev_index is not None

    def block_causal_mask(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[R, 1, T, T]`` mask: token q sees token k iff same sequence and k <= q.

        Boolean (True = attend) by default; with a float ``dtype`` an additive mask (0 / -inf-ish),
        which is what eager attention implementations expect.
        """
        if self.shares_prefixes:
            raise ValueError("a block-diagonal mask cannot express shared prefixes; lay out with share_min=0")
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


def _row(
    samples: list[TrainSample], order: list[int], width: int | None, skip: dict[int, int] | None = None
) -> dict[str, list]:
    """Concatenate samples ``order`` into one row, right-padded to ``width`` if given.

    ``skip[i] = p`` lays sample i out as a branch: only its tokens from p on, positions from p, the
    first one predicted from position p - 1 of the last whole sample before it (its unit's root)."""
    nan = math.nan
    skip = skip or {}
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
            "prev_index",
        )
    }
    root = 0
    for i in order:
        s = samples[i]
        n, p = len(s.token_ids), skip.get(i, 0)
        vmask = s.value_mask if s.value_mask is not None else s.loss_mask
        at = len(cols["input_ids"])
        if p == 0:
            root = at
        cols["input_ids"] += s.token_ids[p:]
        cols["position_ids"] += range(p, n)
        cols["seq_index"] += [i] * (n - p)
        cols["loss_mask"] += s.loss_mask[p:]
        cols["behaviour_logprobs"] += s.behaviour_logprobs[p:]
        cols["advantages"] += s.advantages[p:]
        cols["old_logprobs"] += s.old_logprobs[p:] if s.old_logprobs is not None else [nan] * (n - p)
        cols["returns"] += s.returns[p:] if s.returns is not None else [0.0] * (n - p)
        cols["value_mask"] += vmask[p:]
        cols["old_values"] += s.old_values[p:] if s.old_values is not None else [nan] * (n - p)
        cols["seq_ntokens"] += [sum(s.loss_mask)] * (n - p)
        cols["seq_nvalue"] += [sum(vmask)] * (n - p)
        cols["attention_mask"] += [1] * (n - p)
        cols["prev_index"] += [root + p - 1 if p else at - 1, *range(at, at + n - p - 1)]
    if width is not None:
        extra = width - len(cols["input_ids"])
        cols["position_ids"] += range(len(cols["input_ids"]), width)
        cols["prev_index"] += range(len(cols["input_ids"]) - 1, width - 1)
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


_LONG = ("input_ids", "position_ids", "seq_index", "attention_mask", "prev_index")


def _micro_batch(rows: list[dict[str, list]], order: list[int], packed: bool, branches: bool = False) -> MicroBatch:
    t = {k: torch.tensor([r[k] for r in rows], dtype=torch.long if k in _LONG else torch.float32) for k in rows[0]}
    att = t.pop("attention_mask")
    prev = t.pop("prev_index")
    return MicroBatch(
        **t, attention_mask=None if packed else att, samples=order, packed=packed, prev_index=prev if branches else None
    )


def _shareable(s: TrainSample) -> int:
    """How many leading tokens of ``s`` may be shared: those outside the loss and the value targets,
    leaving at least one token of its own."""
    vmask = s.value_mask if s.value_mask is not None else s.loss_mask
    n = len(s.token_ids)
    return next((t for t in range(n) if s.loss_mask[t] or vmask[t]), n - 1)


def _common(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    return next((t for t in range(n) if a[t] != b[t]), n)


def share_units(samples: list[TrainSample], max_tokens: int, share_min: int) -> list[tuple[list[int], int]]:
    """Samples grouped into units ``(members, prefix)``: members[0] is laid out whole, the others as
    branches of its first ``prefix`` tokens (0 = a unit of one sample).

    Samples are sorted by their tokens, so those with a common prompt are neighbours; a neighbour
    joins the current unit when the common prefix (outside every member's loss) stays >= ``share_min``
    tokens, the unit still fits ``max_tokens``, and joining computes fewer tokens than starting a
    unit of its own. Deterministic."""
    order = sorted(range(len(samples)), key=lambda i: (samples[i].token_ids, i))
    units: list[tuple[list[int], int]] = []
    members: list[int] = []
    prefix = 0
    for i in order:
        n = len(samples[i].token_ids)
        if members:
            first = samples[members[0]]
            p = min(prefix if len(members) > 1 else _shareable(first), _shareable(samples[i]))
            p = _common(first.token_ids, samples[i].token_ids, p)
            lens = [len(samples[j].token_ids) for j in members] + [n]
            joined = lens[0] + sum(lens[1:]) - p * (len(lens) - 1)
            now = lens[0] + sum(lens[1:-1]) - prefix * (len(lens) - 2)
            if p >= share_min and joined <= max_tokens and joined < now + n:
                members.append(i)
                prefix = p
                continue
            units.append((members, prefix if len(members) > 1 else 0))
        members, prefix = [i], 0
    if members:
        units.append((members, prefix if len(members) > 1 else 0))
    return units


def pack(samples: list[TrainSample], max_tokens: int, *, share_min: int = 0) -> list[MicroBatch]:
    """First-fit-decreasing: each micro-batch is one ``[1, T <= max_tokens]`` row of whole sequences
    or, with ``share_min`` > 0, of units sharing a prompt prefix (``share_units``).

    Deterministic: ties in length keep the input order.
    """
    check_samples(samples, max_tokens)
    if share_min > 0:
        units = share_units(samples, max_tokens, share_min)
    else:
        units = [([i], 0) for i in range(len(samples))]
    sizes = [sum(len(samples[i].token_ids) for i in m) - p * (len(m) - 1) for m, p in units]
    order = sorted(range(len(units)), key=lambda u: (-sizes[u], units[u][0][0]))
    bins: list[list[int]] = []
    room: list[int] = []
    for u in order:
        for b, r in enumerate(room):
            if sizes[u] <= r:
                bins[b].append(u)
                room[b] -= sizes[u]
                break
        else:
            bins.append([u])
            room.append(max_tokens - sizes[u])
    out = []
    for b in bins:
        members = [i for u in b for i in units[u][0]]
        skip = {i: units[u][1] for u in b for i in units[u][0][1:]}
        out.append(_micro_batch([_row(samples, members, None, skip)], members, packed=True, branches=bool(skip)))
    return out


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
