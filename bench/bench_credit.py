"""Turn-level credit vs outcome broadcast: does ``algo.credit=turn_return`` learn faster than
``algo.credit=outcome`` on an env where credit per turn matters (issue 4)?

Env: ``concise`` (``agentrl/envs/concise.py``), ``--turns`` requests per episode, each turn paid for its
own reply's length c = min(chars, 40)/40; the episode return is in [0, 1]. ``--pattern``:

* ``same``: every turn asks for "one short word", pays ``(1 - c) / turns``. Every turn wants the
  same behaviour, so the broadcast total already points each turn the right way.
* ``alternate``: turns 1, 3 ask for "one short word" (``(1 - c) / turns``), turns 2, 4 for "a long
  sentence" (``c / turns``): opposite behaviours, where per-turn credit should matter most. A
  policy blind to the request earns at most 0.5 (a fixed length pays (1 - c) + c per turn pair).

Every arm runs the real ``agentrl.jobs.run.Runner`` (LocalEngine + Trainer, on-policy: staleness 0,
temperature 1, token-mean loss, ``--group-size`` samples x ``--groups`` prompts per step, ``--lr``)
for ``--steps`` steps, over the same seeds (rollout seed = trainer seed = s), from the same start
model. Only the advantage differs:

* ``outcome`` (GRPO): ``(R - mean) / std`` of the episode return R, on every sampled token;
* ``turn_return`` (GRPO preset, ``algo.credit=turn_return``): turn k's tokens get their
  return-to-go ``sum_{j>=k} r_j`` minus the group's mean at position k (gamma 1, no std);
* ``outcome_nostd`` (Dr.GRPO, outcome): ``R - mean`` on every token. A control: it is what
  ``turn_return`` reduces to on one turn, so turn_return vs this arm isolates per-turn credit
  from GRPO's std division.

Workload: at the learning test's lr 2e-2 with 8 x 4 episodes per step every arm solves ``same``
by step 3-5; lr 2e-3 with 4 x 2 episodes leaves gradient noise for credit to reduce. ``same``
runs 30 steps; ``alternate`` needs 100 (by step 30 no arm got past the blind 0.5; at lr 5e-3
the policies collapsed to empty or run-on replies).

Start model: a random tiny Qwen3 (``--hidden`` 64, 2 layers) cannot end a turn, and the episode
manager ends an episode at a turn cut by ``max_new_tokens``, so the arms could not differ. So it
is warm-started by a short SFT (``agentrl.warmstart.sft.run_sft``, ~30 s, cached under the temp dir or
``--model-dir``) on the pattern's own conversations whose replies are 1 to ``max_words`` random
words, the count drawn whatever the turn asks for: the start policy ends its turns at varied
lengths but has seen no link between request and length. ``same``: 1-6 words, 8 tokens per turn
(about half its episodes still hit the cut early); ``alternate``: 1-12 words, 24 tokens, so a
40-character reply (~15 tokens here) fits (a long reply that runs into the cut still ends the
episode, costing the turns after it).

Reports per arm: mean rollout reward (episode return) at chosen steps, the first step where the
seed-mean curve reaches ``--threshold`` (and each seed's), the AUC (mean reward over all steps,
+- its std over seeds; paired by seed against turn_return), how many seeds end (last 10 steps)
at the threshold, turns per episode, and the mean score (turns * r_k, in [0, 1]) of the short-
and long-wanting turns played. JSON and a PNG of the seed-mean curves go to
``bench/results/credit.{json,png}`` (``credit-alternate.*`` for ``--pattern alternate``).
Seed-to-seed spread is as large as the gaps between arms: read the paired differences, on 16 seeds.

    python bench/bench_credit.py                              # 3 seeds x 30 steps x 3 arms (~75 s on 2 cores)
    python bench/bench_credit.py --seeds 16 --seed-start 300  # fresh seeds, for a confirmation
    python bench/bench_credit.py --pattern alternate --seeds 16 --seed-start 300
    python bench/bench_credit.py --quick                      # smoke run: 1 seed x 3 steps, 20-step SFT (~1 min)
    python bench/bench_credit.py --env textworld --seeds 8    # issue 15: outcome/gigpo/turn_return/ppo on textworld
                                                              # (bench/credit_textworld.py; --quick: smoke run)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import credit_textworld  # noqa: E402  (the --env textworld comparison, beside this file)

#: arm -> (algo preset, credit mode). ``outcome_nostd`` is a control: Dr.GRPO's r - mean, broadcast;
#: turn_return divides by no std either, so on a one-turn env it equals this arm exactly, and any
#: gap between them here is the per-turn credit, not GRPO's std normalisation.
ARMS = {"outcome": ("grpo", "outcome"), "turn_return": ("grpo", "turn_return"), "outcome_nostd": ("dr_grpo", "outcome")}
WORDS = ("yes", "no", "ok", "sure", "the", "answer", "is", "a", "word", "about", "it", "and", "so", "on")
#: per ``--pattern``: the warm start's longest reply (words), and the defaults of --steps, --max-new-tokens, --threshold
PATTERNS = {
    "same": {"max_words": 6, "steps": 30, "max_new_tokens": 8, "threshold": 0.8},
    "alternate": {"max_words": 12, "steps": 100, "max_new_tokens": 24, "threshold": 0.7},
}


def warm_start_examples(tok, n: int, turns: int, seed: int, pattern: str = "same"):
    """Concise conversations (real env prompts) whose replies are 1 to max_words random words,
    whatever the turn asks for."""
    from agentrl.envs.concise import ConciseEnv
    from agentrl.warmstart.chat_data import chat_example

    rng, env, out = random.Random(seed), ConciseEnv(n_turns=turns, pattern=pattern), []
    for i in range(n):
        _, info = env.reset(seed=2**30 + i)  # away from RL's task seeds (s * 1_000_003 + i), though only topics repeat
        msgs = list(info["messages"])
        for k in range(turns):
            words = rng.choices(WORDS + (env._topics[k],), k=rng.randint(1, PATTERNS[pattern]["max_words"]))
            reply = " ".join(words).capitalize() + rng.choice(("", ".", "!"))
            obs_msgs = env.step(reply)[4]["messages"]
            msgs += [{"role": "assistant", "content": reply}, *obs_msgs]
        out.append(chat_example(tok, msgs, source=f"concise-warm-{i}"))
    return out


def start_model(args) -> Path:
    from transformers import AutoTokenizer

    from agentrl.warmstart.sft import SFTConfig, run_sft
    from agentrl.warmstart.tiny_model import build_model

    tag = "v2" if args.pattern == "same" else f"v2-{args.pattern}"  # bump the tag when the data changes
    key = f"{tag}-h{args.hidden}-l{args.layers}-t{args.turns}-sft{args.sft_steps}"
    root = Path(args.model_dir or Path(tempfile.gettempdir()) / "agentrl-bench-credit") / key
    warm = root / "warm"
    if (warm / "config.json").exists():
        print(f"start model: {warm} (cached)")
        return warm
    t0 = time.perf_counter()
    base = build_model(
        root / "base",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=2,
        intermediate_size=2 * args.hidden,
        seed=0,
    )
    tok = AutoTokenizer.from_pretrained(str(base))
    examples = warm_start_examples(tok, 512, args.turns, seed=0, pattern=args.pattern)
    tmp = root / "warm.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted build
    summary = run_sft(
        base,
        tmp,
        SFTConfig(
            steps=args.sft_steps,
            batch_size=16,
            lr=3e-3,
            num_demos=0,
            warmup_steps=10,
            batching="pad",
            micro_batch_tokens=4096,
        ),
        examples=examples,
    )
    tmp.rename(warm)
    print(
        f"start model: {warm} (built in {time.perf_counter() - t0:.0f} s; SFT loss "
        f"{summary['loss_first']:.2f} -> {summary['loss_last']:.2f})"
    )
    return warm


def turn_scores(groups, env) -> dict[str, float]:
    """Mean score ``n_turns * r_k`` (in [0, 1]) of the played turns that want a short / a long reply."""
    by: dict[str, list[float]] = {}
    for t in (t for g in groups for t in g if t.trainable):
        for rec in t.turns:
            by.setdefault(env.wants(rec.index), []).append(rec.reward * env.n_turns)
    return {f"{kind}_score": statistics.fmean(v) for kind, v in by.items()}


def run_one(model: Path, mode: str, seed: int, args, out_root: Path) -> dict:
    """One training run of arm ``mode``; its per-step rollout reward, turns per episode and turn scores."""
    import agentrl.jobs.run.loop as runner_mod  # rollout_stats is looked up there
    from agentrl.config.schema import load_config
    from agentrl.envs.concise import ConciseEnv

    out = out_root / f"{mode}-s{seed}"
    env_kwargs = {"n_turns": args.turns, "pattern": args.pattern}
    cfg = load_config(
        base={
            "output_dir": str(out),
            "model": {"path": str(model)},
            "env": {"id": "concise", "kwargs": env_kwargs},
            "rollout": {
                "max_new_tokens": args.max_new_tokens,
                "max_turns": args.turns,
                "score_truncated": True,
                "group_size": args.group_size,
                "temperature": 1.0,
                "seed": seed,
            },
            "algo": {"name": ARMS[mode][0], "credit": ARMS[mode][1]},
            "train": {"steps": args.steps, "groups_per_step": args.groups, "max_staleness": 0, "checkpoint_every": 0},
            "eval": {"num_tasks": 0, "every": 0, "env_kwargs": {}},
            "trainer": {"lr": args.lr, "loss_agg": "token-mean", "seed": seed, "temperature": 1.0},
            "logging": {"tensorboard": False},
        }
    )
    t0 = time.perf_counter()
    # the per-kind turn scores ride along in the runner's rollout metrics (a bench-only diagnostic;
    # nothing the trainer sees changes); restored afterwards
    env, base_stats = ConciseEnv(**env_kwargs), runner_mod.rollout_stats
    runner_mod.rollout_stats = lambda groups: {**base_stats(groups), **turn_scores(groups, env)}
    try:
        runner = runner_mod.Runner(cfg, progress=False)
        asyncio.run(runner.run())
    finally:
        runner_mod.rollout_stats = base_stats
    rows = [r for r in runner.history if "rollout/reward_mean" in r]
    return {
        "mode": mode,
        "seed": seed,
        "wall_s": time.perf_counter() - t0,
        "reward": [r["rollout/reward_mean"] for r in rows],
        "turns": [r["rollout/turns_mean"] for r in rows],
        **{k: [r.get(f"rollout/{k}_score") for r in rows] for k in ("short", "long")},
    }


def first_at(curve: list[float], threshold: float) -> int | None:
    """1-based step of the first value >= threshold (None: never)."""
    return next((i + 1 for i, v in enumerate(curve) if v >= threshold), None)


def mean_over_seeds(curves: list[list]) -> list[float | None]:
    """Per step, the mean of the seeds' values that exist (None: no seed has one)."""
    cols = [[v for v in col if v is not None] for col in zip(*curves)]
    return [statistics.fmean(c) if c else None for c in cols]


