"""distributed: ray vs in-process: Ray startup and the overhead of each training-step phase.

Starts a local Ray instance (``--num-cpus``) and a RayCompute (1 trainer rank, 1 engine actor,
1 rollout worker, colocated) on the built-in tiny model shape, and the same three components in
this process (Trainer, LocalEngine, EpisodeManager). Then, ``--repeats`` times, interleaved (the
order flips every round), each side runs one step's phases on the same work:

- rollout: ``--prompts`` x ``--group`` single-turn episodes (same specs, seeds and env);
- train: one ``train_step`` on the same TrainSamples (built from the in-process rollout);
- sync: ``full_state_dict`` + the engine's ``update_weights`` with the new version.

Both trainers see identical data, so their parameters must stay equal: the max difference is
printed as a check. Reported: Ray startup phases (ray.init, placement, actor construction),
median seconds per phase per side, the median of per-round ratios ray/in-process, and the median
added milliseconds. Prints a table; writes --out (JSON).

    python bench/bench_ray.py                 # ~3 min on 2 busy cores
    python bench/bench_ray.py --repeats 3
    python bench/bench_ray.py --run-steps 6   # plus whole `agentrl run`s, local vs ray (needs the runner hook)
    python bench/bench_ray.py --quick         # smoke run: 1 round of 2 x 2 episodes (~1 min, Ray start included)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agentrl  # noqa: E402
from agentrl.envs.base import AgentEnv, join_messages, new_stats  # noqa: E402

PHASES = ("rollout", "train", "sync", "step")


class CountEnv(AgentEnv):
    """One turn; reward = 1 - chars/40 (shorter tokens score higher)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        msgs = [{"role": "user", "content": f"Say a number ({self.np_random.integers(100)})."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    def step(self, action):
        return "", 1.0 - min(len(action), 40) / 40, True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("bench/RayCount-v0", entry_point=CountEnv, override=True, has_eval_split=False)


def samples_from(trajs):
    from agentrl.trainer import TrainSample

    by_group: dict[str, list] = {}
    for t in trajs:
        by_group.setdefault(t.group_id, []).append(t)
    out = []
    for group in by_group.values():
        mean = sum(t.reward for t in group) / len(group)
        for t in group:
            out.append(
                TrainSample(
                    token_ids=t.token_ids,
                    loss_mask=t.loss_mask,
                    behaviour_logprobs=t.logprobs,
                    advantages=[(t.reward - mean) * m for m in t.loss_mask],
                )
            )
    return out


async def step(side: dict, specs, samples_in, version: int) -> tuple[dict[str, float], list]:
    t0 = time.perf_counter()
    trajs = await side["episodes"].collect(specs)
    t1 = time.perf_counter()
    samples = samples_in if samples_in is not None else samples_from(trajs)
    await asyncio.to_thread(side["trainer"].train_step, samples)
    t2 = time.perf_counter()
    sd = await asyncio.to_thread(side["trainer"].full_state_dict)
    await side["engine"].update_weights(sd, version)
    t3 = time.perf_counter()
    return {"rollout": t1 - t0, "train": t2 - t1, "sync": t3 - t2, "step": t3 - t0}, samples


async def main_async(args) -> dict:
    import torch
    from transformers import AutoTokenizer

    from agentrl.config.plan import resolve
    from agentrl.config.schema import load_config
    from agentrl.distributed import RayCompute, RayConfig
    from agentrl.distributed.cluster import RayCluster
    from agentrl.engine.local.engine import LocalEngine
    from agentrl.episodes.manager import EpisodeManager, make_specs
    from agentrl.trainer import Trainer
    from agentrl.warmstart.tiny_model import build_model

    torch.set_num_threads(1)  # the actors get OMP_NUM_THREADS=1 from their fractional CPUs
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    model = str(build_model(tmp / "model"))
    overrides = [
        "env.id=bench/RayCount-v0",
        "env.kwargs={}",
        "rollout.max_new_tokens=16",
        "rollout.max_turns=1",
        "rollout.score_truncated=true",
        "trainer.lr=1e-3",
        "trainer.loss_agg=token-mean",
    ]
    cfg = resolve(load_config([], overrides), "run").cfg  # auto fields (device, dtypes) resolved, as a run does
    rc = RayConfig(num_cpus=args.num_cpus)
    cluster = RayCluster(rc)
    cluster.connect()
    compute = RayCompute.start(cfg, model, rc=rc)
    startup = {"ray_init_s": cluster.connect_s, **{k: v for k, v in compute.timings.items() if k != "connect_s"}}
    local_engine = LocalEngine.from_pretrained(
        model, max_context=cfg.rollout.max_context, max_batch_size=cfg.engine.max_batch_size
    )
    from agentrl.envs.registry import make

    local = {
        "engine": local_engine,
        "trainer": Trainer(model, cfg.trainer),
        "episodes": EpisodeManager(
            local_engine,
            lambda: make("bench/RayCount-v0"),
            AutoTokenizer.from_pretrained(model),
            cfg.rollout,
            env_id="bench/RayCount-v0",
        ),
    }
    ray_side = {"engine": compute.engine, "trainer": compute.trainer, "episodes": compute.episodes}
    times: dict[str, dict[str, list[float]]] = {s: {p: [] for p in PHASES} for s in ("inprocess", "ray")}
    try:
        await local_engine.start()
        await compute.engine.start()
        for r in range(args.repeats + 1):  # round 0 warms both sides up and is not counted
            specs = make_specs(args.prompts, args.group, seed=r)
            order = ["inprocess", "ray"] if r % 2 == 0 else ["ray", "inprocess"]
            samples = None
            for side in order:  # the second side trains on the first side's samples: same data
                sides = {"inprocess": local, "ray": ray_side}
                t, samples = await step(sides[side], specs, samples, r + 1)
                if r:
                    for p in PHASES:
                        times[side][p].append(t[p])
        p_local = await asyncio.to_thread(local["trainer"].full_state_dict)
        p_ray = await asyncio.to_thread(compute.trainer.full_state_dict)
        diff = max((p_local[k] - p_ray[k]).abs().max().item() for k in p_local)
    finally:
        await local_engine.close()
        local["trainer"].close()
        await compute.engine.close()
        compute.close()
        cluster.close()
    rows = {}
    for p in PHASES:
        a, b = times["inprocess"][p], times["ray"][p]
        rows[p] = {
            "inprocess_s": statistics.median(a),
            "ray_s": statistics.median(b),
            "ratio": statistics.median(y / x for x, y in zip(a, b)),
            "added_ms": 1000 * statistics.median(y - x for x, y in zip(a, b)),
        }
    return {
        "startup": startup,
        "phases": rows,
        "param_max_diff": diff,
        "repeats": args.repeats,
        "episodes_per_step": args.prompts * args.group,
        "machine": platform.platform(),
        "cpus": args.num_cpus,
    }


def runner_compare(args) -> dict:
    """``agentrl run`` (Runner) with distributed local vs ray on the same config: wall time and the
    median of the per-step ``time/step_s`` (steps 2.. : step 1 includes warm-up)."""
    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner
    from agentrl.warmstart.tiny_model import build_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-run-"))
    model = str(build_model(tmp / "model"))
    out: dict = {}
    for mode in ("local", "ray"):
        cfg = load_config(
            [],
            [
                f"output_dir={tmp / mode}",
                f"model.path={model}",
                "env.id=bench/RayCount-v0",
                "env.kwargs={}",
                "rollout.max_new_tokens=16",
                "rollout.max_turns=1",
                "rollout.score_truncated=true",
                "rollout.group_size=8",
                "train.groups_per_step=4",
                f"train.steps={args.run_steps}",
                "train.max_staleness=0",
                "eval.num_tasks=0",
                "trainer.lr=1e-3",
                "trainer.loss_agg=token-mean",
                "logging.tensorboard=false",
                f"distributed={mode}",
                f"ray.num_cpus={args.num_cpus}",
            ],
        )
        t0 = time.perf_counter()
        asyncio.run(Runner(cfg, progress=False).run())
        wall = time.perf_counter() - t0
        rows = [json.loads(x) for x in (tmp / mode / "metrics.jsonl").read_text().splitlines()]
        step_s = [r["time/step_s"] for r in rows if "time/step_s" in r][1:]
        out[mode] = {"wall_s": wall, "step_s_median": statistics.median(step_s), "steps": args.run_steps}
    out["step_ratio"] = out["ray"]["step_s_median"] / out["local"]["step_s_median"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/ray[-quick].json)")
    ap.add_argument(
        "--run-steps", type=int, default=0, help="also time `agentrl run` local vs ray for this many steps (0: skip)"
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 counted round of 2 prompts x 2 episodes")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.prompts, args.group = 1, 2, 2
    args.out = args.out or str(Path(__file__).parent / "results" / f"ray{'-quick' if args.quick else ''}.json")
    res = asyncio.run(main_async(args))
    if args.run_steps:
        res["runner"] = runner_compare(args)
    print("\nRay startup (local instance): " + ", ".join(f"{k}={v:.1f}" for k, v in res["startup"].items()))
    print(f"\n{'phase':<8} {'in-process s':>13} {'ray s':>9} {'ray/inproc':>11} {'added ms':>9}")
    for p, r in res["phases"].items():
        print(f"{p:<8} {r['inprocess_s']:>13.3f} {r['ray_s']:>9.3f} {r['ratio']:>11.2f} {r['added_ms']:>9.1f}")
    print(
        f"\n{res['episodes_per_step']} episodes/step, {res['repeats']} interleaved rounds; "
        f"max |param(in-process) - param(ray)| = {res['param_max_diff']:.3g}"
    )
    if "runner" in res:
        r = res["runner"]
        print(
            f"agentrl run, {args.run_steps} steps: local {r['local']['wall_s']:.1f}s wall "
            f"({r['local']['step_s_median']:.3f}s/step), ray {r['ray']['wall_s']:.1f}s wall "
            f"({r['ray']['step_s_median']:.3f}s/step): step ratio ray/local {r['step_ratio']:.2f}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
