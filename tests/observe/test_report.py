"""`agentrl report`: the HTML page from a run directory, and a real headless-Chromium screenshot of it."""

import json
import re

import components
import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.cli.report import find_chromium, screenshot
from agentrl.observe.plots import PALETTE, curve, plot_curves, svg_chart
from agentrl.observe.report import CHARTS, load_run, render, shared_prefix, trajectory_html, write_report
from agentrl.trajectory import Outcome, Trajectory, TurnRecord, write_jsonl


def _traj(i, outcome=Outcome.OK, system=()):
    # prompt: the system tokens + 3 tokens, a 2-token sampled turn, a 2-token observation, a 1-token sampled turn
    k = len(system)
    t = Trajectory(
        episode_id=f"g{i}-0",
        group_id=f"g{i}",
        env_id="code_exec",
        prompt_len=k + 3,
        token_ids=[*system, 5 + i, 6, 7, 20, 21, 8, 9, 22],
        loss_mask=[0] * k + [0, 0, 0, 1, 1, 0, 0, 1],
        logprobs=[0] * k + [0, 0, 0, -0.25, -1.5, 0, 0, -0.125],
        turn_ids=[-1] * k + [-1, -1, -1, 0, 0, 0, 0, 1],
        versions=[-1] * k + [-1, -1, -1, 3, 3, -1, -1, 4],
        reward=1.0,
        outcome=outcome,
        turns=[TurnRecord(0, k + 3, 2, 2, "stop"), TurnRecord(1, k + 7, 1, 0, "stop")],
    )
    t.info["advantages"] = [0] * k + [0, 0, 0, 0.75, 0.75, 0, 0, -0.5]
    t.validate()
    return t


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    (d / "trajectories").mkdir(parents=True)
    rows = [{"step": 0, "eval/solve_rate": 0.5}]
    for s in range(1, 31):
        rows.append(
            {
                "step": s,
                "rollout/reward_mean": 0.5 + s / 100,
                "rollout/solve_rate": 0.5 + s / 100,
                "train/ppo_kl": 0.01 if s not in (25, 26) else 0.5,
                "train/entropy": 1.0,
                "rollout/tokens_per_episode": 100.0 + (s % 3),
                "rollout/sampled_tokens": 1000.0,
                "time/step_s": 2.0,
            }
        )
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn line")
    (d / "config.yaml").write_text("env: {id: code_exec}\nalgo: {name: grpo}\nmodel: {path: null}\n")
    (d / "summary.json").write_text(json.dumps({"steps": 30, "eval_solve_rate_end": 0.8}))
    write_jsonl(d / "trajectories" / "step_000001.jsonl", [_traj(0), _traj(1, Outcome.ENGINE_ERROR)])
    write_jsonl(d / "trajectories" / "step_000002.jsonl", [_traj(2)])
    return d


def test_load_run_reads_everything_and_names_bad_lines(run_dir):
    run = load_run(run_dir, max_trajectories=2)
    assert len(run.metrics) == 31 and run.summary["steps"] == 30 and run.config["algo"]["name"] == "grpo"
    assert run.outcomes == {"ok": 2, "engine_error": 1}
    assert [t.episode_id for t in run.trajectories] == ["g1-0", "g2-0"]  # the newest two
    assert any("metrics.jsonl:32" in p for p in run.problems)


def test_page_has_curves_alerts_outcomes_and_token_data(run_dir):
    page = render(load_run(run_dir))
    assert page.count("<svg") == len(CHARTS) == 10 and "Solve rate, every task counted" in page
    assert "<b>kl_spike</b> · 1 alert · steps 26 · e.g. step 26" in page  # KL 50x its average for 2 steps, reward rose
    assert "engine_error" in page and "33.3%" in page
    assert "logprob -1.500 | version 3 | advantage +0.750 | turn 0" in page
    assert "metrics.jsonl:32" in page  # the torn line is reported, not fatal


def test_token_viewer_colours_by_mask_and_advantage_sign():
    h = trajectory_html(_traj(0))
    assert h.count('class="t m0"') == 5 and h.count('class="t m1"') == 3
    assert h.count("rgba(22,163,74") == 2 and h.count("rgba(220,38,38") == 1  # + and - advantages
    assert "⟨20⟩" in h  # no tokenizer: ids shown


def test_cli_writes_report_and_rejects_missing_dir(run_dir, tmp_path):
    res = CliRunner().invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert (run_dir / "report.html").read_text().startswith("<!doctype html>")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "nope" in res.output


def test_headless_chromium_screenshot(run_dir, tmp_path):
    if find_chromium() is None:
        components.unavailable("chromium", "no headless Chromium installed (apt-get install chromium-headless-shell)")
    png = screenshot(write_report(run_dir), tmp_path / "report.png", height=1600)
    from PIL import Image

    img = Image.open(png).convert("RGB")
    assert img.size == (1280, 1600)
    colours = img.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # text, chart lines and token colours were drawn, not a blank page
    # the chart palette's blue is on the page
    assert any(abs(r - 37) < 30 and abs(g - 99) < 30 and b > 200 for _, (r, g, b) in colours)


