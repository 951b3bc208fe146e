"""Turn-level credit on a long-horizon env (issue 15): ``python bench/bench_credit.py --env textworld``.

Arms (``ARMS``), every one the real ``agentrl.jobs.run.Runner`` (LocalEngine + Trainer, on-policy:
staleness 0, ``--temperature`` 1 and ``--loss-agg`` seq-mean-token-mean by default) from the same start
model, the built-in TextWorld warm start (``model.path: builtin:textworld``,
``agentrl.warmstart.textworld_model``):

* ``outcome`` (GRPO): ``(R - mean) / std`` of the episode return, on every sampled token;
* ``gigpo`` (GRPO + ``algo.credit=gigpo``): that plus omega x the step-level advantage inside
  anchor-state groups (turns of one group's samples starting from the same ``state_key``);
* ``turn_return`` (GRPO preset, ``algo.credit=turn_return``): discounted return-to-go minus the
  group's mean at the same turn index;
* ``ppo`` (the ppo preset: a value head, turn-level GAE, whitened advantages).

Equal samples per arm (``--groups`` x ``--group-size`` episodes per step, ``--steps`` steps);
paired: seed s gives every arm the same tasks and sampling seeds (rollout seed = trainer seed = s).
Reward: 1 on success, 0 otherwise (``step_cost`` 0), gamma ``--gamma`` for the per-turn returns.

Reports per arm: held-out success at the end (``--eval-tasks`` eval-split worlds, every task in the
denominator; the start model's rate is measured once, it is the same for every arm), mean and 95 %
t interval over seeds; the AUC of the rollout success curve; the paired difference of the end
success vs ``outcome`` with a two-sided paired t-test p-value (and the seeds where the arm is
ahead); wall time per optimizer step; for gigpo the anchor-group statistics (turns sharing a
state, largest group). JSON to ``bench/results/credit-textworld.json``.

Two designs. Held-out (the default): the built-in warm start trains on every train world and is
scored on ``--eval-tasks`` eval-split worlds it never saw. Practised worlds (``--model practice
--worlds N --eval-split train``): a start SFT-trained in 4-9 minutes on varied games of N fixed worlds
(``agentrl.warmstart.textworld_practice``, the CI learning test's start) trains on those worlds and
is scored on them, the same eval episodes (tasks and sampling seeds) for every arm, seed and the
start: whether a credit mode turns the same samples into more success where learning is visible
within 20 steps. That design's command (the CI test's settings, 4 arms)::

    python bench/bench_credit.py --env textworld --model practice --worlds 4 --eval-split train \
        --temperature 0.5 --eval-temperature 0.5 --lr 3e-5 --steps 20 --groups 4 --group-size 4 \
        --eval-tasks 32 --seeds 8 --jobs 2 --out bench/results/credit-textworld-practice.json

``--jobs 2`` runs two (arm, seed) runs at once in worker processes of ``--threads`` torch threads each:
on 2 cores, 1 thread each, a 16-episode step took 22.3 s per run against 19.8 s for one run alone on 2
threads, ~1.8x the throughput. Each run's s/step is then that of concurrent runs; the arms stay
interleaved, so they share the load alike. ``--resume`` keeps the (arm, seed) runs already in ``--out``
(written after every run) and makes only the missing ones, so a comparison can span sessions:
``--seeds 8 --resume`` after ``--seeds 4`` makes seeds 4-7.
"""

from __future__ import annotations

import asyncio
import json
import platform
import sys
import time
from pathlib import Path

from credit_textworld_report import report, scored, summarize

#: arm -> (algo preset, credit mode)
ARMS = {
    "outcome": ("grpo", "outcome"),
    "gigpo": ("grpo", "gigpo"),
    "turn_return": ("grpo", "turn_return"),
    "ppo": ("ppo", "turn_gae"),
}


def env_kwargs(args) -> dict:
    """The training env's kwargs: the difficulty, and ``--worlds`` fixed train worlds when set."""
    return {"difficulty": args.difficulty, **({"worlds": args.worlds} if args.worlds else {})}


