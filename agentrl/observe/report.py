"""``agentrl report RUN_DIR``: one static, self-contained HTML page about a training run.

Owns reading a run directory (``metrics.jsonl``, ``config.yaml``, ``summary.json``, the saved
trajectories ``trajectories/step_*.jsonl`` and a tokenizer from the newest checkpoint or the run's
model) and writing ``report.html``. The page opens with the headline numbers (solve rates, each with
the infrastructure-failure rate of the same episodes) and the curves (rates on a fixed 0-1 axis,
counts on their own; a step that did not log a metric is a gap: ``agentrl.observe.plots.curve``), then the
monitor alerts (``agentrl.observe.monitors``) folded into one line per kind, the outcome breakdown, the full
summary, and a token-level trajectory viewer: every token coloured by its loss mask
(prompt/observation grey, sampled tokens by the sign and size of their advantage) with its id,
logprob, policy version, advantage and turn shown on hover, and per turn (folded) its reward,
advantage and state key (GiGPO's anchor state) with how many shown turns of the same task start from
that state; a prompt prefix every shown trajectory
shares (the system prompt) is shown once, folded. Works with any subset of those files (a run cut
short still gets a page). Does not compute metrics the run did not log, and loads nothing from the
network.
"""

from __future__ import annotations

import html
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrl.observe.monitors import MONITORS, Alert, MonitorConfig, check_all
from agentrl.observe.plots import curve, svg_chart
from agentrl.trajectory import Trajectory, read_jsonl

