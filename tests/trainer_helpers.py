"""What the one-process trainer tests (tests/trainer/test_trainer.py, test_lora.py,
test_seq_index_losses.py, test_opd.py) share: multi-turn-shaped samples (``make_samples``), the largest
difference between two state dicts (``max_diff``), the trainer -> local engine weight-sync round trip
(``assert_engine_reproduces_trainer``), and a model with noise on its weights (``perturbed_copy``, the
distillation teacher of test_opd.py and tests/jobs/test_opd_run.py)."""

from __future__ import annotations

import asyncio
import random
import shutil
from pathlib import Path

from agentrl.trainer import Trainer, TrainerConfig, TrainSample


def make_samples(
    n: int = 6, seed: int = 0, *, adv: float | list[float] = 1.0, returns: bool = False
) -> list[TrainSample]:
    """Multi-turn-shaped samples: prompt (mask 0), reply (1), tool output (0), reply (1)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r1, o, r2 = rng.randint(3, 8), rng.randint(2, 10), rng.randint(1, 6), rng.randint(2, 10)
        mask = [0] * p + [1] * r1 + [0] * o + [1] * r2
        a = adv[i] if isinstance(adv, list) else adv
        out.append(
            TrainSample(
                token_ids=[rng.randrange(5, 1000) for _ in mask],
                loss_mask=mask,
                behaviour_logprobs=[-6.0 * m for m in mask],
                advantages=[a * m for m in mask],
                returns=[float(i % 3) * m for m in mask] if returns else None,
            )
        )
    return out


def max_diff(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_engine_reproduces_trainer(model_dir: str, cfg: TrainerConfig) -> None:
    """Train two sft steps, push ``full_state_dict`` into a LocalEngine and sample from it: the
    engine then samples with the trainer's distribution, so the trainer's recomputed logprobs of
    that sample match the engine's (the mismatch the next step reports is ~0)."""
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.local.engine import LocalEngine

    samples = make_samples(2)
    with Trainer(model_dir, cfg) as t:
        for _ in range(2):
            t.train_step(samples)
        sd = t.full_state_dict()
        prompt = samples[0].token_ids[:5]

        async def sample():
            engine = LocalEngine(model_dir, max_batch_size=2, eos_token_ids=())
            try:
                await engine.update_weights(sd, t.version)
                return await engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=1.0))
            finally:
                await engine.close()

        gen = asyncio.run(sample())
        ids = prompt + gen.token_ids
        mask = [0] * len(prompt) + [1] * len(gen.token_ids)
        s = TrainSample(ids, mask, [0.0] * len(prompt) + gen.logprobs, [0.0] * len(ids))
        m = t.train_step([s])  # reports the trainer-vs-engine mismatch before updating
    assert set(gen.versions) == {2}
    assert m["mismatch/abs_diff_max"] < 1e-5


def perturbed_copy(model_dir: str | Path, out: Path, scale: float, seed: int = 0) -> str:
    """``model_dir`` copied to ``out`` with N(0, scale^2) noise added to every weight: the same
    tokenizer, another distribution."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out)
    return str(out)
