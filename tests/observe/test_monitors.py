"""Reward-hacking monitors on hand-made metric histories: each fires on its pattern and stays quiet on noise."""

import json
import random
from pathlib import Path

import pytest

from agentrl.observe.monitors import (
    MONITORS,
    MonitorConfig,
    check_all,
    diversity_collapse,
    infra_failures,
    kl_spike,
    length_anomaly,
    new_alerts,
)

CFG = MonitorConfig(window=5)


def rows(n, **series):
    return [{"step": i + 1, **{k.replace("__", "/"): v[i] for k, v in series.items()}} for i in range(n)]


def test_kl_spike_fires_only_when_it_lasts_and_reward_rises_with_it():
    kl = [0.01] * 8 + [0.2, 0.25] + [0.01] * 3
    rising = [0.5] * 8 + [0.9, 0.95] + [0.5] * 3
    falling = [0.5] * 8 + [0.1, 0.1] + [0.5] * 3
    alerts = kl_spike(rows(13, train__ppo_kl=kl, rollout__reward_mean=rising), CFG)
    assert [(a.step, a.kind) for a in alerts] == [(10, "kl_spike")]  # its second step, once
    assert "25.0x" in alerts[0].message and "for 2 steps" in alerts[0].message
    assert kl_spike(rows(13, train__ppo_kl=kl, rollout__reward_mean=falling), CFG) == []
    one_step = [0.01] * 8 + [0.2] + [0.01] * 4
    assert kl_spike(rows(13, train__ppo_kl=one_step, rollout__reward_mean=rising), CFG) == []
    assert [
        a.step
        for a in kl_spike(
            rows(13, train__ppo_kl=one_step, rollout__reward_mean=rising), MonitorConfig(window=5, kl_spike_steps=1)
        )
    ] == [9]


def test_kl_spike_prefers_reference_kl_and_ignores_tiny_values():
    h = rows(
        12,
        train__kl=[1e-5] * 8 + [5e-4] + [1e-5] * 3,
        train__ppo_kl=[0.01] * 12,
        rollout__reward_mean=[0.1 * i for i in range(12)],
    )
    assert kl_spike(h, CFG) == []  # 50x but below kl_min; ppo_kl is flat and not consulted


def test_kl_spike_stays_quiet_on_the_healthy_default_runs_tiny_kl_blips():
    """Seen in healthy default runs (0 infra failures, eval 0.49 -> 0.83): per-step KL ~3e-5 with a
    single-step blip to 0.0022 (76x) while the reward rose. Not a policy that moved far."""
    kl = [3e-5] * 10 + [0.002163] + [3e-5] * 3
    reward = [0.70] * 10 + [0.82] + [0.75] * 3
    assert kl_spike(rows(14, train__ppo_kl=kl, rollout__reward_mean=reward), MonitorConfig()) == []
    kl[10] = kl[11] = 0.05  # a real jump that lasts still fires
    reward[11] = 0.8
    assert [a.step for a in kl_spike(rows(14, train__ppo_kl=kl, rollout__reward_mean=reward), MonitorConfig())] == [12]


def test_kl_spike_stays_quiet_on_a_healthy_runs_one_step_jump():
    """A healthy run of README command 1 (kept in healthy_ppo_kl.json) has a one-step jump of ppo_kl to
    0.036, 59x its average, at step 42. Whether the old one-step rule fired there was a coin flip: the
    step's reward had only to be above its window's mean (it was not in this run; a run at the previous
    release raised two such alerts). With the reward raised at that step the old rule fires; the rule that
    asks for two steps in a row does not, and still fires when the jump lasts."""
    h = json.loads((Path(__file__).parent / "healthy_ppo_kl.json").read_text())
    history = rows(120, train__ppo_kl=h["ppo_kl"], rollout__reward_mean=h["reward_mean"])
    assert kl_spike(history, MonitorConfig()) == []
    lucky = [dict(r) for r in history]
    lucky[41]["rollout/reward_mean"] = 0.9
    assert [a.step for a in kl_spike(lucky, MonitorConfig(kl_spike_steps=1))] == [42]
    assert kl_spike(lucky, MonitorConfig()) == []
    lucky[42]["train/ppo_kl"], lucky[42]["rollout/reward_mean"] = 0.04, 0.9
    assert [a.step for a in kl_spike(lucky, MonitorConfig())] == [43]


def test_diversity_collapse_on_entropy_and_distinct_frac():
    cfg = MonitorConfig(window=5, collapse_steps=2)  # no reward logged: diversity alone decides
    ent = [1.0, 1.1, 0.9, 1.0, 1.05] + [0.8, 0.5, 0.2, 0.1]
    alerts = diversity_collapse(rows(9, train__entropy=ent), cfg)
    assert [a.step for a in alerts] == [9]  # 0.2 and 0.1 < 0.25 x 1.0: two steps in a row, one alert
    d = diversity_collapse(rows(9, rollout__distinct_frac=[0.9] * 5 + [0.9, 0.1, 0.9, 0.9]), cfg)
    assert d == []  # one low step is noise, not a collapse