def start_model(args) -> str:
    """``--model``: a path or Hub id as given; ``practice``: the start that practised the ``--worlds``
    worlds (``agentrl.warmstart.textworld_practice``, cached); default: the built-in TextWorld warm start."""
    if args.model != "practice":
        return args.model or "builtin:textworld"
    if not args.worlds:
        raise SystemExit("--model practice needs --worlds N: the fixed train worlds it practised and the runs practise")
    from agentrl.warmstart.textworld_practice import practice_model_path

    return str(practice_model_path(args.worlds))


def run_config(model: str, arm: str, seed: int, args, out: Path, eval_tasks: int):
    """The run config of one arm and seed (everything but the arm identical across arms)."""
    from agentrl.config.schema import load_config

    preset, credit = ARMS[arm]
    return load_config(  # laid on TextWorld's run recipe (agentrl.envs.recipes), as `agentrl run --env textworld`
        base={
            "output_dir": str(out),
            "model": {"path": model},
            "env": {"id": "textworld", "kwargs": env_kwargs(args)},
            "rollout": {
                "max_new_tokens": args.max_new_tokens,
                "max_turns": args.max_turns,
                "max_context": args.max_context,
                "group_size": args.group_size,
                "temperature": args.temperature,
                "seed": seed,
            },
            "algo": {"name": preset, "credit": credit, "gamma": args.gamma, "gigpo_omega": args.omega},
            "train": {
                "steps": args.steps,
                "groups_per_step": args.groups,
                "max_staleness": 0,
                "checkpoint_every": 0,
            },
            "eval": {
                "num_tasks": eval_tasks,
                "every": 0,
                "env_kwargs": {"split": args.eval_split},
                "temperature": args.eval_temperature,
            },
            "trainer": {
                "lr": args.lr,
                "loss_agg": args.loss_agg,
                "seed": seed,
                "temperature": args.temperature,
                "lr_schedule": "constant",
            },
            "engine": {"max_batch_size": 64},
            "logging": {"tensorboard": False, "trajectories_per_step": 0},
        },
    )


def run_one(model: str, arm: str, seed: int, args, out_root: Path) -> dict:
    """One training run; its rollout success curve, end held-out success, wall per step, credit stats.
    The run's own first evaluation is skipped (the start model is the same for every arm and seed:
    ``start_success`` measures it once)."""
    import agentrl.jobs.run as runner_mod

    cfg = run_config(model, arm, seed, args, out_root / f"{arm}-s{seed}", args.eval_tasks)
    orig = runner_mod.Runner.evaluate

    async def evaluate(self, first: bool = False):
        return {} if first else await orig(self)

    runner_mod.Runner.evaluate = evaluate
    t0 = time.perf_counter()
    try:
        runner = runner_mod.Runner(cfg, progress=False)
        asyncio.run(runner.run())
    finally:
        runner_mod.Runner.evaluate = orig
    rows = [r for r in runner.history if "rollout/reward_mean" in r]
    final = [r for r in runner.history if "eval/solve_rate" in r]
    step_s = [r["time/step_s"] for r in rows if "time/step_s" in r]
    return {
        "arm": arm,
        "seed": seed,
        "wall_s": time.perf_counter() - t0,
        "step_s": step_s,
        "reward": [r["rollout/reward_mean"] for r in rows],
        "turns": [r.get("rollout/turns_mean") for r in rows],
        "end_success": final[-1]["eval/solve_rate"] if final else None,
        "end_eval": {k: v for k, v in final[-1].items() if k.startswith("eval/")} if final else None,
        "credit": [{k: v for k, v in r.items() if k.startswith("credit/")} for r in rows],
    }


def _set_threads(n: int) -> None:
    import torch

    if n:
        torch.set_num_threads(n)


