"""P1: async vs sync pipeline — wall time of the real training loop for the same number of trained
samples at ``train.max_staleness`` k = 0 (synchronous), 1, 2, 4, on a long-tail workload, with each
arm's final reward and the analytic bound (issue 6).

What runs: the real ``agentrl.jobs.run.Runner`` (LocalEngine + Trainer + EpisodeManager +
StalenessQueue + in-process weight sync) for ``--steps`` optimizer steps of ``--groups`` groups x
``--group-size`` episodes, so every arm trains the same number of samples. Model, tokens, rewards,
losses and weight updates are real: the ``concise`` env (``agentrl/envs/concise.py``, ``--turns`` turns,
each rewarded for a short reply) from the SFT warm start ``bench_credit.py`` builds (tiny Qwen3,
hidden 64, 2 layers), GRPO, lr 2e-3, temperature 1. ``--correction``: the loss's off-policy correction, the same in
every arm: ``behaviour`` (the default config: PPO clip of pi / pi_behaviour) or ``decoupled``
(``trainer.old_logprobs=current`` + ``trainer.tis_cap=2``: ratio against the trainer's own
start-of-step logprobs, times the truncated importance weight pi_old / pi_behaviour).

Workload (the long tail, injected as time; ``bench/latency.py``): on this 2-core CPU generation
and training share the cores, so a serving GPU and slow tools are modelled as what the scheduler
sees, time. After each real generation the engine wrapper sleeps ``per_token_s * L`` with the
reply length L ~ lognormal(mean ``--mean-tokens``, CV ``--cv``); before each real env step the env
wrapper sleeps a tool latency ~ lognormal(mean ``--tool-mean-s``, CV ``--cv``). Draws are seeded by
(repeat, episode, turn), so every arm of a repeat sees the same delays for the same episodes. The
real compute (generation of up to ``--max-new-tokens`` tokens per turn, the train step, the weight
push) still runs and adds to the injected time. Evaluation runs with both latencies off.

Timing: loop wall time = the sum of the runner's ``time/step_s`` over all steps (waiting for
rollouts + building samples + train step + weight sync; setup and evaluations excluded). Arms are
interleaved within each repeat (``--repeats``); speedups are medians of per-repeat ratios
``loop(k=0) / loop(k)``.

Analytic bound. Let D be a group's duration (admission to its last episode's end; measured as the
longest episode's ``wall_s``), T the trainer's part of a step (``step_s - wait_rollout_s``: build
samples, train step, weight sync), B groups per step.

* k = 0: the queue admits B groups, the trainer waits for all of them, trains, syncs, and only
  then admits the next B. A step takes exactly ``max(D_1..D_B) + T``, so the loop is
  ``steps * (E[max_B D] + T)``: the slowest group of every batch gates it.
* k >= 1: admission allows ``admitted - dropped < (version + k + 1) * B``, i.e. at most (k+1)*B
  groups hold a slot at once, and a slot is held from admission until the step that trains the
  group has synced (``set_version``): at least D + T. By Little's law the group throughput is at
  most (k+1)*B / E[D + T], so a step (B groups) takes at least ``(E[D] + T) / (k + 1)``; the
  trainer is serial, so also at least T. Bound: ``step >= max(T, (E[D] + T) / (k + 1))``
  (leaving the slot's T out gives the looser ``max(T, E[D] / (k + 1))``, also in the JSON).

The bench computes both from each run's *measured* D and T, prints measured vs bound step time,
and the speedup ceiling ``loop(k=0) / (steps * bound(k))``.

Final reward per arm: mean rollout reward (episode return, in [0, 1]) of the last ``--last`` steps,
and a held-out evaluation of ``--eval-tasks`` tasks (temperature 1, same task and sampling seeds
for every arm, latencies off) with its standard error. Also: mean staleness of the trained
samples, dropped groups, injected delays' mean/CV. Raw JSON: ``bench/results/async.json``
(``async-quick.json`` for ``--quick``, ``async-decoupled.json`` for ``--correction decoupled``).

    python bench/bench_async.py                  # 4 arms x 3 repeats x 30 steps (~14 min on 2 cores)
    python bench/bench_async.py --correction decoupled
    python bench/bench_async.py --quick          # smoke check: 2 arms, 4 steps, short delays (~10 s + model load)
    python bench/bench_async.py --staleness 0 2 --repeats 1 --steps 20
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench-local modules (latency, bench_credit)

from latency import LatencyEngine, LatencyEnv, SampleCounter

from agentrl.episodes.summary import episode_return, rollout_stats
from agentrl.jobs.run import Runner

ENV_ID = "bench/concise-latency-v0"  # bench-only registration: never part of agentrl/
RESULTS = Path(__file__).resolve().parent / "results"
#: --correction -> trainer fields. "behaviour": the default, PPO clip of pi / pi_behaviour (a stale
#: token whose ratio already left [1 - 0.2, 1 + 0.2] gives no gradient on the clipped side);
#: "decoupled": ratio against the trainer's own logprobs at the step start (starts at 1) times the
#: truncated IS weight min(pi_old / pi_behaviour, 2), the off-policy correction of decoupled PPO.
CORRECTIONS = {
    "behaviour": {"old_logprobs": "behaviour", "tis_cap": None},
    "decoupled": {"old_logprobs": "current", "tis_cap": 2.0},
}


def register_env(counter: SampleCounter) -> None:
    """(Re-)register the bench env with a fresh sample counter (one per run)."""
    from agentrl.envs.concise import ConciseEnv
    from agentrl.envs.registry import register

    def factory(*, inner_kwargs: dict, tool_mean_s: float, cv: float, seed: int) -> LatencyEnv:
        return LatencyEnv(ConciseEnv(**inner_kwargs), tool_mean_s=tool_mean_s, cv=cv, seed=seed, counter=counter)

    register(ENV_ID, factory, override=True, source="bench/bench_async.py")


class _GroupRecorder:
    """Wraps the runner's TrajectoryLog: records each trained group's duration, then forwards."""

    def __init__(self, inner: Any, out: list[list[float]]) -> None:
        self.inner, self.out = inner, out

    def write(self, step: int, groups, *args: Any, **kwargs: Any) -> Any:
        self.out.append([max((t.wall_s for t in g), default=0.0) for g in groups])
        return self.inner.write(step, groups, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class LatencyRunner(Runner):
    """The real Runner with the engine wrapped in a LatencyEngine after setup (the weight sync
    keeps the inner engine, which is the one holding the weights; the training episode manager is
    rebuilt on the wrapper), group durations recorded, and an evaluation that reports the mean
    reward with latencies off."""

    def __init__(self, cfg, *, latency: dict, eval_at_start: bool = False) -> None:
        super().__init__(cfg, progress=False)
        self.latency, self.eval_at_start = latency, eval_at_start
        self.group_durations: list[list[float]] = []  # per step, per trained group: seconds

    def _setup(self) -> None:
        from agentrl.episodes.manager import EpisodeManager

        super()._setup()
        parts = self.parts
        parts.engine = LatencyEngine(parts.engine, **self.latency)
        # the compute's manager was built on the bare engine: training episodes must see the delays
        parts.compute.episodes = EpisodeManager(
            parts.engine, parts.make_env, parts.tokenizer, self.cfg.rollout, env_id=self.cfg.env.id
        )
        self.outputs.trajectory_log = _GroupRecorder(self.outputs.trajectory_log, self.group_durations)

    async def evaluate(self, first: bool = False) -> dict[str, float]:
        from agentrl.episodes.manager import EpisodeManager, EpisodeSpec

        n = self.cfg.eval.num_tasks
        if n <= 0 or (first and not self.eval_at_start):
            return {}
        rcfg = dataclasses.replace(self.cfg.rollout, temperature=self.cfg.eval.temperature, group_size=1)
        mgr = EpisodeManager(self.engine, self.parts.make_eval_env, self.parts.tokenizer, rcfg, env_id=self.cfg.env.id)
        specs = [EpisodeSpec(f"eval-{i}", 0, 10_000_019 + i, sampling_seed=i) for i in range(n)]
        self.engine.enabled = False
        try:
            trajs = await mgr.collect(specs)
        finally:
            self.engine.enabled = True
        s = rollout_stats([trajs])
        rets = [episode_return(t) for t in trajs if t.trainable]
        se = statistics.stdev(rets) / len(rets) ** 0.5 if len(rets) > 1 else float("nan")
        return {
            "reward_mean": s.get("reward_mean", 0.0),
            "reward_se": se,
            "solve_rate": s["solve_rate"],
            "turns_mean": s["turns_mean"],
            "infra_failures": s["infra_failures"],
        }


def make_config(model: Path, k: int, seed: int, args, out: Path):
    from agentrl.config.schema import load_config

    inner = {"n_turns": args.turns, "pattern": "same"}
    return load_config(
        base={
            "output_dir": str(out),
            "model": {"path": str(model)},
            "env": {
                "id": ENV_ID,
                "kwargs": {"inner_kwargs": inner, "tool_mean_s": args.tool_mean_s, "cv": args.cv, "seed": seed},
            },
            "rollout": {
                "max_new_tokens": args.max_new_tokens,
                "max_turns": args.turns,
                "score_truncated": True,
                "group_size": args.group_size,
                "temperature": 1.0,
                "seed": seed,
            },
            "algo": {"name": "grpo"},
            "train": {"steps": args.steps, "groups_per_step": args.groups, "max_staleness": k, "checkpoint_every": 0},
            "eval": {"num_tasks": args.eval_tasks, "every": 0, "temperature": 1.0, "env_kwargs": {"tool_mean_s": 0.0}},
            "trainer": {
                "lr": args.lr,
                "loss_agg": "token-mean",
                "seed": seed,
                "temperature": 1.0,
                **CORRECTIONS[args.correction],
            },
            "logging": {"tensorboard": False, "trajectories_per_step": 0},
        }
    )


def run_one(model: Path, k: int, repeat: int, args, out_root: Path) -> dict:
    seed = args.seed + repeat
    register_env(SampleCounter())
    latency = {"per_token_s": args.per_token_s, "mean_tokens": args.mean_tokens, "cv": args.cv, "seed": seed}
    runner = LatencyRunner(
        make_config(model, k, seed, args, out_root / f"k{k}-r{repeat}"),
        latency=latency,
        eval_at_start=args.eval_start and repeat == 0 and k == args.staleness[0],
    )
    t0 = time.perf_counter()
    summary = asyncio.run(runner.run())
    rows = [r for r in runner.history if "time/step_s" in r]
    step_s = [r["time/step_s"] for r in rows]
    train_s = [r["time/step_s"] - r["time/wait_rollout_s"] for r in rows]
    last = rows[-1]
    evals = [r for r in runner.history if "eval/reward_mean" in r]
    gen_delays = runner.engine.delays
    res = {
        "k": k,
        "repeat": repeat,
        "seed": seed,
        "steps": len(rows),
        "run_wall_s": time.perf_counter() - t0,
        "loop_s": sum(step_s),
        "step_s": step_s,
        "train_s": train_s,
        "wait_s": [r["time/wait_rollout_s"] for r in rows],
        "sync_s": [r["time/weight_sync_s"] for r in rows],
        "group_durations": runner.group_durations,
        "reward": [r["rollout/reward_mean"] for r in rows],
        "trained_samples": sum(args.groups * args.group_size - r["rollout/infra_failures"] for r in rows),
        "infra_failures": sum(r["rollout/infra_failures"] for r in rows),
        "staleness_mean": last.get("staleness/staleness_mean", 0.0),
        "staleness_max": last.get("staleness/staleness_max", 0),
        "dropped_groups": last.get("staleness/dropped_groups", 0),
        "eval_end": {k2[5:]: v for k2, v in evals[-1].items() if k2.startswith("eval/")} if evals else {},
        "eval_start": {k2[5:]: v for k2, v in evals[0].items() if k2.startswith("eval/")} if len(evals) > 1 else {},
        "gen_delay_mean_s": statistics.fmean(gen_delays) if gen_delays else 0.0,
        "gen_delay_cv": statistics.pstdev(gen_delays) / statistics.fmean(gen_delays) if gen_delays else 0.0,
        "summary_wall_s": summary.get("wall_s"),
    }
    res.update(bound(res, k, args.groups))
    return res


def bound(res: dict, k: int, B: int) -> dict:
    """The analytic lower bound on the step time from this run's measured D and T (module docstring)."""
    T = statistics.fmean(res["train_s"])
    D = [d for step in res["group_durations"] for d in step]
    ED = statistics.fmean(D)
    E_maxD = statistics.fmean(max(step) for step in res["group_durations"])
    if k == 0:
        b = E_maxD + T
    else:
        b = max(T, (ED + T) / (k + 1))
    return {
        "T_mean_s": T,
        "D_mean_s": ED,
        "D_cv": statistics.pstdev(D) / ED,
        "batch_max_D_mean_s": E_maxD,
        "bound_step_s": b,
        "bound_step_loose_s": max(T, ED / (k + 1)) if k else b,
        "measured_step_s": statistics.fmean(res["step_s"]),
    }