def _noisy(rng, start, end, n, sd):
    return [start + (end - start) * i / (n - 1) + rng.gauss(0, sd) for i in range(n)]


def _sharpening(n=120, seed=0):
    """A healthy default run as BENCHMARKS P7 describes it: reward (= solve rate) climbs 0.55 -> 0.8 while
    the trained tokens' entropy and the distinct completions per group of 8 fall far below a quarter
    of their early level (groups that all solve with the same program)."""
    rng = random.Random(seed)
    reward = [min(0.8, 0.55 + 0.01 * i) + rng.gauss(0, 0.03) for i in range(n)]
    ent = [max(0.05, 1.0 * 0.97**i) + abs(rng.gauss(0, 0.02)) for i in range(n)]
    distinct = [max(1 / 8, 0.9 * 0.96**i) + abs(rng.gauss(0, 0.04)) for i in range(n)]
    return reward, ent, distinct


def test_healthy_sharpening_raises_no_collapse_alert():
    for seed in range(5):
        reward, ent, distinct = _sharpening(seed=seed)
        h = rows(120, rollout__reward_mean=reward, train__entropy=ent, rollout__distinct_frac=distinct)
        assert ent[-1] < 0.25 * ent[0] and distinct[-1] < 0.25 * distinct[0]  # the old rule fired every step
        assert diversity_collapse(h, MonitorConfig()) == [], seed


def test_collapse_with_flat_or_falling_reward_alerts_once():
    rng = random.Random(1)
    flat = [0.5 + rng.gauss(0, 0.03) for _ in range(60)]
    ent = [1.0 + rng.gauss(0, 0.05) for _ in range(30)] + [0.1] * 30  # collapses at step 31
    alerts = diversity_collapse(rows(60, rollout__reward_mean=flat, train__entropy=ent), MonitorConfig())
    assert [a.step for a in alerts] == [35]  # 5 steps (collapse_steps) after it began; once, not every step
    assert "train/entropy=0.1 < 0.25 x its early" in alerts[0].message and "has not gained 0.05" in alerts[0].message
    # the scale-400 collapse of BENCHMARKS P7: all 8 samples of a group alike, reward falling to 0
    falling = [0.5] * 20 + [max(0.0, 0.5 - 0.05 * i) for i in range(40)]
    distinct = [0.9] * 20 + [1 / 8] * 40
    alerts = diversity_collapse(
        rows(60, rollout__reward_mean=falling, rollout__distinct_frac=distinct), MonitorConfig()
    )
    assert [a.step for a in alerts] == [25]  # 21..25: the reward's 10-step mean already below 0.5 + 0.05


def test_collapse_after_a_gain_fires_when_the_gain_is_lost():
    reward = [0.5] * 10 + [0.8] * 30 + [0.45] * 30
    distinct = [0.9] * 10 + [0.1] * 60  # sharp from step 11 on; the reward pays for it until step 40
    alerts = diversity_collapse(rows(70, rollout__reward_mean=reward, rollout__distinct_frac=distinct), MonitorConfig())
    # the 10-step mean is >= 0.55 until it holds 8 or more 0.45s: steps 48.. are collapsed, alert at 52
    assert [a.step for a in alerts] == [52]


def test_entropy_floor_fires_whatever_the_reward_and_alerts_rearm():
    cfg = MonitorConfig(window=5, collapse_steps=3)
    reward = [0.1 * i for i in range(40)]  # rising all along
    ent = [1.0] * 10 + [0.001] * 5 + [1.0] * 2 + [0.001] * 5 + [1.0] * 3 + [0.001] * 15
    alerts = diversity_collapse(rows(40, rollout__reward_mean=reward, train__entropy=ent), cfg)
    # on at 11-15 (alert 13); off 2 steps (< 3: same collapse); on 18-22; off 3 steps (re-arms); on 26.. (alert 28)
    assert [a.step for a in alerts] == [13, 28]
    assert "below collapse_entropy_floor=0.01" in alerts[0].message


def test_infra_failures_above_one_percent_of_a_step():
    h = [
        {"step": 1, "rollout/infra_failure_rate": 0.01, "rollout/infra_failures": 1.0, "rollout/episodes": 100.0},
        {
            "step": 2,
            "rollout/infra_failure_rate": 3 / 256,
            "rollout/infra_failures": 3.0,
            "rollout/episodes": 256.0,
            "rollout/outcome/ok": 250.0,
            "rollout/outcome/tool_timeout": 2.0,
            "rollout/outcome/sandbox_error": 1.0,
            "rollout/outcome/truncated_length": 3.0,
        },
        {
            "step": 3,
            "rollout/infra_failure_rate": 0.0,
            "eval/infra_failure_rate": 110 / 500,
            "eval/infra_failures": 110.0,
            "eval/episodes": 500.0,
        },
    ]
    alerts = infra_failures(h, MonitorConfig())
    assert [(a.step, a.kind) for a in alerts] == [(2, "infra_failures"), (3, "infra_failures")]
    assert alerts[0].message == (
        "rollout: 3 of 256 episodes (1.2%) ended with an infrastructure failure, above "
        "infra_failure_max=0.01: sandbox_error=1, tool_timeout=2"
    )
    assert alerts[1].message.startswith("eval: 110 of 500 episodes (22.0%)")
    assert [a.step for a in new_alerts(h[:2], CFG)] == [2] and "infra_failures" in MONITORS


