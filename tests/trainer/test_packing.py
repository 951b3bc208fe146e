"""Packing: layout (bins, positions, errors) and that packed sequences do not attend to each other."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.trainer import Trainer, TrainerConfig, TrainSample, pack, pad
from agentrl.trainer.attention import segment_bounds


def sample(n: int, prompt: int = 2, seed: int = 0) -> TrainSample:
    rng = random.Random(seed)
    mask = [0] * min(prompt, n) + [1] * max(0, n - prompt)
    return TrainSample(
        token_ids=[rng.randrange(5, 1000) for _ in range(n)],
        loss_mask=mask,
        behaviour_logprobs=[-1.0 * m for m in mask],
        advantages=[0.5 * m for m in mask],
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("pack-model"), hidden_size=64, num_layers=2))


# -- layout ------------------------------------------------------------------------------------
def test_first_fit_decreasing_bins():
    lengths = [5, 4, 3, 3, 2, 1]
    mbs = pack([sample(n, 1, i) for i, n in enumerate(lengths)], max_tokens=8)
    # FFD by hand: 5->A(3 left) 4->B(4) 3->A(0) 3->B(1) 2->C(6) 1->B(0)
    assert [mb.samples for mb in mbs] == [[0, 2], [1, 3, 5], [4]]
    assert [mb.input_ids.shape for mb in mbs] == [torch.Size([1, 8]), torch.Size([1, 8]), torch.Size([1, 2])]
    assert sum(mb.num_tokens for mb in mbs) == sum(lengths)
    assert all(mb.attention_mask is None and mb.packed for mb in mbs)


def test_positions_restart_and_per_token_fields_follow_their_sequence():
    samples = [sample(n, 2, i) for i, n in enumerate([6, 3, 4])]
    (mb,) = pack(samples, max_tokens=16)
    for i, s in enumerate(samples):
        at = mb.seq_index[0] == i
        assert mb.position_ids[0, at].tolist() == list(range(len(s.token_ids)))
        assert mb.input_ids[0, at].tolist() == s.token_ids
        assert mb.loss_mask[0, at].tolist() == s.loss_mask
        assert mb.advantages[0, at].tolist() == s.advantages
        assert set(mb.seq_ntokens[0, at].tolist()) == {sum(s.loss_mask)}
    assert segment_bounds(mb.position_ids) == [(0, 6, 0), (6, 10, 6), (10, 13, 10)]


def test_too_long_sequence_names_its_length():
    samples = [sample(4), sample(4), sample(9)]
    with pytest.raises(ValueError, match=r"sample 2 has 9 tokens, more than max_tokens=8"):
        pack(samples, max_tokens=8)
    with pytest.raises(ValueError, match=r"sample 2 has 9 tokens"):
        pad(samples, max_tokens=8)


def test_bad_samples_are_rejected():
    s = sample(4, prompt=0)
    with pytest.raises(ValueError, match=r"loss_mask\[0\] is 1"):
        pack([s], 8)
    bad = sample(4)
    bad.advantages = [0.0]
    with pytest.raises(ValueError, match=r"len\(advantages\)=1 != len\(token_ids\)=4"):
        pack([bad], 8)


def test_pad_rows_fit_the_budget():
    lengths = [5, 2, 2, 7, 1, 3]
    mbs = pad([sample(n, 1, i) for i, n in enumerate(lengths)], max_tokens=10)
    # given order: [5,2] (2x5=10), [2,7]? 2x7=14 > 10 -> [2], [7], [1,3] (2x3=6)
    assert [mb.samples for mb in mbs] == [[0, 1], [2], [3], [4, 5]]
    for mb in mbs:
        assert mb.input_ids.numel() <= 10 and not mb.packed
        assert mb.attention_mask.sum().item() == mb.num_tokens
    sorted_mbs = pad([sample(n, 1, i) for i, n in enumerate(lengths)], max_tokens=10, sort=True)
    assert sum(mb.num_slots for mb in sorted_mbs) <= sum(mb.num_slots for mb in mbs)


def test_block_causal_mask():
    (mb,) = pack([sample(3, 1, 0), sample(2, 1, 1)], max_tokens=8)
    m = mb.block_causal_mask()[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    add = mb.block_causal_mask(torch.float32)[0, 0]
    assert add[3, 0] == torch.finfo(torch.float32).min and add[4, 3] == 0


# -- attention isolation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "attn,packed_mask",
    [
        ("varlen_sdpa", False),  # the default: one SDPA call per sequence
        ("sdpa", False),  # HF detects packing from position_ids (only without a KV cache)
        ("sdpa", True),  # explicit 4-D block-diagonal boolean mask
        ("eager", True),  # explicit additive mask
    ],
)
def test_packed_logprobs_equal_alone(model_dir, attn, packed_mask):
    samples = [sample(n, 3, i) for i, n in enumerate([17, 5, 30, 9, 2])]
    cfg = TrainerConfig(attn_implementation=attn, packed_mask=packed_mask, micro_batch_tokens=128)
    with Trainer(model_dir, cfg) as t:
        assert len(pack(samples, 128)) == 1  # all five share one row
        together = t.logprobs(samples)
        for s, lp in zip(samples, together):
            alone = t.logprobs([s])[0]
            assert len(lp) == len(s.token_ids) and lp[0] == 0.0
            assert max(abs(a - b) for a, b in zip(lp, alone)) < 1e-5
        # a different neighbour changes nothing
        other = t.logprobs([samples[0], sample(40, 1, 99)])[0]
        assert max(abs(a - b) for a, b in zip(other, together[0])) < 1e-5


def test_padded_layout_matches_packed(model_dir):
    samples = [sample(n, 3, i) for i, n in enumerate([17, 5, 30, 9])]
    with Trainer(model_dir, TrainerConfig(micro_batch_tokens=128)) as t:
        packed = t.logprobs(samples)
        t.cfg.batching = "pad"
        padded = t.logprobs(samples)
    for a, b in zip(packed, padded):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5


def test_logprobs_match_plain_hf_forward(model_dir):
    """The trainer's logprobs (alignment, temperature) against a hand-written HF computation."""
    from transformers import AutoModelForCausalLM

    s = sample(12, 2, 5)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([s.token_ids])).logits[0] / 0.7
    ref = [0.0] + torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(s.token_ids[1:])[:, None])[:, 0].tolist()
    with Trainer(model_dir, TrainerConfig(temperature=0.7)) as t:
        (lp,) = t.logprobs([s])
    assert max(abs(a - b) for a, b in zip(lp, ref)) < 1e-5


def test_varlen_attention_with_grouped_query_heads(tmp_path):
    """GQA (fewer KV heads than query heads) goes through HF's SDPA helper per segment."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(tmp_path)
    samples = [sample(n, 2, i) for i, n in enumerate([11, 4, 23])]
    with Trainer(str(tmp_path), TrainerConfig(micro_batch_tokens=64)) as t:
        together = t.logprobs(samples)
        for s, lp in zip(samples, together):
            assert max(abs(a - b) for a, b in zip(lp, t.logprobs([s])[0])) < 1e-5