RATE = (0.0, 1.0)  # the y axis of a chart of rates
CHARTS: list[tuple[str, list[str], tuple[float, float] | None]] = [  # title, keys, fixed y range
    ("Solve rate, every task counted (0-1)", ["rollout/solve_rate", "eval/solve_rate"], RATE),
    (
        "Infrastructure failures and tool use (rate, 0-1)",
        ["rollout/infra_failure_rate", "eval/infra_failure_rate", "rollout/tool_use_rate"],
        RATE,
    ),
    ("Reward (mean over trainable episodes)", ["rollout/reward_mean"], None),
    ("Infrastructure failures (episodes)", ["rollout/infra_failures", "eval/infra_failures"], None),
    ("KL", ["train/kl", "train/ppo_kl", "train/mismatch/kl_k3"], None),
    ("Entropy of sampled tokens", ["train/entropy"], None),
    ("Staleness (policy versions)", ["staleness/staleness_mean", "staleness/staleness_max"], None),
    ("Tokens per episode", ["rollout/tokens_per_episode"], None),
    ("Throughput (tokens/s)", ["rollout/tokens_per_s", "train/tokens_per_s"], None),
    ("Step time (s)", ["time/step_s", "time/wait_rollout_s", "time/weight_sync_s"], None),
]
MIN_SHARED_TOKENS = 16  # a shorter common prompt prefix is not worth folding

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#111;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse} td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:12px} .chart{border:1px solid #e5e7eb;border-radius:6px}
.alert{background:#fef3c7;border-left:4px solid #d97706;padding:4px 8px;margin:4px 0}
.alert summary{cursor:pointer} .alert div{font-size:12px;margin-left:16px}
.shared{color:#6b7280;background:#e5e7eb;font-style:italic;padding:0 4px}
.sp{border:1px dashed #9ca3af;border-radius:6px;padding:8px;margin:10px 0} .sp summary{cursor:pointer}
.ok{color:#15803d} .traj{border:1px solid #e5e7eb;border-radius:6px;padding:8px;margin:10px 0}
.toks{font:12px/1.7 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
.t{border-radius:2px} .m0{color:#6b7280;background:#f3f4f6} .t:hover{outline:1px solid #111}
.legend span{padding:1px 6px;margin-right:6px}
"""


@dataclass
class RunData:
    run_dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    outcomes: Counter = field(default_factory=Counter)
    trajectories: list[Trajectory] = field(default_factory=list)  # newest saved ones, for the viewer
    problems: list[str] = field(default_factory=list)  # unreadable files, named


def load_run(run_dir: str | Path, *, max_trajectories: int = 24) -> RunData:
    run = RunData(Path(run_dir))
    if not run.run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    mpath = run.run_dir / "metrics.jsonl"
    if mpath.exists():
        for lineno, line in enumerate(mpath.read_text().splitlines(), 1):
            try:
                if line.strip():
                    run.metrics.append(json.loads(line))
            except json.JSONDecodeError:
                run.problems.append(f"{mpath}:{lineno}: not JSON (skipped)")
    for name, loader in (("config.yaml", yaml.safe_load), ("summary.json", json.loads)):
        p = run.run_dir / name
        if p.exists():
            try:
                setattr(run, name.split(".")[0], loader(p.read_text()) or {})
            except Exception as e:  # a half-written file must not stop the report
                run.problems.append(f"{p}: {type(e).__name__}: {e}")
    files = sorted((run.run_dir / "trajectories").glob("step_*.jsonl"))
    newest: list[Trajectory] = []
    for p in files:
        try:
            trajs = list(read_jsonl(p))
        except (ValueError, OSError) as e:
            run.problems.append(str(e))
            continue
        run.outcomes.update(str(getattr(t.outcome, "value", t.outcome)) for t in trajs)
        newest = (newest + trajs)[-max_trajectories:]
    run.trajectories = newest
    if not run.outcomes:  # no trajectories saved: the run's own outcome counts, when it wrote them
        run.outcomes.update((run.summary.get("rollout") or {}).get("outcomes") or {})
    return run


def _derived(rows: list[dict]) -> list[dict]:
    """Adds rates the run logs as raw counts (tokens per second of rollout time)."""
    out = []
    for r in rows:
        r = dict(r)
        if "rollout/tokens_per_s" not in r and r.get("rollout/sampled_tokens") and r.get("time/step_s"):
            r["rollout/tokens_per_s"] = r["rollout/sampled_tokens"] / max(r["time/step_s"], 1e-9)
        out.append(r)
    return out


def _charts(rows: list[dict]) -> str:
    parts = [svg_chart({k: curve(rows, k) for k in keys}, title, y_range=y_range) for title, keys, y_range in CHARTS]
    return '<div class="grid">' + "".join(parts) + "</div>"


def headline(run: RunData) -> dict[str, Any]:
    """The numbers the page opens with: each solve rate beside the infrastructure-failure rate of the
    same episodes (left out when the run did not write them)."""
    s, cfg = run.summary, run.config
    ro = s.get("rollout") or {}
    out = {
        "env": cfg.get("env", {}).get("id"),
        "algo": cfg.get("algo", {}).get("name"),
        "model": cfg.get("model", {}).get("path") or "built-in",
        "steps": s.get("steps"),
        "wall_s": s.get("wall_s"),
        "eval solve rate (start → end)": _pair(s.get("eval_solve_rate_start"), s.get("eval_solve_rate_end")),
        "eval infra-failure rate (start → end)": _pair(
            s.get("eval_infra_failure_rate_start"), s.get("eval_infra_failure_rate_end")
        ),
        "rollout solve rate": ro.get("solve_rate"),
        "rollout infra-failure rate": ro.get("infra_failure_rate"),
        "rollout episodes (infra failures)": f"{ro['episodes']} ({ro['infra_failures']})"
        if "episodes" in ro and "infra_failures" in ro
        else None,
    }
    for k in ("paused", "stopped"):
        if s.get(k):
            out[k] = s[k]
    return {k: v for k, v in out.items() if v is not None}


def _pair(a: Any, b: Any) -> str | None:
    if a is None and b is None:
        return None
    return " → ".join("-" if v is None else f"{v:.3f}" for v in (a, b))


def alerts_html(alerts: list[Alert]) -> str:
    """One folded line per alert kind: count, first/last step and an example; every alert inside."""
    if not alerts:
        return f'<div class="ok">no monitor alerts ({", ".join(MONITORS)})</div>'
    by_kind: dict[str, list[Alert]] = {}
    for a in alerts:
        by_kind.setdefault(a.kind, []).append(a)
    parts = []
    for kind, items in by_kind.items():
        steps = [a.step for a in items]
        head = (
            f"<b>{html.escape(kind)}</b> · {len(items)} alert{'s' * (len(items) != 1)} · steps {min(steps)}"
            f"{f'–{max(steps)}' if max(steps) != min(steps) else ''} · e.g. step {items[0].step}: "
            f"{html.escape(items[0].message)}"
        )
        rows = "".join(f"<div>step {a.step}: {html.escape(a.message)}</div>" for a in items)
        parts.append(f'<details class="alert"><summary>{head}</summary>{rows}</details>')
    return "".join(parts)


def _table(d: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_short(v))}</td></tr>" for k, v in d.items())
    return f"<table>{rows}</table>"


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) < 160 else s[:157] + "..."


def _tokenizer(run: RunData):
    """A tokenizer to show token text: the newest checkpoint's, else the run's model dir; None if neither loads."""
    cands = sorted((run.run_dir / "checkpoints").glob("step_*/COMPLETE"), reverse=True)
    paths = [c.parent for c in cands] + [Path(p) for p in [run.config.get("model", {}).get("path")] if p]
    for p in paths:
        if (p / "tokenizer_config.json").exists() or (p / "tokenizer.json").exists():
            try:
                from transformers import AutoTokenizer

                return AutoTokenizer.from_pretrained(str(p))
            except Exception:  # noqa: BLE001 - fall back to ids
                continue
    return None


def _color(adv: float, scale: float) -> str:
    a = min(abs(adv) / scale, 1.0) if scale > 0 else 0.0
    rgb = (22, 163, 74) if adv >= 0 else (220, 38, 38)
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{0.12 + 0.5 * a:.2f})"


def shared_prefix(trajs: list[Trajectory]) -> int:
    """Tokens of prompt that every one of ``trajs`` opens with (0 for fewer than two, or a prefix
    shorter than MIN_SHARED_TOKENS): the system prompt the viewer shows once."""
    if len(trajs) < 2:
        return 0
    n = min(t.prompt_len for t in trajs)
    first = trajs[0].token_ids
    for t in trajs[1:]:
        n = next((i for i in range(n) if t.token_ids[i] != first[i]), n)
    return n if n >= MIN_SHARED_TOKENS else 0


def _spans(t: Trajectory, tokenizer, start: int, end: int) -> str:
    """Tokens ``start:end`` of ``t``, each a span with its data on hover."""
    adv = t.info.get("advantages") or [0.0] * len(t.token_ids)
    scale = max((abs(a) for a in adv), default=0.0)
    spans = []
    for i in range(start, end):
        tok = t.token_ids[i]
        text = tokenizer.decode([tok]) if tokenizer is not None else f"⟨{tok}⟩"
        m = t.loss_mask[i] if i < len(t.loss_mask) else 0
        a = adv[i] if i < len(adv) else 0.0
        tip = (
            (
                f"#{i} id {tok} | mask {m} | logprob {t.logprobs[i]:.3f} | version {t.versions[i]} | "
                f"advantage {a:+.3f} | turn {t.turn_ids[i]}"
            )
            if i < len(t.logprobs)
            else f"#{i} id {tok}"
        )
        style = f' style="background:{_color(a, scale)}"' if m else ""
        spans.append(f'<span class="t m{m}"{style} title="{html.escape(tip)}">{html.escape(text)}</span>')
    return "".join(spans)


def turn_advantages(t: Trajectory) -> list[float | None]:
    """Each turn's advantage: the mean over its sampled tokens (turn-level credit gives them all the
    same value); None for a turn with no sampled token or a trajectory saved without advantages."""
    adv = t.info.get("advantages")
    sums: dict[int, list[float]] = {}
    if adv:
        for a, k, m in zip(adv, t.turn_ids, t.loss_mask):
            if m and k >= 0:
                sums.setdefault(k, []).append(float(a))
    return [sum(v) / len(v) if (v := sums.get(k)) else None for k in range(len(t.turns))]


def anchor_sizes(trajs: list[Trajectory]) -> Counter:
    """(group, state key) -> how many turns of the shown trajectories start from that state."""
    return Counter((t.group_id, r.state_key) for t in trajs for r in t.turns if r.state_key is not None)


def turns_html(t: Trajectory, anchors: Counter | None = None) -> str:
    """A folded per-turn table: reward, advantage, the state the turn started from (its anchor state
    for GiGPO) and how many shown turns of the same task start there too."""
    if not t.turns:
        return ""
    anchors = anchors if anchors is not None else anchor_sizes([t])
    rows = []
    for r, a in zip(t.turns, turn_advantages(t)):
        key = r.state_key or "-"
        shared = anchors.get((t.group_id, r.state_key), 0) if r.state_key is not None else 0
        rows.append(
            f"<tr><td>{r.index}</td><td>{r.reward:+.3f}</td><td>{'-' if a is None else f'{a:+.3f}'}</td>"
            f"<td><code>{html.escape(key)}</code></td><td>{shared if shared > 1 else ''}</td>"
            f"<td>{r.tool_calls}</td></tr>"
        )
    return (
        "<details><summary>per-turn rewards, advantages and states</summary><table><tr><th>turn</th>"
        "<th>reward</th><th>advantage</th><th>state key</th><th>turns shown from this state</th>"
        f"<th>calls</th></tr>{''.join(rows)}</table></details>"
    )


def trajectory_html(t: Trajectory, tokenizer=None, shared: int = 0, anchors: Counter | None = None) -> str:
    """One trajectory: a header, a per-turn table (:func:`turns_html`) and every token as a span
    with its data on hover; its first ``shared`` tokens (the prompt prefix shown once above,
    :func:`shared_html`) as one marker."""
    outcome = getattr(t.outcome, "value", t.outcome)
    head = (
        f"<b>{html.escape(t.episode_id)}</b> · reward {t.reward:.3f} · outcome {html.escape(str(outcome))} · "
        f"{len(t.turns)} turns · {t.num_sampled} sampled / {len(t.token_ids)} tokens"
    )
    marker = f'<span class="shared">[shared prompt: {shared} tokens, shown once above]</span>' if shared else ""
    return (
        f'<div class="traj"><div>{head}</div>{turns_html(t, anchors)}<div class="toks">{marker}'
        f"{_spans(t, tokenizer, shared, len(t.token_ids))}</div></div>"
    )


def shared_html(t: Trajectory, tokenizer, shared: int) -> str:
    """The shared prompt prefix, once, folded."""
    return (
        f'<details class="sp"><summary>Shared prompt: the first {shared} tokens of every trajectory below '
        f'(system prompt, tools)</summary><div class="toks">{_spans(t, tokenizer, 0, shared)}</div></details>'
    )


def render(run: RunData, monitor: MonitorConfig | None = None) -> str:
    rows = _derived(run.metrics)
    if monitor is None:  # the run's own thresholds when its config has them
        known = set(MonitorConfig.__dataclass_fields__)
        monitor = MonitorConfig(**{k: v for k, v in (run.config.get("monitor") or {}).items() if k in known})
    alerts: list[Alert] = check_all(rows, monitor)
    tok = _tokenizer(run) if run.trajectories else None
    title = f"agentrl run report: {run.run_dir.name}"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<div>{html.escape(str(run.run_dir))} · {len(rows)} metric rows · generated "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}</div>",
    ]
    parts += [_table(headline(run)), "<h2>Curves</h2>", _charts(rows)]
    parts += [f"<h2>Monitors ({len(alerts)} alerts)</h2>", alerts_html(alerts)]
    parts.append("<h2>Outcomes</h2>")
    total = sum(run.outcomes.values())
    parts.append(
        _table({k: f"{v} ({v / total:.1%})" for k, v in run.outcomes.most_common()})
        if total
        else "<div>no outcome counts in this run</div>"
    )
    if run.summary:
        parts += ["<details><summary><b>Full summary</b> (summary.json)</summary>", _table(run.summary), "</details>"]
    if run.trajectories:
        shared = shared_prefix(run.trajectories)
        parts += [
            "<h2>Trajectories (newest saved)</h2>",
            '<div class="legend"><span class="m0">prompt / observation (mask 0)</span>'
            f'<span style="background:{_color(1, 1)}">sampled, advantage &gt; 0</span>'
            f'<span style="background:{_color(-1, 1)}">sampled, advantage &lt; 0</span> '
            "hover a token for id, logprob, policy version, advantage and turn</div>",
        ]
        if shared:
            parts.append(shared_html(run.trajectories[0], tok, shared))
        anchors = anchor_sizes(run.trajectories)
        parts += [trajectory_html(t, tok, shared, anchors) for t in run.trajectories]
    if run.problems:
        parts += ["<h2>Problems reading the run</h2>"] + [f"<div>{html.escape(p)}</div>" for p in run.problems]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    max_trajectories: int = 24,
    monitor: MonitorConfig | None = None,
) -> Path:
    """Write the report of ``run_dir`` (checked against ``monitor``; None: the run's own thresholds)."""
    run = load_run(run_dir, max_trajectories=max_trajectories)
    path = Path(out) if out else run.run_dir / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render(run, monitor), encoding="utf-8")
    tmp.replace(path)
    return path