def run_all(model: str, todo: list[tuple[str, int]], args, out_root: Path):
    """Yield ``run_one`` of every (arm, seed) in ``todo``: in this process one after the other, or with
    ``--jobs N`` in N worker processes (each ``--threads`` torch threads), in order of completion.
    With N > 1 the runs share the cores, so their wall time per step is that of N concurrent runs."""
    if args.jobs <= 1:
        for arm, seed in todo:
            yield run_one(model, arm, seed, args, out_root)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools
    pool = ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_set_threads, initargs=(args.threads,))
    try:
        futures = [pool.submit(run_one, model, arm, seed, args, out_root) for arm, seed in todo]
        for f in as_completed(futures):
            yield f.result()
    finally:  # a failed run (or Ctrl-C) drops the runs not started; the ones reported are already saved
        pool.shutdown(wait=True, cancel_futures=True)


#: arguments that do not change what a run measures (which runs are made, and how fast)
_NOT_WORKLOAD = ("out", "resume", "jobs", "threads", "seeds", "seed_start", "arms")
#: bench_credit.py arguments of the concise comparison only
_CONCISE_ONLY = ("pattern", "turns", "threshold", "hidden", "layers", "sft_steps", "model_dir")


def workload(args) -> dict:
    """What every run of this comparison shares (a resumed file must have been made with the same)."""
    return {k: v for k, v in vars(args).items() if k not in _NOT_WORKLOAD + _CONCISE_ONLY}


def resumed(out: Path, args, todo: list[tuple[str, int]]) -> tuple[list[dict], dict | None, list[dict]]:
    """``--resume``: the runs of ``todo`` already in ``out`` (a finished or partial result of the same
    workload), its start-model measurement, and its other runs (arms or seeds not asked for this time:
    written back untouched, never dropped); nothing if ``out`` does not exist yet."""
    if not out.exists():
        return [], None, []
    data = json.loads(out.read_text())
    theirs, mine = data.get("workload"), workload(args)
    if theirs != mine:
        diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs and theirs.get(k) != v} if theirs else {}
        raise SystemExit(
            f"--resume: {out} was made with another workload ({diff or 'none recorded'}; file vs now): "
            "use the same arguments or another --out"
        )
    wanted = set(todo)
    runs = [r for r in data["runs"] if (r["arm"], r["seed"]) in wanted]
    kept = [r for r in data["runs"] if (r["arm"], r["seed"]) not in wanted]
    print(f"--resume: {len(runs)} of {len(todo)} runs already in {out} ({len(kept)} others kept)", flush=True)
    return runs, data.get("start"), kept


def start_success(model: str, args) -> dict:
    """The start model's held-out success, measured once: the runs' end eval (``Runner.evaluate``:
    the same eval-split tasks and sampling seeds) on the start model."""
    from transformers import AutoTokenizer

    from agentrl.engine.local.engine import LocalEngine
    from agentrl.envs.registry import make
    from agentrl.episodes.config import RolloutConfig
    from agentrl.episodes.manager import EpisodeManager
    from agentrl.episodes.summary import eval_stats
    from agentrl.jobs.run.held_out import eval_specs, per_task
    from agentrl.warmstart.default_model import resolve_model_path

    path = resolve_model_path(model)
    tok = AutoTokenizer.from_pretrained(str(path))
    kwargs = {**env_kwargs(args), "split": args.eval_split}
    rcfg = RolloutConfig(
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_context=args.max_context,
        temperature=args.eval_temperature,
        group_size=1,
        seed=0,
    )

    async def go():
        engine = LocalEngine.from_pretrained(str(path), device="cpu", dtype="float32", max_context=args.max_context)
        await engine.start()
        try:
            mgr = EpisodeManager(engine, lambda: make("textworld", **kwargs), tok, rcfg, env_id="textworld")
            specs = eval_specs(args.eval_tasks)
            return eval_stats(per_task(specs, await mgr.collect(specs), "textworld"))
        finally:
            await engine.close()

    return asyncio.run(go())