def last_mean(xs: list[float], n: int) -> float:
    return statistics.fmean(xs[-n:])


def summarize(runs: list[dict], args) -> dict:
    out: dict[int, dict] = {}
    base = {r["repeat"]: r for r in runs if r["k"] == 0}
    for k in args.staleness:
        mine = [r for r in runs if r["k"] == k]
        ratios = [base[r["repeat"]]["loop_s"] / r["loop_s"] for r in mine if r["repeat"] in base]
        ceil = [base[r["repeat"]]["loop_s"] / (r["steps"] * r["bound_step_s"]) for r in mine if r["repeat"] in base]
        ev = [r["eval_end"].get("reward_mean") for r in mine if r["eval_end"]]
        ev_d = [
            r["eval_end"]["reward_mean"] - base[r["repeat"]]["eval_end"]["reward_mean"]
            for r in mine
            if r["eval_end"] and r["repeat"] in base and base[r["repeat"]]["eval_end"]
        ]
        med = statistics.median
        out[k] = {
            "loop_s": med([r["loop_s"] for r in mine]),
            "speedup": med(ratios) if ratios else None,
            "speedup_per_repeat": ratios,
            "speedup_ceiling": med(ceil) if ceil else None,
            "measured_step_s": med([r["measured_step_s"] for r in mine]),
            "bound_step_s": med([r["bound_step_s"] for r in mine]),
            "T_mean_s": med([r["T_mean_s"] for r in mine]),
            "D_mean_s": med([r["D_mean_s"] for r in mine]),
            "D_cv": med([r["D_cv"] for r in mine]),
            "batch_max_D_mean_s": med([r["batch_max_D_mean_s"] for r in mine]),
            "reward_last": med([last_mean(r["reward"], args.last) for r in mine]),
            "reward_last_per_repeat": [last_mean(r["reward"], args.last) for r in mine],
            "reward_auc": med([statistics.fmean(r["reward"]) for r in mine]),
            "eval_reward": med(ev) if ev else None,
            "eval_reward_per_repeat": ev,
            "eval_se": med([r["eval_end"]["reward_se"] for r in mine if r["eval_end"]]) if ev else None,
            "eval_minus_k0_per_repeat": ev_d,
            "staleness_mean": med([r["staleness_mean"] for r in mine]),
            "dropped_groups": sum(r["dropped_groups"] for r in mine),
            "trained_samples": med([r["trained_samples"] for r in mine]),
        }
    return out


