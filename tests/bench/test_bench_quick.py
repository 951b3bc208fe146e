"""Every bench script's ``--quick`` mode, run the way a reader of BENCHMARKS.md runs it: a subprocess
``python bench/<script>.py --quick --out <tmp>/<name>.json`` from the repository root. Each must exit 0,
print its results table (the header line naming the expected columns) and write its JSON with the
expected keys where ``--out`` says. Nothing here asserts on a timing: only that the same code path as
the full benchmark runs end to end and reports what BENCHMARKS.md quotes.

Scripts needing a component skip, saying why, when it cannot run here: SGLang
(``agentrl.engine.sglang.server.unavailable_reason``) and Ray (the ``ray`` extra). Docker is never
required: the sandbox and soak scripts skip their docker parts themselves and say so in their table.
The quick modes that take more than ~20 s on 2 cores are marked ``slow``. A script whose quick mode would run
the path a test already runs (``covered_by``) only imports and parses its arguments here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import components
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: bench/ files that are modules the scripts import, not benchmarks
#: (credit_textworld[_report]: bench_credit.py --env textworld; sandbox_*: bench_sandbox.py's shared pieces and
#: Docker half)
NOT_SCRIPTS = {
    "latency.py",
    "credit_textworld.py",
    "credit_textworld_report.py",
    "sandbox_common.py",
    "sandbox_docker.py",
}


@dataclass(frozen=True)
class Case:
    script: str
    header: tuple[str, ...]  # column names on the printed table's header line
    keys: tuple[str, ...]  # top-level keys of the written JSON (a list: keys of its first item)
    args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # "sglang", "ray"
    slow: bool = False
    name: str = ""
    beside: tuple[str, ...] = ()  # suffixes of files written next to the JSON (a plot)
    #: the test that runs this script's path: its quick mode would run it again, so here only ``--help`` runs
    #: (the script imports and parses its arguments); the numbers come from the full benchmark
    covered_by: str = ""

    @property
    def id(self) -> str:
        return self.name or self.script.removeprefix("bench_").removesuffix(".py")


CASES = [
    Case(
        "bench_episode.py",
        ("concurrency", "turns", "wall s", "turns/s", "turns/cpu-s"),
        ("throughput", "per_turn", "gc_tuned"),
    ),
    Case(
        "bench_fuzz.py",
        ("stage", "inputs", "crashes", "wrong", "hangs", "p50 ms", "p99 ms"),
        ("args", "stages", "warmup_failures"),
    ),
    Case(
        "bench_serve.py",
        ("round", "http s", "direct s", "ratio", "tokens", "same"),
        ("median_ratio_http_over_direct", "swap_s_median", "all_same_tokens", "rounds"),
    ),
    Case(
        "bench_engine.py",
        ("system", "tok/s (median)"),
        ("engine_tok_s_median", "static_tok_s_median", "speedup_median_of_pair_ratios", "workload"),
    ),
    Case(
        "bench_prefix_cache.py",
        ("turn", "context", "prefill tok off", "prefill tok on", "wall s off", "wall s on"),
        ("per_turn", "summary", "workload"),
    ),
    Case(
        "bench_trainer.py",
        ("arm", "tok/s (median)", "tok/cpu-s", "micro-batches", "padding"),
        ("arms", "speedup_vs_pad", "speedup_vs_pad_sorted", "workload"),
        slow=True,  # ~20 s on an idle 2-core machine
    ),
    Case(
        "bench_partial_rollouts.py",
        ("mode", "tok/s", "mixed_version_turns", "drain wait", "push med"),
        ("summary", "ratio_drained_over_partial_tokens_per_s", "runs"),
        slow=True,  # ~20 s on an idle 2-core machine
    ),
    Case(
        "bench_sandbox.py",
        ("what", "p50 ms", "p99 ms", "ratio (median of pairs) / result", "target"),
        ("machine", "modes", "throughput_local"),
        covered_by="tests/sandbox/test_sandbox_local.py and tests/sandbox/test_sandbox_docker.py (the same runs)",
    ),
    Case(
        "bench_soak.py",
        ("kind", "episodes", "tool statuses"),
        ("args", "reports"),
        covered_by="tests/jobs/test_soak.py",
    ),
    Case(
        "bench_lora_memory.py",
        ("arm", "trainable", "params MB", "grads MB", "optim MB", "train MB", "peak RSS MB"),
        ("model", "arms", "ratio_lora_over_full_train_mb", "ratio_lora_over_full_peak_rss", "workload"),
        slow=True,
    ),
    Case(
        "bench_credit.py",
        ("mode", "AUC", "turns s1->end"),
        ("summary", "runs", "workload"),
        slow=True,
        beside=(".png",),
    ),
    Case(
        "bench_async.py",
        ("k", "loop s", "speedup", "ceiling", "bound s", "reward AUC", "eval reward"),
        ("summary", "runs", "workload"),
        slow=True,
    ),
    Case(
        "bench_learning.py",
        ("run", "steps", "solve start", "solve end", "reward first10", "reward last10"),
        ("name", "evals", "reward_first10", "reward_last10"),
        beside=(".png",),
        covered_by="tests/jobs/test_default_recipe_isolation.py (the default recipe, shortened)",
    ),
    Case(
        "bench_rollout_correction.py",
        ("arm", "seed", "reward first1", "masked mean", "masked max", "held-out start", "held-out end"),
        ("workload", "runs"),
        slow=True,  # two 2-step `agentrl run`s of the tiny model: ~40 s on 2 cores
    ),
    Case(
        "bench_opd.py",
        ("arm", "seeds", "solve start", "solve end", "rev KL start", "rev KL end"),
        ("teacher", "student", "table", "runs"),
        covered_by="tests/jobs/test_opd_run.py (pure and mixed OPD runs, the same commands shortened)",
    ),
    Case(
        "bench_faults.py",
        ("run", "kills", "at step", "in ckpt", "attempts", "check"),
        ("live", "ledger", "replay", "diff", "diff_recorded"),
        covered_by="tests/jobs/test_resume.py and tests/jobs/test_run_faults.py (kills, resume, exactly once)",
    ),
    Case(
        "bench_ray.py",
        ("phase", "in-process s", "ray s", "ray/inproc", "added ms"),
        ("startup", "phases", "param_max_diff"),
        needs=("ray",),
        covered_by="tests/distributed/test_ray.py",
    ),
    Case(
        "bench_weight_sync.py",
        ("model", "params", "path", "median s", "MB/s"),
        ("rows", "repeats"),
        needs=("sglang",),
        covered_by="tests/weights/test_weight_sync.py",
    ),
    Case(
        "bench_engine.py",
        ("system", "tok/s (median)"),
        ("sglang_tok_s_median", "local_tok_s_median"),
        args=("--engine", "sglang"),
        needs=("sglang",),
        name="engine-sglang",
        covered_by="tests/engine/test_engine_conformance.py and tests/engine/test_sglang_engine.py",
    ),
    Case(
        "bench_ray_sglang.py",
        ("metric", "in-process", "ray", "ray/inproc"),
        ("table", "runs"),
        needs=("ray", "sglang"),
        covered_by="tests/distributed/test_ray_sglang.py",
    ),
]


def _param(case: Case):
    if case.covered_by:  # --help runs nothing heavy: no component needed, not slow
        return pytest.param(case, id=case.id)
    marks = [getattr(pytest.mark, n) for n in case.needs] + ([pytest.mark.slow] if case.slow else [])
    return pytest.param(case, marks=marks, id=case.id)


def _skip_reason(needs: tuple[str, ...]) -> tuple[str, str] | None:
    """(component, why) for the first of ``needs`` missing here, else None."""
    if "ray" in needs and importlib.util.find_spec("ray") is None:
        return "ray", "Ray is not installed (pip install -e '.[ray]')"
    if "sglang" in needs:
        from agentrl.engine.sglang.server import unavailable_reason

        reason = unavailable_reason()
        if reason:
            return "sglang", f"SGLang cannot run here: {reason}"
    return None


def header_line(stdout: str, columns: tuple[str, ...]) -> str | None:
    """The first printed line naming every column (a table's header), or None."""
    return next((line for line in stdout.splitlines() if all(c in line for c in columns)), None)


def test_every_bench_script_has_a_quick_case():
    scripts = {p.name for p in BENCH.glob("*.py")} - NOT_SCRIPTS
    assert scripts == {c.script for c in CASES}, "a bench script without a quick-mode case here (or a stale case)"
    for name in scripts:
        assert '"--quick"' in (BENCH / name).read_text(), f"bench/{name} has no --quick mode"


def test_header_line_finds_only_a_full_header():
    out = "warming up\nstage  inputs  crashes\nparser 3 0\n"
    assert header_line(out, ("stage", "crashes")) == "stage  inputs  crashes"
    assert header_line(out, ("stage", "hangs")) is None


@pytest.mark.parametrize("case", [_param(c) for c in CASES if c.covered_by])
def test_scripts_covered_by_a_test_import_and_parse_their_arguments(case: Case):
    """A quick mode that would repeat a test's path (``covered_by``) is not run again: the script must still
    import and parse its arguments, offering --quick."""
    cmd = [sys.executable, str(BENCH / case.script), "--help"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "--quick" in p.stdout, f"$ {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    assert (ROOT / case.covered_by.split()[0]).exists(), f"{case.covered_by} does not exist"


@pytest.mark.parametrize("case", [_param(c) for c in CASES if not c.covered_by])
def test_quick_mode_runs_and_reports(case: Case, tmp_path):
    reason = _skip_reason(case.needs)
    if reason:
        components.unavailable(*reason)
    out = tmp_path / f"{case.id}.json"
    cmd = [sys.executable, str(BENCH / case.script), "--quick", *case.args, "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840)
    tail = f"\n$ {' '.join(cmd)}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
    assert p.returncode == 0, f"exit {p.returncode}{tail}"
    assert header_line(p.stdout, case.header) is not None, f"no table header with columns {case.header}{tail}"
    assert out.exists(), f"--out {out} not written{tail}"
    data = json.loads(out.read_text())
    first = data[0] if isinstance(data, list) else data
    missing = [k for k in case.keys if k not in first]
    assert not missing, f"JSON {out.name} lacks {missing}; has {sorted(first)}"
    for suffix in case.beside:
        assert out.with_suffix(suffix).exists(), f"{out.with_suffix(suffix).name} not written beside the JSON{tail}"


@pytest.mark.slow
def test_credit_textworld_quick_runs_two_arms_in_worker_processes(tiny_model_dir, tmp_path):
    """``bench_credit.py --env textworld --quick --jobs 2``: both arms run in worker processes (the tiny
    model as start model, so no TextWorld warm start is built here), and the table and JSON pair them."""
    out = tmp_path / "credit-textworld.json"
    cmd = [sys.executable, str(BENCH / "bench_credit.py"), "--env", "textworld", "--quick", "--jobs", "2"]
    cmd += ["--arms", "outcome,gigpo", "--model", str(tiny_model_dir), "--max-turns", "4", "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840)
    tail = f"\n$ {' '.join(cmd)}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
    assert p.returncode == 0, f"exit {p.returncode}{tail}"
    assert header_line(p.stdout, ("arm", "end success", "diff vs outcome", "s/step", "|A|")) is not None, tail
    data = json.loads(out.read_text())
    assert data["machine"]["jobs"] == 2 and "partial" not in data
    assert sorted((r["arm"], r["seed"]) for r in data["runs"]) == [("gigpo", 0), ("outcome", 0)]
    assert all(len(r["reward"]) == 2 and r["end_eval"]["eval/episodes"] == 4 for r in data["runs"])
    assert (
        data["summary"]["gigpo"]["vs_base"]["base"] == "outcome" and data["summary"]["gigpo"]["anchor_groups_mean"] > 0
    )
    assert all(data["summary"][arm]["adv_abs_mean"] >= 0 for arm in ("outcome", "gigpo"))  # logged by every run


@pytest.mark.slow
def test_credit_textworld_resume_makes_only_the_missing_runs(tiny_model_dir, tmp_path):
    """``--resume`` keeps the runs already in ``--out`` and makes the missing ones (the file's runs of arms
    not asked for stay in it); a file made with another workload is refused, naming the argument that differs."""
    out = tmp_path / "credit-textworld.json"
    base = [sys.executable, str(BENCH / "bench_credit.py"), "--env", "textworld", "--quick", "--max-turns", "3"]
    base += ["--model", str(tiny_model_dir), "--out", str(out)]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *extra], cwd=ROOT, capture_output=True, text=True, timeout=840)

    first = run("--arms", "outcome")
    assert first.returncode == 0, first.stderr[-3000:]
    before = json.loads(out.read_text())["runs"][0]
    second = run("--arms", "outcome,gigpo", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "--resume: 1 of 2 runs already" in second.stdout
    assert "outcome      seed 0" not in second.stdout and "gigpo        seed 0" in second.stdout
    runs = json.loads(out.read_text())["runs"]
    assert sorted(r["arm"] for r in runs) == ["gigpo", "outcome"]
    assert next(r for r in runs if r["arm"] == "outcome") == before  # kept, not re-run
    third = run("--arms", "gigpo", "--resume")  # a subset of the arms: the others stay in the file
    assert third.returncode == 0 and "(1 others kept)" in third.stdout, third.stderr[-3000:]
    assert sorted(json.loads(out.read_text())["runs"], key=lambda r: r["arm"]) == sorted(runs, key=lambda r: r["arm"])
    other = run("--arms", "outcome,gigpo", "--resume", "--lr", "5e-4")
    assert other.returncode != 0 and "another workload" in other.stderr and "'lr'" in other.stderr, other.stderr


@pytest.fixture
def tw(monkeypatch):
    """``bench/credit_textworld.py`` imported, and a parser of its arguments with the shared ones set."""
    import argparse

    monkeypatch.syspath_prepend(str(BENCH))
    import credit_textworld

    ap = argparse.ArgumentParser()
    credit_textworld.add_args(ap)

    def parse(argv, **shared):
        args = ap.parse_args(argv)
        for k, v in {"max_new_tokens": 48, "group_size": 8, "steps": 2, "groups": 2, "lr": 1e-4, **shared}.items():
            setattr(args, k, v)
        return args

    return credit_textworld, parse


def test_credit_textworld_temperature_reaches_rollouts_trainer_and_eval(tmp_path, tw):
    """``--temperature`` sets the training rollouts' and the trainer's (which rescores with it),
    ``--eval-temperature`` the held-out episodes'; the run plan accepts the pair."""
    from agentrl.config.plan import resolve

    credit_textworld, parse = tw
    args = parse(["--temperature", "0.4", "--eval-temperature", "0.7"])
    cfg = resolve(credit_textworld.run_config("builtin:tiny", "gigpo", 3, args, tmp_path, 4), "run").cfg
    assert (cfg.rollout.temperature, cfg.trainer.temperature, cfg.eval.temperature) == (0.4, 0.4, 0.7)
    assert cfg.algo.credit == "gigpo" and cfg.rollout.seed == cfg.trainer.seed == 3
    assert {"temperature", "eval_temperature"} <= set(credit_textworld.workload(args))  # a resumed file must match


def test_credit_textworld_practised_worlds_reach_the_runs_and_the_start_eval(tmp_path, tw):
    """``--worlds 4 --eval-split train``: the runs train on 4 fixed worlds and their eval plays those worlds;
    ``--model practice`` needs ``--worlds`` (it is the start that practised them)."""
    from agentrl.config.plan import resolve

    credit_textworld, parse = tw
    args = parse(["--worlds", "4", "--eval-split", "train"], group_size=4, groups=4, lr=3e-5)
    cfg = resolve(credit_textworld.run_config("builtin:tiny", "outcome", 0, args, tmp_path, 4), "run").cfg
    assert cfg.env.kwargs == {"difficulty": 1, "worlds": 4} and cfg.eval.env_kwargs == {"split": "train"}
    assert credit_textworld.env_kwargs(parse([])) == {"difficulty": 1}  # default: every world
    with pytest.raises(SystemExit, match="--model practice needs --worlds"):
        credit_textworld.start_model(parse(["--model", "practice"]))
    assert credit_textworld.start_model(parse([])) == "builtin:textworld"


def test_credit_textworld_report_pairs_runs_of_several_files_by_seed(tmp_path, monkeypatch):
    """Two result files of different lrs: arms named by the lr, paired on the seeds both ran, by hand."""
    monkeypatch.syspath_prepend(str(BENCH))
    from credit_textworld_report import combined

    def run(arm, seed, end, reward):
        return {"arm": arm, "seed": seed, "end_success": end, "reward": reward, "step_s": [1.0], "credit": [{}]}

    a = {
        "workload": {"lr": 3e-5, "steps": 2},
        "runs": [run("gigpo", 0, 0.9, [0.5, 0.7]), run("gigpo", 1, 0.8, [0.4, 0.4])],
    }
    b = {"workload": {"lr": 4.2e-5, "steps": 2}, "runs": [run("outcome", s, 0.7, [0.5, 0.5]) for s in (0, 1, 2)]}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for p, data in zip(paths, (a, b)):
        p.write_text(json.dumps(data))
    summary, arms = combined([str(p) for p in paths], "outcome lr=4.2e-05")
    assert arms == ["gigpo lr=3e-05", "outcome lr=4.2e-05"]
    v = summary["gigpo lr=3e-05"]["vs_base"]
    assert v["seeds_paired"] == 2 and v["end_diff"] == pytest.approx(0.15)  # (0.2 + 0.1) / 2 over seeds 0, 1
    assert v["auc_diff"] == pytest.approx(((0.6 - 0.5) + (0.4 - 0.5)) / 2, abs=1e-12)
    with pytest.raises(SystemExit, match="none of the arms"):
        combined([str(p) for p in paths], "outcome")
