"""`agentrl run --env textworld --algo grpo --set algo.credit=gigpo` learns: the user's command on
TextWorld's recipe, shortened for CI, must raise success on the worlds it practises.

The built-in TextWorld warm start takes ~50 minutes to build, too long for CI, and a start that
solves nothing gives GRPO no signal (every group all-fail). So the run starts from the practice start
(``agentrl.warmstart.textworld_practice``): SFT on varied explorer games of the 4 fixed worlds the run then
practises (``env.kwargs.worlds=4``), which solves a part of its episodes and fails the rest by wandering or writing
broken calls. RL must make it better at those worlds. The start comes from the product's own cache
(``practice_model_path``, under ``$AGENTRL_CACHE``, keyed by its recipe and demonstrations), as
``bench/bench_credit.py --model practice`` takes it: built on first use (6-9 minutes on a slow 2-core machine),
reused after (a machine that keeps its cache, as CI's does for the SGLang venv, skips the build).

Two settings differ from the recipe, both for this start: it is nearly deterministic (it memorized
its games), so at temperature 1 it mostly writes broken calls (6 of 64 solved, against 26 of 64 at
0.5) and at lr 1e-4 one update can flip a world from always solved to never (measured: a run fell
from 0.6 to 0.0 by step 12). At 0.5 and lr 3e-5 its eval rose in all 8 seeds measured: by +0.14 to
+0.36 on these 64 episodes (+0.06 to +0.28 on their first 32, which this test used before: too
noisy for a 0.1 margin); BENCHMARKS.md, issue 15. The test runs seed 0 (+0.31 on one machine; +0.33, 0.53 ->
0.86, on a ~2.8x slower one with the start built on 2 threads and the run on every core; +0.25, 0.66 -> 0.91,
there with the start's SFT in micro-batches of one game).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # slow 2 cores: 7-8.5 min, +6-9 to build the start

WORLDS = 4
STEPS = 20
EVAL = 64  # episodes of the start and end evals (16 per world)
MARGIN = 0.1  # the rise the end eval must show (measured over 8 seeds: +0.14 to +0.36, median +0.29)


def _start():
    """The CI start: TextWorld's base SFT-trained on up to 50 explorer games per fixed world (174 games), cached."""
    from agentrl.envs.textworld import generate_world
    from agentrl.warmstart.textworld_demos import demo_worlds
    from agentrl.warmstart.textworld_practice import practice_model_path

    # the demonstrations' worlds are the run's: task seeds fold onto worlds 0..WORLDS-1 (train split)
    assert [t["id"] for t in demo_worlds(WORLDS, [1])] == [generate_world(s, 1, "train").task_id for s in range(WORLDS)]
    return practice_model_path(WORLDS)


def test_gigpo_on_textworld_raises_success_on_the_worlds_it_practises(tmp_path):
    start, out = _start(), tmp_path / "run"
    cmd = [sys.executable, "-m", "agentrl", "run", "--env", "textworld", "--algo", "grpo"]
    cmd += ["--set", "algo.credit=gigpo", "--model", str(start), "--steps", str(STEPS), "-o", str(out), "-q"]
    sets = [f"env.kwargs.worlds={WORLDS}", "trainer.lr=3e-5", "rollout.temperature=0.5", "trainer.temperature=0.5"]
    # the eval before the first step and after the last: the same 64 episodes (tasks and sampling
    # seeds) of the practised worlds, so start and end are paired
    sets += ["eval.every=0", f"eval.num_tasks={EVAL}", "eval.env_kwargs.split=train", "eval.temperature=0.5"]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["rollout"]["infra_failures"] == 0
    assert summary["eval_episodes_start"] == summary["eval_episodes_end"] == EVAL
    assert summary["eval_infra_failures_start"] == summary["eval_infra_failures_end"] == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["credit/anchor_groups"] > 0 for r in rows if "rollout/solve_rate" in r)  # step-level credit ran
    begin, end = summary["eval_solve_rate_start"], summary["eval_solve_rate_end"]
    assert 0 < begin < 0.75, summary  # a start with room: its groups carry a signal
    assert end >= begin + MARGIN, summary