def test_length_anomaly_fires_on_a_sustained_shift_not_on_noise_or_a_one_step_jump():
    rng = random.Random(0)
    noisy = [100 + rng.gauss(0, 5) for _ in range(30)]
    assert length_anomaly(rows(30, rollout__tokens_per_episode=noisy), CFG) == []
    jump = noisy[:20] + [400] + noisy[21:]  # one step at 4x, then back: a few dozen episodes at the cap
    assert length_anomaly(rows(30, rollout__tokens_per_episode=jump), CFG) == []
    assert [
        a.step
        for a in length_anomaly(rows(30, rollout__tokens_per_episode=jump), MonitorConfig(window=5, length_steps=1))
    ] == [21]
    shift = noisy[:20] + [160 + rng.gauss(0, 5) for _ in range(10)]  # +60% for good: once, at its 3rd step
    alerts = length_anomaly(rows(30, rollout__tokens_per_episode=shift), CFG)
    assert [a.step for a in alerts] == [23] and "out of band for 3 steps" in alerts[0].message
    blips = noisy[:20] + [240, 245] + noisy[22:]  # two steps out, then back: no alert
    assert length_anomaly(rows(30, rollout__tokens_per_episode=blips), CFG) == []


#: rollout/tokens_per_episode of four healthy default runs (README command 1 as a new user; see the file)
HEALTHY = json.loads((Path(__file__).parent / "healthy_tokens_per_episode.json").read_text())


@pytest.mark.parametrize("run", ["one_step_blips", "three_step_excursion", "spiky", "near_jump"])
def test_length_anomaly_stays_quiet_on_healthy_default_runs(run):
    tokens = HEALTHY[run]["tokens"]
    assert len(tokens) == 120
    assert length_anomaly(rows(120, rollout__tokens_per_episode=tokens), MonitorConfig()) == []


def test_the_healthy_traces_fired_under_the_old_rules():
    """The traces are the false alarms they are kept for: one step out of band, or 20% off the mean."""
    h = {
        k: rows(120, rollout__tokens_per_episode=HEALTHY[k]["tokens"])
        for k in ("one_step_blips", "three_step_excursion")
    }
    blips = length_anomaly(h["one_step_blips"], MonitorConfig(length_steps=1, length_rel=0.2))
    assert [a.step for a in blips] == [24, 102, 115]
    old = length_anomaly(h["three_step_excursion"], MonitorConfig(length_rel=0.2))
    assert [a.step for a in old] == [93] and "out of band for 3 steps" in old[0].message


def test_a_sustained_length_shift_on_a_healthy_runs_noise_still_alerts():
    """The same healthy trace with the policy's length running away from step 60 (x1.6, then growing), and
    with it collapsing to 40%: each alerts once, at its third step."""
    tokens = HEALTHY["three_step_excursion"]["tokens"]
    runaway = tokens[:59] + [v * (1.6 + 0.02 * i) for i, v in enumerate(tokens[59:])]
    alerts = length_anomaly(rows(120, rollout__tokens_per_episode=runaway), MonitorConfig())
    assert [a.step for a in alerts] == [62] and "out of band for 3 steps" in alerts[0].message
    short = tokens[:59] + [v * 0.4 for v in tokens[59:]]
    assert [a.step for a in length_anomaly(rows(120, rollout__tokens_per_episode=short), MonitorConfig())] == [62]


def test_missing_keys_and_short_histories_are_quiet():
    assert check_all([], CFG) == [] and check_all(rows(3, train__entropy=[1, 0, 0]), CFG) == []
    assert check_all([{"step": 1}, {"step": 2, "train/entropy": "nan?"}], CFG) == []


def test_new_alerts_reports_only_the_last_step():
    ent = [1.0] * 5 + [0.1, 0.1, 0.1]
    h = rows(8, train__entropy=ent)
    cfg = MonitorConfig(window=5, collapse_steps=2)
    assert [a.step for a in new_alerts(h[:7], cfg)] == [7]
    assert new_alerts(h, cfg) == []  # the collapse goes on: alerted once, at its start
    assert new_alerts(h[:5], cfg) == []
    assert new_alerts(h[:7], MonitorConfig(window=5, collapse_steps=2, enabled=False)) == []