def main(args, argv: list[str]) -> dict:
    import tempfile

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    arms = [a for a in args.arms.split(",") if a] if args.arms else list(ARMS)
    if any(a not in ARMS for a in arms):
        raise SystemExit(f"--arms: {arms!r} must be a subset of {list(ARMS)}")
    t0 = time.perf_counter()
    model = start_model(args)
    out = Path(args.out or Path(__file__).parent / "results" / "credit-textworld.json")
    # interleaved (seed-major), so machine load drifts hit every arm alike
    todo = [(arm, seed) for seed in range(args.seed_start, args.seed_start + args.seeds) for arm in arms]
    runs, start, kept = resumed(out, args, todo) if args.resume else ([], None, [])
    todo = [t for t in todo if t not in {(r["arm"], r["seed"]) for r in runs}]
    with tempfile.TemporaryDirectory(prefix="bench-credit-tw-") as tmp:
        start = start or start_success(model, args)
        print(f"start model {model}: {scored(args)} success {start.get('solve_rate')}", flush=True)
        for r in run_all(model, todo, args, Path(tmp)):
            runs.append(r)
            print(
                f"  {r['arm']:<12} seed {r['seed']}: rollout success {r['reward'][0]:.3f} -> {r['reward'][-1]:.3f}, "
                f"{scored(args)} end {r['end_success']:.3f} ({r['wall_s']:.0f} s)",
                flush=True,
            )
            partial = summarize(runs, [a for a in arms if any(x["arm"] == a for x in runs)])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(
                json.dumps(
                    {
                        "partial": True,
                        "workload": workload(args),
                        "start": start,
                        "summary": partial,
                        "runs": runs + kept,
                    }
                )
            )
    summary = summarize(runs, arms)
    report(summary, arms, start, args)
    result = {
        "benchmark": "credit on textworld (issue 15): outcome vs gigpo vs turn_return vs ppo",
        "command": "python bench/bench_credit.py " + " ".join(argv),
        "machine": {
            "platform": platform.platform(),
            "threads": torch.get_num_threads(),
            "jobs": args.jobs,
            "torch": torch.__version__,
        },
        "workload": workload(args),
        "wall_s": time.perf_counter() - t0,
        "start": start,
        "summary": summary,
        "runs": runs + kept,  # the summary is of this call's arms and seeds; the file keeps every run
    }
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out} ({result['wall_s']:.0f} s)")
    return result


def add_args(ap) -> None:
    """The textworld arguments of ``bench/bench_credit.py --env textworld``."""
    g = ap.add_argument_group("--env textworld")
    g.add_argument("--difficulty", type=int, default=1)
    g.add_argument("--max-turns", type=int, default=30)
    g.add_argument("--max-context", type=int, default=4096)
    g.add_argument("--gamma", type=float, default=0.95)
    g.add_argument("--omega", type=float, default=1.0, help="gigpo's step-level weight")
    g.add_argument("--eval-tasks", type=int, default=64, help="eval tasks at the end of each run (and of the start)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the training rollouts")
    g.add_argument("--eval-temperature", type=float, default=1.0, help="of the eval episodes (start and end)")
    g.add_argument(
        "--model",
        default=None,
        help="start model: a path or Hub id, or 'practice' (a start SFT-trained on the --worlds worlds; "
        "default: builtin:textworld)",
    )
    g.add_argument(
        "--worlds", type=int, default=0, help="train on this many fixed train worlds (env.kwargs.worlds; 0: all)"
    )
    g.add_argument(
        "--eval-split",
        choices=("eval", "train"),
        default="eval",
        help="the end eval's worlds: held-out (eval) or, with --worlds, the practised ones (train)",
    )
    g.add_argument(
        "--loss-agg",
        default="seq-mean-token-mean",
        help="trainer.loss_agg of every arm (default: the grpo preset's, which `agentrl run --env textworld` uses)",
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs already in --out (same workload) and make only the missing ones",
    )
    g.add_argument(
        "--jobs", type=int, default=1, help="runs at once, in worker processes of --threads threads each (2 cores: 2)"
    )


if __name__ == "__main__":
    sys.exit("run it as: python bench/bench_credit.py --env textworld")