def report(summary: dict, args) -> None:
    print(
        f"\nP1 async vs sync: {args.steps} steps x {args.groups} groups x {args.group_size} episodes, "
        f"{args.repeats} repeat(s), medians"
    )
    hdr = (
        f"{'k':>2}{'loop s':>9}{'speedup':>9}{'ceiling':>9}{'step s':>8}{'bound s':>9}{'T s':>7}{'E[D] s':>8}"
        f"{'E[maxD]':>8}{'stale':>7}{'drop':>6}{'reward AUC':>11}{'reward(last)':>13}{'eval reward':>16}"
    )
    print(hdr)
    for k, s in summary.items():
        ev = f"{s['eval_reward']:.3f}+-{s['eval_se']:.3f}" if s["eval_reward"] is not None else "-"
        sp = f"{s['speedup']:.2f}x" if s["speedup"] is not None else "-"
        ce = f"{s['speedup_ceiling']:.2f}x" if s["speedup_ceiling"] is not None else "-"
        print(
            f"{k:>2}{s['loop_s']:>9.1f}{sp:>9}{ce:>9}{s['measured_step_s']:>8.2f}{s['bound_step_s']:>9.2f}"
            f"{s['T_mean_s']:>7.2f}{s['D_mean_s']:>8.2f}{s['batch_max_D_mean_s']:>8.2f}{s['staleness_mean']:>7.2f}"
            f"{s['dropped_groups']:>6}{s['reward_auc']:>11.3f}{s['reward_last']:>13.3f}{ev:>16}"
        )
    for k, s in summary.items():
        rel = [f"{d:+.3f}" for d in s["eval_minus_k0_per_repeat"]]
        print(
            f"  k={k}: speedup per repeat {[round(x, 2) for x in s['speedup_per_repeat']]}, last-{args.last}-step "
            f"reward per repeat {[round(x, 3) for x in s['reward_last_per_repeat']]}, eval - eval(k=0) per repeat {rel}"
        )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--staleness", type=int, nargs="+", default=[0, 1, 2, 4], help="arms: train.max_staleness (0 first)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--groups", type=int, default=2, help="groups per optimizer step (B)")
    ap.add_argument("--group-size", type=int, default=4, help="episodes per group (G)")
    ap.add_argument("--turns", type=int, default=4, help="concise turns per episode")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="real tokens sampled per turn (at most)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument(
        "--correction",
        choices=list(CORRECTIONS),
        default="behaviour",
        help="off-policy correction of the loss (see CORRECTIONS), the same for every arm",
    )
    ap.add_argument("--per-token-s", type=float, default=0.002, help="injected seconds per notional reply token")
    ap.add_argument("--mean-tokens", type=float, default=200.0, help="mean notional reply length (lognormal)")
    ap.add_argument(
        "--tool-mean-s", type=float, default=0.2, help="mean injected tool latency per env step (lognormal)"
    )
    ap.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of both lognormals")
    ap.add_argument("--eval-tasks", type=int, default=1000, help="held-out episodes at the end of each run (0: none)")
    ap.add_argument("--eval-start", action="store_true", help="also evaluate the start model (once)")
    ap.add_argument("--last", type=int, default=10, help="final rollout reward = mean of the last N steps")
    ap.add_argument("--seed", type=int, default=0, help="repeat r uses seed + r (rollouts, trainer, delays)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--model-dir", default=None, help="cache of the start model (default: bench_credit's)")
    ap.add_argument(
        "--quick", action="store_true", help="smoke check: k=0,2, 1 repeat, 4 steps, 100 eval tasks, /4 delays"
    )
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/async[-quick][-decoupled].json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.staleness, args.repeats, args.steps, args.eval_tasks, args.last = [0, 2], 1, 4, 100, 2
        args.per_token_s, args.tool_mean_s = args.per_token_s / 4, args.tool_mean_s / 4
    if not args.staleness or args.staleness[0] != 0 or any(k < 0 for k in args.staleness):
        ap.error(f"--staleness: {args.staleness!r} must start with 0 (the synchronous baseline) and be >= 0")
    if args.last > args.steps:
        ap.error(f"--last {args.last} exceeds --steps {args.steps}")
    name = (
        "async" + ("-quick" if args.quick else "") + ("" if args.correction == "behaviour" else f"-{args.correction}")
    )
    out = Path(args.out or RESULTS / f"{name}.json")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from bench_credit import start_model

    model = start_model(
        argparse.Namespace(
            pattern="same", hidden=64, layers=2, turns=args.turns, sft_steps=150, model_dir=args.model_dir
        )
    )
    t0 = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        for repeat in range(args.repeats):
            for k in args.staleness:  # interleaved, so load drifts hit every arm alike
                r = run_one(model, k, repeat, args, Path(tmp))
                runs.append(r)
                ev = r["eval_end"].get("reward_mean")
                print(
                    f"  k={k} repeat {repeat}: loop {r['loop_s']:.1f} s (step {r['measured_step_s']:.2f} s, bound "
                    f"{r['bound_step_s']:.2f} s, T {r['T_mean_s']:.2f} s, E[D] {r['D_mean_s']:.2f} s), reward "
                    f"{r['reward'][0]:.3f} -> {last_mean(r['reward'], args.last):.3f}, eval "
                    f"{'-' if ev is None else f'{ev:.3f}'}, staleness {r['staleness_mean']:.2f}, dropped "
                    f"{r['dropped_groups']} ({r['run_wall_s']:.0f} s)",
                    flush=True,
                )
    summary = summarize(runs, args)
    report(summary, args)
    result = {
        "benchmark": "P1 async vs sync pipeline (bench/bench_async.py)",
        "command": "python bench/bench_async.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(), "torch": torch.__version__},
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "model_dir")},
        "wall_s": time.perf_counter() - t0,
        "summary": {str(k): v for k, v in summary.items()},
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out} ({result['wall_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