def summarize(runs: list[dict], args) -> dict:
    out = {}
    for mode in args.arms:
        mine = [r for r in runs if r["mode"] == mode]
        curves = [r["reward"] for r in mine]
        mean = [statistics.fmean(col) for col in zip(*curves)]
        std = [statistics.pstdev(col) for col in zip(*curves)]
        aucs, finals = [statistics.fmean(c) for c in curves], [statistics.fmean(c[-10:]) for c in curves]
        out[mode] = {
            "mean_curve": mean,
            "std_curve": std,
            **{f"{k}_curve": mean_over_seeds([r[k] for r in mine]) for k in ("turns", "short", "long")},
            "steps_to_threshold": first_at(mean, args.threshold),
            "steps_to_threshold_per_seed": [first_at(c, args.threshold) for c in curves],
            "auc": statistics.fmean(aucs),
            "auc_per_seed": aucs,
            "auc_std": statistics.pstdev(aucs) if len(aucs) > 1 else 0.0,
            "final_per_seed": finals,
            "seeds_final_at_threshold": sum(f >= args.threshold for f in finals),
        }
    if "turn_return" in out:  # paired by seed: same tasks and sampling seeds in every arm
        mine = out["turn_return"]["auc_per_seed"]
        for mode in out:
            if mode != "turn_return":
                d = [a - b for a, b in zip(mine, out[mode]["auc_per_seed"])]
                out[mode]["turn_return_minus_this_auc"] = {
                    "mean": statistics.fmean(d),
                    "per_seed": d,
                    "seeds_turn_return_better": sum(x > 0 for x in d),
                }
    return out