def _chart_of(page, title):
    start = page.index(f'aria-label="{title}"')
    return page[start : page.index("</svg>", start)]


def test_page_opens_with_headline_rates_then_curves(run_dir):
    summary = {
        "steps": 30,
        "eval_solve_rate_start": 0.5,
        "eval_solve_rate_end": 0.558,
        "eval_infra_failure_rate_start": 0.0,
        "eval_infra_failure_rate_end": 0.22,
        "rollout": {"solve_rate": 0.6, "infra_failure_rate": 0.485, "episodes": 31008, "infra_failures": 15041},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    page = render(load_run(run_dir))
    assert page.index("<svg") < page.index("<h2>Monitors") < page.index("<h2>Outcomes") < page.index("Full summary")
    assert "eval infra-failure rate (start → end)</th><td>0.000 → 0.220" in page
    assert "eval solve rate (start → end)</th><td>0.500 → 0.558" in page
    assert "rollout episodes (infra failures)</th><td>31008 (15041)" in page


def test_alerts_fold_into_one_line_per_kind(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()[:-1]]
    for r in rows[1:]:
        r.update({"rollout/infra_failure_rate": 0.05, "rollout/infra_failures": 12.0, "rollout/episodes": 256.0})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    page = render(load_run(run_dir))
    assert page.count('<details class="alert">') == 2  # kl_spike and infra_failures
    assert "<b>infra_failures</b> · 30 alerts · steps 1–30 · e.g. step 1: rollout: 12 of 256 episodes (5.0%)" in page
    assert page.count("<div>step ") == 31  # every alert is inside its fold


def test_rates_and_counts_are_on_separate_axes_and_missing_steps_are_gaps(run_dir):
    rows = [
        {
            "step": s,
            "rollout/episodes": 256.0,
            "rollout/infra_failures": 200.0 if s == 2 else 0.0,
            "rollout/infra_failure_rate": 200 / 256 if s == 2 else 0.0,
            "rollout/solve_rate": 0.5,
        }
        for s in range(1, 5)
    ]
    for r in rows:
        if r["step"] != 3:  # step 3: every episode failed, nothing trainable: no reward, no tool use
            r.update({"rollout/reward_mean": 0.6, "rollout/tool_use_rate": 0.9})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    page = render(load_run(run_dir))
    rates = _chart_of(page, "Infrastructure failures and tool use (rate, 0-1)")
    assert "rollout/tool_use_rate @ step 1: 0.9" in rates and ">1.0</text>" in rates and ">200</text>" not in rates
    counts = _chart_of(page, "Infrastructure failures (episodes)")
    assert "rollout/infra_failures @ step 2: 200" in counts and "tool_use_rate" not in counts
    reward = _chart_of(page, "Reward (mean over trainable episodes)")
    assert _line(reward).count("M") == 2 and "@ step 3" not in reward  # the line stops at step 3, no point at 0
    assert [y == y for _, y in curve(rows, "rollout/reward_mean")] == [True, True, False, True]
    png = plot_curves(rows, run_dir / "curves.png")
    assert png.stat().st_size > 1000


def _line(svg, color=PALETTE[0]):
    """The path data of the chart's first line (matplotlib writes the legend's sample after it)."""
    return re.search(f'<path d="([^"]*)"[^>]*stroke: {color}', svg).group(1)


def test_svg_chart_fixed_range_gaps_and_tooltips():
    svg = svg_chart({"a": [(1, 0.2), (2, float("nan")), (3, 0.4), (4, 0.5)]}, "t", y_range=(0, 1))
    assert svg.startswith('<svg class="chart" role="img" aria-label="t" ') and svg.count("<svg") == 1
    assert _line(svg).count("M") == 2 and _line(svg).count("L") == 1  # (1, 0.2) alone, then 3 to 4
    assert ">0.0</text>" in svg and ">1.0</text>" in svg and ">2</text>" in svg  # the 0-1 axis; whole steps
    assert re.findall("<title>([^<]*)</title>", svg) == ["a @ step 1: 0.2", "a @ step 3: 0.4", "a @ step 4: 0.5"]
    assert "no data" in svg_chart({"a": [(1, float("nan"))]}, "empty")


def test_a_system_prompt_shared_by_every_trajectory_is_shown_once(run_dir):
    system = list(range(100, 120))  # 20 tokens every trajectory opens with
    trajs = [_traj(i, system=system) for i in range(3)]
    assert shared_prefix(trajs) == 20 and shared_prefix(trajs[:1]) == 0
    assert shared_prefix([_traj(i, system=system[:10]) for i in range(3)]) == 0  # too short to fold
    write_jsonl(run_dir / "trajectories" / "step_000003.jsonl", trajs)
    page = render(load_run(run_dir, max_trajectories=3))
    assert page.count("⟨100⟩") == 1 and page.count("⟨119⟩") == 1  # once, in the fold
    assert page.count('<details class="sp">') == 1 and page.count("[shared prompt: 20 tokens, shown once above]") == 3
    assert page.count("⟨20⟩") == 3  # each trajectory's own tokens are all still there
