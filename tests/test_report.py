"""`agentrl report`: the HTML page from a run directory, and a real headless-Chromium screenshot of it."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.cli_report import find_chromium, screenshot
from agentrl.report import load_run, render, trajectory_html, write_report
from agentrl.trajectory import Outcome, Trajectory, TurnRecord, write_jsonl


def _traj(i, outcome=Outcome.OK):
    # prompt 3 tokens, a 2-token sampled turn, a 2-token observation, a 1-token sampled turn
    t = Trajectory(episode_id=f"g{i}-0", group_id=f"g{i}", env_id="code_exec", prompt_len=3,
                   token_ids=[5, 6, 7, 20, 21, 8, 9, 22], loss_mask=[0, 0, 0, 1, 1, 0, 0, 1],
                   logprobs=[0, 0, 0, -0.25, -1.5, 0, 0, -0.125], turn_ids=[-1, -1, -1, 0, 0, 0, 0, 1],
                   versions=[-1, -1, -1, 3, 3, -1, -1, 4], reward=1.0, outcome=outcome,
                   turns=[TurnRecord(0, 3, 2, 2, "stop"), TurnRecord(1, 7, 1, 0, "stop")])
    t.info["advantages"] = [0, 0, 0, 0.75, 0.75, 0, 0, -0.5]
    t.validate()
    return t


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    (d / "trajectories").mkdir(parents=True)
    rows = [{"step": 0, "eval/solve_rate": 0.5}]
    for s in range(1, 31):
        rows.append({"step": s, "rollout/reward_mean": 0.5 + s / 100, "rollout/solve_rate": 0.5 + s / 100,
                     "train/ppo_kl": 0.01 if s != 25 else 0.5, "train/entropy": 1.0,
                     "rollout/tokens_per_episode": 100.0 + (s % 3), "rollout/sampled_tokens": 1000.0, "time/step_s": 2.0})
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
    assert page.count("<svg") == 8 and "Reward and solve rate" in page
    assert "kl_spike" in page and "step 25" in page  # KL 50x its average while reward rose
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
        pytest.skip("no headless Chromium installed (apt-get install chromium-headless-shell)")
    png = screenshot(write_report(run_dir), tmp_path / "report.png", height=1600)
    from PIL import Image

    img = Image.open(png).convert("RGB")
    assert img.size == (1280, 1600)
    colours = img.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # text, chart lines and token colours were drawn, not a blank page
    # the chart palette's blue is on the page
    assert any(abs(r - 37) < 30 and abs(g - 99) < 30 and b > 200 for _, (r, g, b) in colours)