def plot(summary: dict, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode, color in zip(args.arms, ("tab:gray", "tab:blue", "tab:orange")):
        m, s = summary[mode]["mean_curve"], summary[mode]["std_curve"]
        x = range(1, len(m) + 1)
        ax.plot(x, m, color=color, label=f"{mode} (AUC {summary[mode]['auc']:.3f})")
        ax.fill_between(x, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=color, alpha=0.2)
    ax.axhline(args.threshold, color="k", ls=":", lw=0.8, label=f"threshold {args.threshold}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("rollout reward (episode return)")
    ax.set_title(
        f"concise, pattern {args.pattern} ({args.turns} turns, {args.group_size}x{args.groups} episodes/step, "
        f"lr {args.lr}, {args.max_new_tokens} tokens/turn):\n"
        f"credit modes, mean +- std over {args.seeds} seeds",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def textworld_defaults(args):
    """``--env textworld``'s defaults for the shared arguments (the workload of BENCHMARKS.md issue 15)."""
    for name, value in (("steps", 30), ("max_new_tokens", 48), ("lr", 1e-4), ("group_size", 8)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.seeds, args.steps, args.groups, args.eval_tasks = 1, 2, 1, 4
    return args


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed-start", type=int, default=0, help="first seed (fresh seeds for a confirmation run)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: 30 same, 100 alternate)")
    ap.add_argument("--pattern", choices=list(PATTERNS), default="same", help="what the turns ask for (see above)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=None, help="episodes per group (default: 4 concise, 8 textworld)")
    ap.add_argument("--groups", type=int, default=2, help="prompt groups per optimizer step")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default: 8 same, 24 alternate)")
    ap.add_argument("--lr", type=float, default=None, help="trainer lr (default: 2e-3 concise, 1e-4 textworld)")
    ap.add_argument(
        "--env",
        choices=("concise", "textworld"),
        default="concise",
        help="concise: the 4-turn env above; textworld: the long-horizon comparison (bench/credit_textworld.py)",
    )
    ap.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="reward level for steps-to-threshold (default: 0.8 same, 0.7 alternate)",
    )
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--model-dir", default=None, help="cache of the start model (default: temp dir)")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/credit[-alternate].json)")
    ap.add_argument("--arms", default=None, help=f"comma-separated subset of {list(ARMS)} (textworld: of its own arms)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 seed, 3 steps, 1 group per step, a 20-step SFT warm start (same code path)",
    )
    credit_textworld.add_args(ap)
    args = ap.parse_args(argv)
    if args.env == "textworld":
        return credit_textworld.main(textworld_defaults(args), sys.argv[1:] if argv is None else argv)
    args.lr = 2e-3 if args.lr is None else args.lr
    args.group_size = 4 if args.group_size is None else args.group_size
    args.arms = args.arms or ",".join(ARMS)
    if args.quick:
        args.seeds, args.steps, args.groups, args.sft_steps = 1, 3, 1, 20
    args.arms = [a for a in args.arms.split(",") if a]
    for k in ("steps", "max_new_tokens", "threshold"):
        if getattr(args, k) is None:
            setattr(args, k, PATTERNS[args.pattern][k])
    name = "credit" + ("" if args.pattern == "same" else f"-{args.pattern}") + ("-quick" if args.quick else "")
    args.out = args.out or str(Path(__file__).parent / "results" / f"{name}.json")
    if not args.arms or any(a not in ARMS for a in args.arms):
        ap.error(f"--arms: {args.arms!r} must be a non-empty subset of {list(ARMS)}")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = start_model(args)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-credit-") as tmp:
        for seed in range(args.seed_start, args.seed_start + args.seeds):
            for mode in args.arms:  # interleaved, so machine load drifts hit both modes alike
                r = run_one(model, mode, seed, args, Path(tmp))
                runs.append(r)
                print(
                    f"  {mode:<12} seed {seed}: reward {r['reward'][0]:.3f} -> {r['reward'][-1]:.3f}, "
                    f"turns {r['turns'][0]:.2f} -> {r['turns'][-1]:.2f} ({r['wall_s']:.0f} s)",
                    flush=True,
                )
    summary = summarize(runs, args)
    wall = time.perf_counter() - t0
    steps = sorted({s for s in (1, 2, 3, 4, 5, 10, 20, 30, 50, 100, 200) if s <= args.steps} | {args.steps})
    print(f"\npattern {args.pattern}: mean rollout reward over {args.seeds} seeds (episode return, max 1.0)")
    print(
        f"{'mode':<13}" + "".join(f"{'s' + str(s):>7}" for s in steps) + f"{'->' + str(args.threshold):>8}"
        f"{'AUC':>8}{'+-':>7}{'turns s1->end':>15}"
    )
    for mode in args.arms:
        m = summary[mode]
        hit = m["steps_to_threshold"]
        print(
            f"{mode:<13}"
            + "".join(f"{m['mean_curve'][s - 1]:>7.3f}" for s in steps)
            + f"{(str(hit) if hit else 'never'):>8}{m['auc']:>8.3f}{m['auc_std']:>7.3f}"
            f"{m['turns_curve'][0]:>9.2f}->{m['turns_curve'][-1]:.2f}"
        )
    for mode in args.arms:
        sc = [
            f"{k} turns {c[0]:.3f} -> {c[-1]:.3f}"
            for k in ("short", "long")
            if None not in (c := summary[mode][f"{k}_curve"])
        ]
        print(f"  {mode}: mean turn score (turns * r_k) of the {', '.join(sc)}")
    for mode in args.arms:
        m = summary[mode]
        print(
            f"  {mode}: per-seed steps to {args.threshold}: {m['steps_to_threshold_per_seed']}, per-seed AUC: "
            f"{[round(a, 3) for a in m['auc_per_seed']]}; last-10-step mean >= {args.threshold} on "
            f"{m['seeds_final_at_threshold']} of {args.seeds} seeds"
        )
    for mode in args.arms:
        paired = summary[mode].get("turn_return_minus_this_auc")
        if paired:
            print(
                f"  paired by seed, AUC(turn_return) - AUC({mode}): mean {paired['mean']:+.3f}, "
                f"turn_return higher on {paired['seeds_turn_return_better']} of {args.seeds} seeds"
            )
    result = {
        "benchmark": f"credit: outcome broadcast vs turn_return on concise, pattern {args.pattern}",
        "command": "python bench/bench_credit.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(), "torch": torch.__version__},
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "model_dir")},
        "wall_s": wall,
        "summary": summary,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(summary, args, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} ({wall:.0f} s)")
    return result


if __name__ == "__main__":
    main()
