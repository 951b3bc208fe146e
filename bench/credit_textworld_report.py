"""The summary and table of ``bench/bench_credit.py --env textworld`` (``credit_textworld``): per arm the
end success (mean and 95 % t interval over seeds), the AUC of the rollout success curve, the paired
difference against ``outcome`` with its two-sided paired t-test p-value, wall time per step, the mean |A|
over loss tokens (``|A|``: the size of update a credit mode asks for at a given lr), and gigpo's
anchor-group statistics."""

from __future__ import annotations

import math
import statistics


def t_interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its two-sided 95 % t interval (0 for one value)."""
    from scipy import stats

    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def paired_p(d: list[float]) -> float | None:
    """Two-sided paired t-test p-value of the differences ``d`` (None: fewer than 2, or all equal)."""
    from scipy import stats

    if len(d) < 2 or statistics.pstdev(d) == 0:
        return None
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def summarize(runs: list[dict], arms: list[str]) -> dict:
    out = {}
    for arm in arms:
        mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        ends = [r["end_success"] for r in mine]
        aucs = [statistics.fmean(r["reward"]) for r in mine]
        m, ci = t_interval(ends)
        shared = [c.get("credit/anchor_turns_shared") for r in mine for c in r["credit"]]
        biggest = [c.get("credit/anchor_group_size_max") for r in mine for c in r["credit"]]
        groups = [c.get("credit/anchor_groups") for r in mine for c in r["credit"]]
        sizes = [c.get("credit/adv_abs_mean") for r in mine for c in r["credit"]]  # absent in older runs
        out[arm] = {
            "seeds": [r["seed"] for r in mine],
            "end_success_per_seed": ends,
            "end_success": m,
            "end_success_ci95": ci,
            "auc_per_seed": aucs,
            "auc": statistics.fmean(aucs),
            "step_s": statistics.median(s for r in mine for s in r["step_s"])
            if any(r["step_s"] for r in mine)
            else None,
            "mean_curve": [statistics.fmean(c) for c in zip(*(r["reward"] for r in mine))],
            "anchor_turns_shared_mean": statistics.fmean(shared) if None not in shared and shared else None,
            "anchor_groups_mean": statistics.fmean(groups) if None not in groups and groups else None,
            "anchor_group_size_max": max(biggest) if None not in biggest and biggest else None,
            "adv_abs_mean": statistics.fmean(sizes) if None not in sizes and sizes else None,
        }
    if "outcome" in out:
        base = out["outcome"]
        for arm in arms:
            if arm == "outcome":
                continue
            d = [a - b for a, b in zip(out[arm]["end_success_per_seed"], base["end_success_per_seed"])]
            da = [a - b for a, b in zip(out[arm]["auc_per_seed"], base["auc_per_seed"])]
            out[arm]["vs_outcome"] = {
                "end_diff": statistics.fmean(d),
                "end_diff_ci95": t_interval(d)[1],
                "end_p": paired_p(d),
                "seeds_ahead": sum(x > 0 for x in d),
                "seeds_behind": sum(x < 0 for x in d),
                "auc_diff": statistics.fmean(da),
                "auc_p": paired_p(da),
            }
    return out


def scored(args) -> str:
    """What the eval scores: unseen worlds (``--eval-split eval``) or the ``--worlds`` practised ones."""
    return "held-out" if args.eval_split == "eval" else f"practised-worlds ({args.worlds})"


def report(summary: dict, arms: list[str], start: dict, args) -> None:
    n = len(summary[arms[0]]["seeds"])
    print(
        f"\ntextworld difficulty {args.difficulty}, {args.max_turns} turns, {args.groups}x{args.group_size} "
        f"episodes/step, {args.steps} steps, {n} seeds; start {scored(args)} success "
        f"{start.get('solve_rate', float('nan')):.3f} on {args.eval_tasks} eval tasks"
    )
    head = f"{'arm':<12}{'end success':>16}{'AUC':>8}{'diff vs outcome':>22}{'p':>8}{'ahead':>7}"
    print(f"{head}{'AUC diff':>10}{'p':>8}{'s/step':>8}{'|A|':>7}")
    for arm in arms:
        s = summary[arm]
        v = s.get("vs_outcome")
        diff = f"{v['end_diff']:+.3f} +- {v['end_diff_ci95']:.3f}" if v else "-"
        p = f"{v['end_p']:.3f}" if v and v["end_p"] is not None else "-"
        ahead = f"{v['seeds_ahead']}/{n}" if v else "-"
        auc_diff = f"{v['auc_diff']:+.3f}" if v else "-"
        auc_p = f"{v['auc_p']:.3f}" if v and v["auc_p"] is not None else "-"
        print(
            f"{arm:<12}{s['end_success']:>8.3f} +- {s['end_success_ci95']:.3f}{s['auc']:>8.3f}{diff:>22}{p:>8}"
            f"{ahead:>7}{auc_diff:>10}{auc_p:>8}{(s['step_s'] or 0):>8.1f}"
            + (f"{s['adv_abs_mean']:>7.3f}" if s["adv_abs_mean"] is not None else f"{'-':>7}")
        )
    g = summary.get("gigpo")
    if g and g["anchor_groups_mean"] is not None:
        print(
            f"  gigpo anchors per step: {g['anchor_groups_mean']:.1f} groups, {g['anchor_turns_shared_mean']:.1f} "
            f"turns in groups of size > 1, largest group {g['anchor_group_size_max']}"
        )
