"""Reward-hacking monitors on hand-made metric histories: each fires on its pattern and stays quiet on noise."""
import random

from agentrl.monitors import MonitorConfig, check_all, diversity_collapse, kl_spike, length_anomaly, new_alerts

CFG = MonitorConfig(window=5)


def rows(n, **series):
    return [{"step": i + 1, **{k.replace("__", "/"): v[i] for k, v in series.items()}} for i in range(n)]


def test_kl_spike_fires_only_when_reward_rises_with_it():
    kl = [0.01] * 8 + [0.2] + [0.01] * 3
    rising = [0.5] * 8 + [0.9] + [0.5] * 3
    falling = [0.5] * 8 + [0.1] + [0.5] * 3
    alerts = kl_spike(rows(12, train__ppo_kl=kl, rollout__reward_mean=rising), CFG)
    assert [(a.step, a.kind) for a in alerts] == [(9, "kl_spike")]
    assert "20.0x" in alerts[0].message
    assert kl_spike(rows(12, train__ppo_kl=kl, rollout__reward_mean=falling), CFG) == []


def test_kl_spike_prefers_reference_kl_and_ignores_tiny_values():
    h = rows(12, train__kl=[1e-5] * 8 + [5e-4] + [1e-5] * 3, train__ppo_kl=[0.01] * 12,
             rollout__reward_mean=[0.1 * i for i in range(12)])
    assert kl_spike(h, CFG) == []  # 50x but below kl_min; ppo_kl is flat and not consulted


def test_diversity_collapse_on_entropy_and_distinct_frac():
    ent = [1.0, 1.1, 0.9, 1.0, 1.05] + [0.8, 0.5, 0.2, 0.1]
    alerts = diversity_collapse(rows(9, train__entropy=ent), CFG)
    assert [a.step for a in alerts] == [8, 9]
    d = diversity_collapse(rows(9, rollout__distinct_frac=[0.9] * 5 + [0.9, 0.1, 0.9, 0.9]), CFG)
    assert [(a.step, a.kind) for a in d] == [(7, "diversity_collapse")]


def test_length_anomaly_fires_on_a_jump_not_on_noise():
    rng = random.Random(0)
    noisy = [100 + rng.gauss(0, 5) for _ in range(30)]
    assert length_anomaly(rows(30, rollout__tokens_per_episode=noisy), CFG) == []
    jump = noisy[:20] + [400] + noisy[21:]
    assert [a.step for a in length_anomaly(rows(30, rollout__tokens_per_episode=jump), CFG)] == [21]


def test_missing_keys_and_short_histories_are_quiet():
    assert check_all([], CFG) == [] and check_all(rows(3, train__entropy=[1, 0, 0]), CFG) == []
    assert check_all([{"step": 1}, {"step": 2, "train/entropy": "nan?"}], CFG) == []


def test_new_alerts_reports_only_the_last_step():
    ent = [1.0] * 5 + [0.1, 0.1]
    h = rows(7, train__entropy=ent)
    assert [a.step for a in new_alerts(h, CFG)] == [7]
    assert new_alerts(h[:5], CFG) == []
    assert new_alerts(h, MonitorConfig(window=5, enabled=False)) == []
